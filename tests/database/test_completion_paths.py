"""The completion's two paths write the same rows: one batch of varied reports is finished by
``finish_ordinary`` first (the default), then, from the same rows restored, by the general path
alone (``lock_for_completion`` + ``core.lifecycle`` + ``apply_plans``/``insert_runs``), and the
jobs' rows, their history and their failure events must come out the same.

The batch mixes what the one statement may take (one-offs and recurring occurrences that
succeeded, with jitter, an escaped error text, no call made, a spec PATCHed without a new
version) with what it must leave to the general path (failures, retries, a paused or cancelled
job, a trigger waiting, a new schedule, an overlap policy changed under the run, a failure
count to reset, a stale token, two reports of one job)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from duetime.core.ids import shard_of
from duetime.core.jitter import spread
from duetime.core.model import (
    CronSchedule,
    JobSpec,
    OneOffSchedule,
    OnFailure,
    Outcome,
    Overlap,
    RetryPolicy,
    WebhookTarget,
)
from duetime.core.runpath import AttemptReport, FencedRun, Verdict
from duetime.storage.completion_rules import failure_parents
from duetime.storage.postgres import PostgresStore
from duetime.storage.postgres.completion import OrdinaryBatch
from duetime.storage.queries import Q
from duetime.storage.shardmap import ShardMap

ENGINE = "paths-engine"
HOOK = WebhookTarget(url="https://example.com/hook")
# The rows' columns that say what a row is; updated_at is the statement's clock.
JOB_COLUMNS = (
    "job_id, state, phase, next_run_at, scheduled_for, attempt, run_kind, resume_at, pending_triggers,"
    " split_at, handed_upto, claimed_by, leased_until, lease_token, spec_version, last_run,"
    " consecutive_failures, failing, last_success_for, folded_from, folded_into"
)
RUN_COLUMNS = (
    "job_id, shard, scheduled_for, attempt, started_at, finished_at, outcome, status_code, error,"
    " lateness_ms, fencing_token"
)


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=4)
    yield s
    await s.close()


def one_off(**kw: Any) -> JobSpec:
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    return JobSpec(target=HOOK, schedule=OneOffSchedule(run_at=at), **kw)


def hourly(**kw: Any) -> JobSpec:
    return JobSpec(target=HOOK, schedule=CronSchedule(cron="0 0 * * * *", timezone="UTC"), **kw)


T0 = datetime(2026, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)


def report(
    run: FencedRun,
    outcome: Outcome = Outcome.SUCCEEDED,
    *,
    retryable: bool = False,
    status: int | None = 200,
    error: str | None = None,
    called: bool = True,
) -> AttemptReport:
    verdict = Verdict(outcome, retryable, status, error)
    return AttemptReport(run, verdict, T0 if called else None, T0 + timedelta(milliseconds=250))


async def running(store: PostgresStore, owner: str, specs: Sequence[JobSpec]) -> list[FencedRun]:
    """Jobs of ``specs``, made due now, claimed and fenced: one fenced run each, in order."""
    ids = [uuid.UUID((await store.create_job(owner, spec))[0].id) for spec in specs]
    async with store.home_pool.acquire() as conn:
        await conn.execute("UPDATE jobs SET next_run_at = now() WHERE job_id = ANY($1::uuid[])", ids)
    claims = {}
    for shard in sorted({shard_of(i) for i in ids}):
        for c in await store.claim_due(shard, ENGINE, lookahead_s=60, lease_s=60, limit=500):
            claims[c.job_id] = c
    fenced = {r.job_id: r for r in await store.fence_runs([claims[i] for i in ids], lease_s=60)}
    for run in fenced.values():
        assert run.spec.parsed  # as the worker does for its call
    return [fenced[i] for i in ids]


async def rows_of(conn: asyncpg.Connection, ids: list[uuid.UUID]) -> tuple[list[Any], list[Any], list[Any]]:
    jobs = await conn.fetch(
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ANY($1::uuid[]) ORDER BY job_id", ids
    )
    runs = await conn.fetch(
        f"SELECT {RUN_COLUMNS} FROM runs WHERE job_id = ANY($1::uuid[]) ORDER BY job_id, run_id", ids
    )
    events = await conn.fetch(
        "SELECT event_id, job_id, type, fencing_token FROM failure_events WHERE job_id = ANY($1::uuid[])"
        " ORDER BY event_id",
        ids,
    )
    return [dict(r) for r in jobs], [dict(r) for r in runs], [dict(r) for r in events]


async def test_both_paths_write_the_same_rows(store: PostgresStore) -> None:
    owner = "o_" + uuid.uuid4().hex[:10]
    retry = RetryPolicy(max_attempts=3, backoff_initial_s=3600, backoff_max_s=3600)
    specs = [
        one_off(),  # 0 ordinary
        one_off(jitter_s=30),  # 1 ordinary, jittered
        one_off(),  # 2 ordinary, error text to escape
        one_off(),  # 3 ordinary, no call made
        one_off(),  # 4 failed for good: dead
        one_off(retry=retry),  # 5 failed, retried
        one_off(),  # 6 paused while it ran
        one_off(),  # 7 cancelled while it ran
        one_off(),  # 8 stale token
        one_off(),  # 9 two reports
        hourly(overlap=Overlap.SKIP),  # 10 ordinary recurring
        hourly(overlap=Overlap.ALLOW, jitter_s=10),  # 11 ordinary recurring, split point
        hourly(overlap=Overlap.SKIP),  # 12 a trigger waits
        one_off(),  # 13 PATCHed without a new version: still ordinary
        hourly(overlap=Overlap.SKIP),  # 14 overlap PATCHed to allow while it ran
        one_off(),  # 15 a new schedule while it ran
        one_off(pause_after_failures=3),  # 16 counts failures, none yet: ordinary
        one_off(on_failure=OnFailure(target=HOOK, after=1)),  # 17 failing: recovers
    ]
    runs = await running(store, owner, specs)
    ids = [r.job_id for r in runs]
    await store.pause_job(owner, ids[6])
    await store.cancel_job(owner, ids[7])
    await store.trigger_job(owner, ids[12])
    await store.update_job(owner, ids[13], one_off(retry=retry))
    await store.update_job(owner, ids[14], hourly(overlap=Overlap.ALLOW))
    await store.update_job(owner, ids[15], JobSpec(target=HOOK, schedule=OneOffSchedule(run_at=T0)))
    async with store.home_pool.acquire() as conn:
        await conn.execute(
            "UPDATE jobs SET consecutive_failures = 2, failing = true WHERE job_id = $1", ids[17]
        )
    reports = [
        report(runs[0]),
        report(runs[1], status=204),
        report(runs[2], error='a "quoted" answer, \\ and ü'),
        report(runs[3], status=None, called=False),
        report(runs[4], Outcome.FAILED, status=500),
        report(runs[5], Outcome.FAILED, retryable=True, status=503),
        report(runs[6]),
        report(runs[7]),
        report(replace(runs[8], lease_token=runs[8].lease_token + 7)),
        report(runs[9]),
        report(runs[9], Outcome.FAILED, status=500),
        report(runs[10]),
        report(runs[11]),
        report(runs[12]),
        report(runs[13]),
        report(runs[14]),
        report(runs[15]),
        report(runs[16]),
        report(runs[17]),
    ]
    ordinary = OrdinaryBatch.of(reports, failure_parents(reports), datetime.now(UTC))
    assert set(ordinary.job_ids) == {ids[i] for i in (0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17)}, (
        "the reports the node offers to the one statement (its guards turn some away)"
    )

    async with store.home_pool.acquire() as conn:
        await conn.execute("DROP TABLE IF EXISTS paths_snapshot")
        await conn.execute(
            "CREATE TABLE paths_snapshot AS SELECT * FROM jobs WHERE job_id = ANY($1::uuid[])", ids
        )
        results = []
        recorded_from = datetime.now(UTC)
        for one_statement in (True, False):
            await conn.execute("DELETE FROM runs WHERE job_id = ANY($1::uuid[])", ids)
            await conn.execute("DELETE FROM failure_events WHERE job_id = ANY($1::uuid[])", ids)
            await conn.execute("DELETE FROM jobs WHERE job_id = ANY($1::uuid[])", ids)
            await conn.execute("INSERT INTO jobs SELECT * FROM paths_snapshot")
            store.finish_ordinary = one_statement
            stats = await store.complete_runs(reports)
            results.append((stats, await rows_of(conn, ids)))
        await conn.execute("DROP TABLE paths_snapshot")
    (new_stats, new), (old_stats, old) = results
    assert (new_stats.applied, new_stats.stale, new_stats.history) == (17, 2, 17)
    assert new_stats == old_stats
    new_jobs, new_runs, new_events = new
    old_jobs, old_runs, old_events = old
    # The retried one's next attempt is drawn by the backoff from each path's own clock: full
    # jitter, anywhere in the hour after its completion (a floor of five minutes failed about one
    # run in twelve, when the draw landed below it).
    retried = next(i for i, j in enumerate(old_jobs) if j["job_id"] == ids[5])
    latest = datetime.now(UTC) + timedelta(seconds=3600)
    for jobs in (new_jobs, old_jobs):
        assert recorded_from <= jobs[retried].pop("next_run_at") <= latest
    assert new_jobs == old_jobs
    assert sorted(new_runs, key=str) == sorted(old_runs, key=str)
    assert new_events == old_events and len(new_events) == 1, "job.recovered, once"
    by_id = {j["job_id"]: j for j in new_jobs}
    assert by_id[ids[0]]["state"] == "completed" and by_id[ids[10]]["state"] == "scheduled"
    assert by_id[ids[11]]["split_at"] is not None


async def test_an_ordinary_batch_needs_no_general_path(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Succeeded one-offs and recurring occurrences are finished by the one statement alone: the
    general path's lock read is never run for them."""
    owner = "o_" + uuid.uuid4().hex[:10]
    runs = await running(store, owner, [one_off(), one_off(jitter_s=5), hourly(overlap=Overlap.SKIP)])
    monkeypatch.setitem(Q, "lock_for_completion", "SELECT 1/0")
    stats = await store.complete_runs([report(r) for r in runs])
    assert (stats.applied, stats.stale, stats.history) == (3, 0, 3)
    jobs = [await store.get_job(owner, r.job_id) for r in runs]
    assert [j.state.value for j in jobs] == ["completed", "completed", "scheduled"]
    assert all(
        j.last_run is not None and j.last_run.finished_at == T0 + timedelta(milliseconds=250) for j in jobs
    )


@pytest.mark.parametrize("one_statement", [True, False], ids=["one-statement", "general-path"])
async def test_lateness_counts_from_the_spread_time(store: PostgresStore, one_statement: bool) -> None:
    """spread_s: a run started 1.234 s after its occurrence's spread time is 1234 ms late (not
    the offset more), on both completion paths; the next occurrence is due at its own spread time."""
    owner = "o_" + uuid.uuid4().hex[:10]
    job = hourly(overlap=Overlap.SKIP, spread_s=3600)
    [run] = await running(store, owner, [job])
    offset = spread(run.job_id, job)
    started = run.scheduled_for + offset + timedelta(milliseconds=1234)
    verdict = Verdict(Outcome.SUCCEEDED, False, 200, None)
    store.finish_ordinary = one_statement
    try:
        stats = await store.complete_runs(
            [AttemptReport(run, verdict, started, started + timedelta(seconds=1))]
        )
    finally:
        store.finish_ordinary = True
    assert stats.applied == 1
    async with store.home_pool.acquire() as conn:
        lateness = await conn.fetchval("SELECT lateness_ms FROM runs WHERE job_id = $1", run.job_id)
    assert lateness == 1234
    after = await store.get_job(owner, run.job_id)
    assert after.last_run is not None and after.last_run.lateness_ms == 1234
    assert after.last_run.scheduled_for == run.scheduled_for  # the nominal time, as sent
    assert after.next_run_at == run.scheduled_for + timedelta(hours=1) + offset
