"""Bulk seeding of the jobs table with COPY, for benchmarks and capacity tests.

Registering a million jobs through the API takes longer than the burst it is meant to set up, so
the benchmarks write rows straight into storage, exactly as ``PostgresStore.create_job`` would
have written them (same columns, same id scheme, same initial plan), but in one COPY per chunk.
Never used on the request path: it skips idempotency keys, the jobs' change records (a seeded
job's history of changes starts empty) and the NOTIFY hint (engines find the rows at their next
poll).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any

import asyncpg

from duetime.core import codec
from duetime.core.ids import new_job_id, shard_of
from duetime.core.lifecycle import initial_plan
from duetime.core.model import JobSpec
from duetime.storage.queries import Q

_COLUMNS = (
    "job_id",
    "shard",
    "owner",
    "spec",
    "state",
    "next_run_at",
    "scheduled_for",
    "attempt",
    "created_at",
    "updated_at",
)
_LABEL_COLUMNS = ("owner", "key", "value", "job_id")
# The triggers of migration 0006 that keep job_labels: the only ones a load with triggers off may
# skip, because it writes their rows itself.
_LABEL_TRIGGERS = ("jobs_labels_added", "jobs_labels_changed", "jobs_labels_removed")


@dataclass(frozen=True, slots=True)
class BulkJob:
    """One job to seed; ``job_id`` is drawn by the seeder when None."""

    owner: str
    spec: JobSpec
    job_id: uuid.UUID | None = None


def job_rows(jobs: Iterable[BulkJob], now: datetime) -> Iterator[tuple[Any, ...]]:
    """The COPY records of ``jobs``: the row ``create_job`` would insert for each.

    A spec shared by many jobs (a burst) is serialised once: the JSON text is cached by the
    spec object's identity.
    """
    cache: dict[int, tuple[JobSpec, str]] = {}
    for job in jobs:
        job_id = job.job_id or new_job_id()
        hit = cache.get(id(job.spec))
        if hit is None or hit[0] is not job.spec:
            hit = (job.spec, json.dumps(codec.spec_to_json(job.spec), separators=(",", ":")))
            cache[id(job.spec)] = hit
        plan = initial_plan(job_id, job.spec, now)
        yield (
            job_id,
            shard_of(job_id),
            job.owner,
            hit[1],
            plan.state.value,
            plan.next_run_at,
            plan.scheduled_for,
            plan.attempt,
            now,
            now,
        )


async def copy_jobs(conn: asyncpg.Connection, rows: Sequence[tuple[Any, ...]]) -> int:
    """COPY prepared rows (from ``job_rows``) into ``jobs`` on one connection; returns the count.

    The connection must use asyncpg's default jsonb codec (text), not the store's dict codec:
    the spec column is already JSON text.
    """
    await conn.copy_records_to_table("jobs", records=rows, columns=_COLUMNS)
    return len(rows)


async def copy_jobs_with_labels(
    conn: asyncpg.Connection,
    rows: Sequence[tuple[Any, ...]],
    labels: Sequence[tuple[str, str, str, uuid.UUID]],
) -> int:
    """COPY prepared rows into ``jobs`` and their ``job_labels`` rows into that table, in one
    transaction with the label trigger off for it; returns the count of jobs.

    ``labels`` is (owner, key, value, job_id) of every label of every job in ``rows`` that has
    labels (occurrence rows have none): exactly what the trigger would insert, which the caller
    knows without decoding each spec again (check it with ``label_rows_differ``). The trigger
    does the same inserts from the specs in the database; ten million jobs with four labels made
    that, with the COPY, an hour of a two-core machine. The label rows go in primary-key order,
    each (owner, key, value) range appended in turn. Superuser only (session_replication_role);
    any trigger on ``jobs`` other than the label ones is refused rather than skipped.
    """
    async with conn.transaction():
        names = tuple(r["tgname"] for r in await conn.fetch(Q["bulk_job_triggers"]))
        if names != _LABEL_TRIGGERS:
            raise RuntimeError(
                f"jobs has the triggers {names}, not only the label triggers {_LABEL_TRIGGERS}: "
                "a load with triggers off would skip what the others do; teach "
                "storage.bulk.copy_jobs_with_labels their rows, or load with copy_jobs"
            )
        await conn.execute(Q["bulk_triggers_off"])
        await conn.copy_records_to_table("jobs", records=rows, columns=_COLUMNS)
        # Stable sort: within one (owner, key, value) the jobs keep their (time-ordered id) order.
        ordered = sorted(labels, key=itemgetter(0, 1, 2))
        await conn.copy_records_to_table("job_labels", records=ordered, columns=_LABEL_COLUMNS)
    return len(rows)


async def label_rows_differ(conn: asyncpg.Connection, job_ids: Sequence[uuid.UUID]) -> int:
    """How many ``job_labels`` rows of ``job_ids`` differ from those the label trigger makes from
    the same jobs (missing or extra); 0 after a correct ``copy_jobs_with_labels``."""
    differ: int = await conn.fetchval(Q["bulk_label_rows_differ"], list(job_ids))
    return differ


async def seed_jobs(
    dsns_by_shard: Sequence[str],
    jobs: Iterable[BulkJob],
    now: datetime,
    *,
    chunk: int = 50_000,
    progress: Callable[[int], None] | None = None,
    return_ids: bool = True,
) -> list[uuid.UUID]:
    """Write ``jobs`` into the database of each one's shard, ``chunk`` rows per COPY.

    ``dsns_by_shard`` is the DSN of each of the 16 logical shards (``Settings.shard_dsns()``).
    Returns the job ids in the order given (none with ``return_ids=False``: ten million ids are
    half a gigabyte). ``progress`` is told the running total after each chunk, so a
    ten-million-row fill can say how far it is.
    """
    conns: dict[str, asyncpg.Connection] = {}
    pending: dict[str, list[tuple[Any, ...]]] = {}
    ids: list[uuid.UUID] = []
    written = 0
    try:
        for dsn in dict.fromkeys(dsns_by_shard):
            conns[dsn] = await asyncpg.connect(dsn)
            pending[dsn] = []
        for row in job_rows(jobs, now):
            if return_ids:
                ids.append(row[0])
            dsn = dsns_by_shard[row[1]]
            bucket = pending[dsn]
            bucket.append(row)
            if len(bucket) >= chunk:
                written += await copy_jobs(conns[dsn], bucket)
                pending[dsn] = []
                if progress is not None:
                    progress(written)
        for dsn, bucket in pending.items():
            if bucket:
                written += await copy_jobs(conns[dsn], bucket)
        if progress is not None:
            progress(written)
    finally:
        for conn in conns.values():
            await conn.close()
    return ids


async def analyze_jobs(dsns: Iterable[str]) -> None:
    """Refresh the planner's statistics after a bulk load, as autovacuum would a minute later."""
    for dsn in dict.fromkeys(dsns):
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("ANALYZE jobs")
        finally:
            await conn.close()


async def vacuum_analyze_registry(dsns: Iterable[str]) -> None:
    """VACUUM (ANALYZE) ``jobs`` and ``job_labels`` after a load of millions of rows: statistics
    for the planner, and the visibility map that lets a label count be an index-only range, as a
    registry that autovacuum has long since visited has them. Done before measuring, so that
    autovacuum's first pass over the new rows does not run during the measurement."""
    for dsn in dict.fromkeys(dsns):
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(Q["bulk_vacuum_jobs"])
            await conn.execute(Q["bulk_vacuum_job_labels"])
        finally:
            await conn.close()


# The history columns a bulk loader fills, in the order of its records (loadtest/ builds them too).
RUN_COLUMNS = (
    "job_id",
    "shard",
    "scheduled_for",
    "attempt",
    "started_at",
    "finished_at",
    "outcome",
    "lateness_ms",
)


@dataclass(frozen=True, slots=True)
class OldHistory:
    """What ``seed_old_history`` wrote: the run ids of its history rows (one range, the oldest of
    the table) and how many finished jobs and history rows, all finished before ``finished_before``."""

    first_run_id: int
    last_run_id: int
    finished_jobs: int
    runs: int
    finished_before: datetime


@dataclass(frozen=True, slots=True)
class HistoryLeft:
    """How much of an ``OldHistory`` is still there: history rows from the oldest left to the end
    of the old range (retention deletes oldest first), and finished jobs."""

    runs: int
    finished_jobs: int


def _history_rows(job_id: uuid.UUID, last: datetime, n: int) -> Iterator[tuple[Any, ...]]:
    """``n`` succeeded attempts of ``job_id``, one a second, the last finishing at ``last``."""
    shard = shard_of(job_id)
    for i in range(n, 0, -1):
        at = last - timedelta(seconds=i)
        yield (job_id, shard, at, 1, at, at + timedelta(milliseconds=40), "succeeded", 3)


async def seed_old_history(
    dsn: str,
    spec: JobSpec,
    *,
    owner: str,
    finished_jobs: int,
    runs_per_job: int,
    cron_runs: int,
    finished_before: datetime,
    chunk: int = 100_000,
) -> OldHistory:
    """Old history for retention to delete, written before anything else (run ids lowest):
    ``finished_jobs`` completed jobs of ``owner`` (``spec``), finished in turn up to
    ``finished_before``, with ``runs_per_job`` history rows each; then ``cron_runs`` history rows of
    16 live jobs (one a shard, paused: they never run during a measurement), an every-second
    cron's, all finished before ``finished_before``. Then VACUUM (ANALYZE) of ``runs`` and ``jobs``,
    as autovacuum would have done long since, and a CHECKPOINT: the load's hundreds of megabytes of
    WAL would otherwise start a checkpoint that writes its pages during the measurement that
    follows. Jobs and history are COPYed, ``chunk`` rows at a time.
    """
    conn = await asyncpg.connect(dsn)
    try:
        if (await conn.fetchrow(Q["bulk_run_id_range"]))["last"]:
            raise RuntimeError("seed_old_history writes the oldest history: runs must be empty")
        jobs = [BulkJob(owner, spec) for _ in range(finished_jobs)]
        finished: list[tuple[Any, ...]] = []
        for i, row in enumerate(job_rows(jobs, finished_before)):
            at = finished_before - timedelta(seconds=finished_jobs - i)
            finished.append((row[0], row[1], owner, row[3], "completed", None, row[6], 1, at, at))
        crons = [
            (job_id, shard, owner, row[3], "paused", None, row[6], 0, row[8], row[9])
            for shard in range(16)
            for job_id in [new_job_id(shard)]
            for row in job_rows([BulkJob(owner, spec, job_id)], finished_before)
        ]
        for start in range(0, len(finished), chunk):
            await copy_jobs(conn, finished[start : start + chunk])
        await copy_jobs(conn, crons)
        batch: list[tuple[Any, ...]] = []
        written = 0

        async def flush() -> None:
            nonlocal written
            if batch:
                await conn.copy_records_to_table("runs", records=batch, columns=RUN_COLUMNS)
                written += len(batch)
                batch.clear()

        for row in finished:
            batch.extend(_history_rows(row[0], row[8], runs_per_job))
            if len(batch) >= chunk:
                await flush()
        per_cron, extra = divmod(cron_runs, len(crons))
        for i, row in enumerate(crons):
            for run in _history_rows(row[0], finished_before, per_cron + (1 if i < extra else 0)):
                batch.append(run)
                if len(batch) >= chunk:
                    await flush()
        await flush()
        ids = await conn.fetchrow(Q["bulk_run_id_range"])
        await conn.execute(Q["bulk_vacuum_runs"])
        await conn.execute(Q["bulk_vacuum_jobs"])
        await conn.execute(Q["bulk_checkpoint"])
    finally:
        await conn.close()
    return OldHistory(ids["first"], ids["last"], finished_jobs, written, finished_before)


async def old_history_left(conn: asyncpg.Connection, old: OldHistory) -> HistoryLeft:
    """What retention has not yet deleted of ``old``; two index probes, cheap enough to poll."""
    first = await conn.fetchval(Q["bulk_first_run_id"])
    runs = (
        0 if first is None or first > old.last_run_id else old.last_run_id - max(first, old.first_run_id) + 1
    )
    jobs: int = await conn.fetchval(Q["bulk_finished_jobs_before"], old.finished_before)
    return HistoryLeft(runs, jobs)


async def table_writes(dsns: Iterable[str]) -> dict[str, int]:
    """Tuples inserted, updated (and of those, HOT-updated) in ``jobs`` and ``runs`` so far, and
    the WAL position, summed over the databases: a benchmark takes the difference of two reads.

    Counters are flushed by each backend when it goes idle, at most once a second: wait a second
    or two after the last write before the second read.
    """
    out = {"ins": 0, "upd": 0, "hot_upd": 0, "wal_bytes": 0}
    wal_by_server: dict[str, int] = {}
    for dsn in dict.fromkeys(dsns):
        conn = await asyncpg.connect(dsn)
        try:
            row = await conn.fetchrow(
                "SELECT coalesce(sum(n_tup_ins), 0)::bigint AS ins,"
                " coalesce(sum(n_tup_upd), 0)::bigint AS upd,"
                " coalesce(sum(n_tup_hot_upd), 0)::bigint AS hot_upd"
                " FROM pg_stat_user_tables WHERE relname IN ('jobs', 'runs')"
            )
            wal = await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
        finally:
            await conn.close()
        out["ins"] += row["ins"]
        out["upd"] += row["upd"]
        out["hot_upd"] += row["hot_upd"]
        # Databases on one server share its WAL: count each server once.
        wal_by_server[dsn.rpartition("/")[0]] = wal
    out["wal_bytes"] = sum(wal_by_server.values())
    return out


async def outcome_counts(dsns: Iterable[str]) -> dict[str, tuple[int, str | None]]:
    """History rows by outcome, with one error text each: a benchmark's failed runs, explained."""
    out: dict[str, tuple[int, str | None]] = {}
    for dsn in dict.fromkeys(dsns):
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch("SELECT outcome, count(*) AS n, min(error) AS error FROM runs GROUP BY 1")
        finally:
            await conn.close()
        for r in rows:
            n, err = out.get(r["outcome"], (0, None))
            out[r["outcome"]] = (n + r["n"], err or r["error"])
    return out
