"""The maintenance service on the real database, with a fake clock: it deletes what is old and
nothing young, in batches, also while history is being written at burst speed beside it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from duetime.core.ids import new_job_id, shard_of
from duetime.core.model import TargetState
from duetime.engine.retention import RetentionConfig, RetentionService
from duetime.storage.ports import FinishedJobsSweep, TargetHealthReport
from duetime.storage.postgres import PostgresStore
from duetime.storage.queries import Q
from duetime.storage.shardmap import ShardMap
from duetime.storage.target_rules import PURGE_S

DAY = 86_400
T = datetime(2027, 3, 1, 12, 0, tzinfo=UTC)  # the fake clock's now
OLD = T - timedelta(days=31)
YOUNG = T - timedelta(days=29)
SPEC = json.dumps(
    {
        "target": {"type": "queue", "broker": "nats", "topic": "t"},
        "schedule": {"run_at": "2027-01-01T00:00:00Z"},
    }
)


@pytest.fixture
async def fresh(run_tag: str) -> AsyncIterator[tuple[str, PostgresStore]]:
    """A database of its own: the head-of-table scan must see only this test's history."""
    from tests.conftest import _create_db, _drop_db

    name = f"duetime_test_{run_tag}_ret_{uuid.uuid4().hex[:6]}"
    dsn = await _create_db(name)
    store = await PostgresStore.open(ShardMap.single(dsn))
    yield dsn, store
    await store.close()
    await _drop_db(name)


async def _job(
    conn: asyncpg.Connection, owner: str, state: str, updated: datetime, *, parent: uuid.UUID | None = None
) -> uuid.UUID:
    job_id = new_job_id()
    await conn.execute(
        "INSERT INTO jobs (job_id, shard, owner, spec, state, created_at, updated_at, parent_id)"
        " VALUES ($1, $2, $3, $4::jsonb, $5, $6, $6, $7)",
        job_id,
        shard_of(job_id),
        owner,
        SPEC,
        state,
        updated,
        parent,
    )
    return job_id


async def _runs(conn: asyncpg.Connection, job_id: uuid.UUID, finished: list[datetime]) -> None:
    await conn.executemany(
        "INSERT INTO runs (job_id, shard, scheduled_for, attempt, started_at, finished_at, outcome)"
        " VALUES ($1, $2, $3, 1, $3, $3, 'succeeded')",
        [(job_id, shard_of(job_id), f) for f in finished],
    )


async def _change(conn: asyncpg.Connection, job_id: uuid.UUID) -> None:
    """A change record of ``job_id``, as an owner's call writes one (storage/sql/changes.sql)."""
    await conn.execute(Q["record_changes"], [job_id], "owner", None, "pause", [None], "{}")


def _service(store: PostgresStore, **overrides: float) -> RetentionService:
    cfg = {"run_retention_s": 30 * DAY, "finished_job_retention_s": 30 * DAY, "batch": 7, "pause_s": 0.0}
    cfg.update(overrides)
    return RetentionService(store, RetentionConfig(**cfg), clock=lambda: T)  # type: ignore[arg-type]


async def test_deletes_what_is_old_and_nothing_young(fresh: tuple[str, PostgresStore]) -> None:
    dsn, store = fresh
    conn = await asyncpg.connect(dsn)
    try:
        live = await _job(conn, "o", "scheduled", OLD)  # not finished: never deleted, however old
        await _runs(conn, live, [OLD - timedelta(minutes=i) for i in range(40)][::-1])
        await _runs(conn, live, [YOUNG + timedelta(minutes=i) for i in range(25)])
        gone = {s: await _job(conn, "o", s, OLD) for s in ("completed", "cancelled", "dead")}
        for job in gone.values():
            await _runs(conn, job, [OLD, YOUNG])  # a finished job's young history goes with it
            await conn.execute(
                "INSERT INTO idempotency_keys (owner, key, body_hash, job_id) VALUES ('o', $1, '\\x00', $2)",
                str(job),
                job,
            )
        occurrence = await _job(conn, "o", "cancelled", OLD, parent=gone["cancelled"])
        kept = {s: await _job(conn, "o", s, YOUNG) for s in ("completed", "cancelled", "dead")}
        paused_old = await _job(conn, "o", "paused", OLD)
        # Change records (0018) live as long as their job: each of these jobs has two.
        for job in [*gone.values(), *kept.values(), live]:
            for _ in range(2):
                await _change(conn, job)

        report = await _service(store).run_round()

        ids = {r["job_id"] for r in await conn.fetch("SELECT job_id FROM jobs")}
        assert ids == {live, paused_old, *kept.values()}
        assert occurrence not in ids
        left = await conn.fetch("SELECT job_id, finished_at FROM runs ORDER BY run_id")
        assert {r["job_id"] for r in left} == {live}
        assert sorted(r["finished_at"] for r in left) == [YOUNG + timedelta(minutes=i) for i in range(25)]
        assert await conn.fetchval("SELECT count(*) FROM idempotency_keys") == 0
        changed = await conn.fetch("SELECT job_id, count(*) AS n FROM job_changes GROUP BY job_id")
        assert {r["job_id"]: r["n"] for r in changed} == {j: 2 for j in [live, *kept.values()]}
        assert report.jobs == 3
        assert report.runs == 40 + 6
        # A second round finds nothing; the API answers 404 for a deleted job.
        again = await _service(store).run_round()
        assert (again.jobs, again.runs) == (0, 0)
        with pytest.raises(Exception, match="no job"):
            await store.get_job("o", gone["completed"])
    finally:
        await conn.close()


async def test_zero_keeps_forever(fresh: tuple[str, PostgresStore]) -> None:
    dsn, store = fresh
    conn = await asyncpg.connect(dsn)
    try:
        job = await _job(conn, "o", "completed", OLD - timedelta(days=3650))
        await _runs(conn, job, [OLD - timedelta(days=3650)])
        service = _service(store, run_retention_s=0, finished_job_retention_s=0)
        assert not RetentionConfig(run_retention_s=0, finished_job_retention_s=0).enabled
        report = await service.run_round()
        assert (report.jobs, report.runs) == (0, 0)
        assert await conn.fetchval("SELECT count(*) FROM runs") == 1
        # Runs only: the finished job stays, its old history goes.
        report = await _service(store, finished_job_retention_s=0).run_round()
        assert (report.jobs, report.runs) == (0, 1)
        assert await conn.fetchval("SELECT count(*) FROM jobs") == 1
    finally:
        await conn.close()


async def test_target_reports_of_workers_gone_for_an_hour_go_whatever_the_settings(
    fresh: tuple[str, PostgresStore],
) -> None:
    """Reports are stamped and aged by the database's clock, not the service's (fake) one."""
    dsn, store = fresh
    reports = [TargetHealthReport("o", f"h{i}:443", TargetState.HEALTHY, 8, None, 1, 0, 0) for i in range(3)]
    for worker in ("gone", "quiet", "live"):
        await store.report_target_health(worker, reports)
    conn = await asyncpg.connect(dsn)
    try:
        age = "UPDATE target_health SET reported_at = now() - make_interval(secs => $2) WHERE worker = $1"
        await conn.execute(age, "gone", PURGE_S + 5)
        await conn.execute(age, "quiet", PURGE_S - 60)  # stale, but its own next report deletes it
        # History and finished jobs kept forever: the reports go all the same.
        report = await _service(store, run_retention_s=0, finished_job_retention_s=0).run_round()
        assert report.target_reports == 3
        left = await conn.fetch("SELECT DISTINCT worker FROM target_health ORDER BY worker")
        assert [r["worker"] for r in left] == ["live", "quiet"]
        assert (await _service(store).run_round()).target_reports == 0
    finally:
        await conn.close()


async def test_a_row_held_by_a_request_is_skipped_not_waited_for(fresh: tuple[str, PostgresStore]) -> None:
    dsn, store = fresh
    conn = await asyncpg.connect(dsn)
    holder = await asyncpg.connect(dsn)
    try:
        held = await _job(conn, "o", "cancelled", OLD)
        free = await _job(conn, "o", "cancelled", OLD)
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM jobs WHERE job_id = $1 FOR UPDATE", held)
        report = await asyncio.wait_for(_service(store).run_round(), timeout=10)
        assert report.jobs == 1
        await tx.rollback()
        ids = {r["job_id"] for r in await conn.fetch("SELECT job_id FROM jobs")}
        assert ids == {held}
        assert free not in ids
    finally:
        await holder.close()
        await conn.close()


async def test_under_a_burst_of_new_history(fresh: tuple[str, PostgresStore]) -> None:
    """History is written (young) while the service deletes (old) beside it: every old row goes,
    every young one stays, and the writers are never held up by more than a batch."""
    dsn, store = fresh
    conn = await asyncpg.connect(dsn)
    try:
        live = [await _job(conn, "o", "scheduled", OLD) for _ in range(20)]
        await conn.copy_records_to_table(
            "runs",
            records=[
                (
                    j,
                    shard_of(j),
                    OLD - timedelta(seconds=i),
                    1,
                    OLD - timedelta(seconds=i),
                    OLD - timedelta(seconds=i),
                    "succeeded",
                )
                for i in range(5000)
                for j in (live[i % 20],)
            ],
            columns=["job_id", "shard", "scheduled_for", "attempt", "started_at", "finished_at", "outcome"],
        )
        finished_old = [await _job(conn, "o", "completed", OLD) for _ in range(50)]
        stop = asyncio.Event()
        written = 0
        slowest = 0.0

        async def burst() -> None:
            nonlocal written, slowest
            writer = await asyncpg.connect(dsn)
            try:
                loop = asyncio.get_running_loop()
                while not stop.is_set():
                    started = loop.time()
                    rows = [
                        (j, shard_of(j), YOUNG, 1, YOUNG, YOUNG, "succeeded") for j in live for _ in range(10)
                    ]
                    await writer.executemany(
                        "INSERT INTO runs (job_id, shard, scheduled_for, attempt, started_at,"
                        " finished_at, outcome) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                        rows,
                    )
                    await writer.execute(
                        "UPDATE jobs SET updated_at = $2 WHERE job_id = ANY($1::uuid[])", live, YOUNG
                    )
                    slowest = max(slowest, loop.time() - started)
                    written += len(rows)
            finally:
                await writer.close()

        writer_task = asyncio.create_task(burst())
        await asyncio.sleep(0.2)
        report = await _service(store, batch=500).run_round()
        stop.set()
        await writer_task
        assert report.jobs == 50
        assert (
            await conn.fetchval("SELECT count(*) FROM runs WHERE finished_at < $1", T - timedelta(days=30))
            == 0
        )
        assert await conn.fetchval("SELECT count(*) FROM runs WHERE finished_at = $1", YOUNG) == written
        assert not {r["job_id"] for r in await conn.fetch("SELECT job_id FROM jobs")} & set(finished_old)
        assert written > 0
        assert slowest < 5.0
    finally:
        await conn.close()


async def test_one_service_per_database_does_a_batch(fresh: tuple[str, PostgresStore]) -> None:
    """Two engines each run the service: while one holds the database's maintenance lock, the
    other skips that database instead of deleting the same rows beside it."""
    dsn, store = fresh
    conn = await asyncpg.connect(dsn)
    try:
        await _job(conn, "o", "completed", OLD)
        tx = conn.transaction()
        await tx.start()
        assert await conn.fetchval("SELECT pg_try_advisory_xact_lock($1::int, $2::int)", 0x52455445, 1)
        report = await _service(store).run_round()
        assert report.skipped_databases == 1 and report.jobs == 0
        await tx.rollback()
        report = await _service(store).run_round()
        assert report.jobs == 1
    finally:
        await conn.close()


async def test_a_batch_keeps_the_lock_until_its_jobs_are_gone(fresh: tuple[str, PostgresStore]) -> None:
    """The lock covered only the choice of a batch's jobs: while one engine deleted their history,
    another took the lock, chose the same jobs, found them gone at the end (0 deleted), took that
    for "nothing left" and ended its round; the first then met the second's lock and skipped the
    database until its next round. With two engines, old jobs went at about one batch a minute.
    Now a batch holds the lock until its jobs are deleted, and the other engine skips at once."""
    dsn, store = fresh
    conn = await asyncpg.connect(dsn)
    holder = await asyncpg.connect(dsn)
    try:
        jobs = [await _job(conn, "o", "completed", OLD) for _ in range(3)]
        for job in jobs:
            await _runs(conn, job, [OLD - timedelta(hours=1)])
        # Hold one of their history rows, so the first batch waits inside its history deletes.
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM runs WHERE job_id = $1 FOR UPDATE", jobs[0])
        first = asyncio.create_task(store.delete_finished_jobs(dsn, before=T - timedelta(days=30), limit=10))
        for _ in range(100):
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query LIKE 'DELETE FROM runs%'"
            )
            if waiting:
                break
            await asyncio.sleep(0.05)
        assert waiting, "the first batch is inside its history deletes"
        second = await asyncio.wait_for(
            store.delete_finished_jobs(dsn, before=T - timedelta(days=30), limit=10), timeout=5
        )
        assert second is None, "the other engine skips while a batch is under way"
        await tx.rollback()
        assert await asyncio.wait_for(first, timeout=10) == FinishedJobsSweep(jobs=3, history=3)
        assert await conn.fetchval("SELECT count(*) FROM jobs") == 0
        # The lock is given back: the next batch runs.
        assert await store.delete_finished_jobs(
            dsn, before=T - timedelta(days=30), limit=10
        ) == FinishedJobsSweep(jobs=0, history=0)
    finally:
        await holder.close()
        await conn.close()


async def test_the_history_sweep_goes_on_where_the_last_batch_stopped(
    fresh: tuple[str, PostgresStore],
) -> None:
    """Each batch walks on from the last run id the one before it walked, so it does not walk
    again past the index entries its predecessors deleted (dead until VACUUM: with autovacuum
    off the sweep slowed from 251,000 to 81,000 rows/s after a million deletes)."""
    dsn, store = fresh
    conn = await asyncpg.connect(dsn)
    try:
        job = await _job(conn, "o", "scheduled", YOUNG)
        await _runs(conn, job, [OLD - timedelta(minutes=i) for i in range(10)])
        ids = [r["run_id"] for r in await conn.fetch("SELECT run_id FROM runs ORDER BY run_id")]
        before = T - timedelta(days=30)
        first = await store.delete_old_runs(dsn, before=before, limit=4)
        assert first is not None and (first.deleted, first.walked) == (4, ids[3])
        # From after ids[5]: ids[4] and ids[5] are left for a later round.
        second = await store.delete_old_runs(dsn, before=before, limit=4, after=ids[5])
        assert second is not None and (second.deleted, second.walked) == (4, ids[9])
        end = await store.delete_old_runs(dsn, before=before, limit=4, after=ids[9])
        assert end is not None and (end.deleted, end.walked) == (0, None)
        assert [r["run_id"] for r in await conn.fetch("SELECT run_id FROM runs ORDER BY run_id")] == ids[4:6]
        report = await _service(store, finished_job_retention_s=0).run_round()
        assert report.runs == 2
    finally:
        await conn.close()
