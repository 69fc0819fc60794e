"""Bulk seeding with COPY, the benchmark's database counters, and the run path's plans in a burst.

These run on databases of their own: bulk rows are due, and a shared database's other tests claim
whatever is due on a shard.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from duetime.core.ids import shard_of
from duetime.core.model import (
    Broker,
    JobSpec,
    OneOffSchedule,
    Outcome,
    QueueTarget,
    RetryPolicy,
    WebhookTarget,
)
from duetime.core.runpath import AttemptReport, Claim, Verdict
from duetime.engine.retention import RetentionConfig, RetentionService
from duetime.storage.bulk import (
    BulkJob,
    HistoryLeft,
    analyze_jobs,
    copy_jobs,
    copy_jobs_with_labels,
    job_rows,
    label_rows_differ,
    old_history_left,
    outcome_counts,
    seed_jobs,
    seed_old_history,
    table_writes,
)
from duetime.storage.migrate import migrate
from duetime.storage.postgres import PostgresStore, job_from_row
from duetime.storage.postgres.completion import OrdinaryBatch
from duetime.storage.queries import Q
from duetime.storage.shardmap import ShardMap
from loadtest.registry_scale import year_of_jobs
from tests.conftest import ADMIN_DSN
from tests.support.plans import analyzed
from tests.support.wait import until

ENGINE = "bulk-test-engine"


@pytest.fixture
async def fresh_dsns() -> AsyncIterator[list[str]]:
    """Two new migrated databases for one test, dropped after it."""
    names = [f"duetime_test_bulk_{secrets.token_hex(4)}" for _ in range(2)]
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        for name in names:
            await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsns = [f"{ADMIN_DSN.rpartition('/')[0]}/{name}" for name in names]
    try:
        for dsn in dsns:
            await migrate(dsn)
        yield dsns
    finally:
        admin = await asyncpg.connect(ADMIN_DSN)
        try:
            for name in names:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


def _spec(at: datetime, name: str | None = "nightly") -> JobSpec:
    return JobSpec(
        name=name,
        target=WebhookTarget(url="https://example.com/hook", headers={"X-Token": "t"}),
        payload={"report": "daily"},
        schedule=OneOffSchedule(at),
        retry=RetryPolicy(max_attempts=3),
    )


async def test_a_bulk_row_is_the_row_create_job_writes(fresh_dsns: list[str]) -> None:
    # Two databases: the same owner may not hold one name twice in one database (names are
    # unique per owner), and the rows must be equal name included.
    dsn, other = fresh_dsns
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=2)
    bulk_store = await PostgresStore.open(ShardMap.single(other), pool_size=2)
    try:
        job, _ = await store.create_job("alice", _spec(at))
        seeded_at = datetime.now(UTC)
        [bulk_id] = await seed_jobs([other] * 16, [BulkJob("alice", _spec(at))], seeded_at)
        via_api = await store.pool_for_shard(0).fetchrow(
            "SELECT * FROM jobs WHERE job_id = $1", uuid.UUID(job.id)
        )
        via_bulk = await bulk_store.pool_for_shard(0).fetchrow(
            "SELECT * FROM jobs WHERE job_id = $1", bulk_id
        )
    finally:
        await store.close()
        await bulk_store.close()
    assert via_bulk is not None and via_api is not None
    assert via_bulk["shard"] == shard_of(bulk_id)
    assert via_bulk["created_at"] == via_bulk["updated_at"] == seeded_at
    differ = {"job_id", "shard", "created_at", "updated_at"}
    bulk_row, api_row = dict(via_bulk.items()), dict(via_api.items())
    assert {k: v for k, v in bulk_row.items() if k not in differ} == {
        k: v for k, v in api_row.items() if k not in differ
    }
    assert job_from_row(via_bulk).spec == _spec(at)


async def test_seed_jobs_follows_the_shard_map(fresh_dsns: list[str]) -> None:
    a, b = fresh_dsns
    at = datetime.now(UTC) + timedelta(days=1)
    spec = _spec(at, name=None)  # 1,500 jobs of one owner: names are unique per owner
    seen: list[int] = []
    ids = await seed_jobs(
        [a] * 8 + [b] * 8,
        (BulkJob("bob", spec) for _ in range(1500)),
        datetime.now(UTC),
        chunk=200,
        progress=seen.append,
    )
    assert len(set(ids)) == 1500
    assert seen[-1] == 1500 and seen == sorted(seen)
    for dsn, shards in ((a, range(8)), (b, range(8, 16))):
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch("SELECT job_id, shard FROM jobs")
        finally:
            await conn.close()
        assert {r["shard"] for r in rows} <= set(shards)
        assert {r["job_id"] for r in rows} == {i for i in ids if shard_of(i) in shards}
    none = await seed_jobs([a] * 16, [BulkJob("bob", spec)], datetime.now(UTC), return_ids=False)
    assert none == []


async def _claim_everything(store: PostgresStore) -> list[Claim]:
    claimed: list[Claim] = []
    for shard in range(16):
        while True:
            rows = await store.claim_due(shard, ENGINE, lookahead_s=60, lease_s=60, limit=500)
            claimed += rows
            if len(rows) < 500:
                break
    return claimed


async def _seed_burst(dsn: str, owner: str, n: int) -> None:
    """``n`` one-off jobs of ``owner`` due together in 30 s, a Redis target: a burst to claim."""
    at = datetime.now(UTC) + timedelta(seconds=30)
    target = QueueTarget(broker=Broker.REDIS, topic="burst")
    jobs = (BulkJob(owner, JobSpec(target=target, schedule=OneOffSchedule(at))) for _ in range(n))
    await seed_jobs([dsn] * 16, jobs, datetime.now(UTC))


async def test_a_burst_keeps_fences_heartbeats_and_releases_on_the_primary_key(fresh_dsns: list[str]) -> None:
    """Regression: with statistics from before the burst (nothing leased), the planner read the
    whole lease index for every 500-row fence: cost growing with the wheel, seconds per batch at a
    million claimed. The lease and holder indexes are now keyed on IS NOT NULL (migration 0002)."""
    dsn = fresh_dsns[0]
    await _seed_burst(dsn, "carol", 4000)
    pad = await asyncpg.connect(dsn)  # and a registry around them: jobs due over the next weeks
    try:
        await pad.execute(
            "INSERT INTO jobs (job_id, shard, owner, spec, state, next_run_at, scheduled_for) "
            "SELECT gen_random_uuid(), (g % 16), 'pad', '{}'::jsonb, 'scheduled', "
            "now() + make_interval(hours => 1 + g % 500), now() + make_interval(hours => 1 + g % 500) "
            "FROM generate_series(1, 60000) g"
        )
    finally:
        await pad.close()
    await analyze_jobs([dsn])  # the statistics an engine has when the burst begins: all idle
    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=2)
    try:
        claimed = await _claim_everything(store)
        assert len(claimed) == 4000
        batch = claimed[:500]
        ids = [r.job_id for r in batch]
        tokens = [r.lease_token for r in batch]
        conn = await asyncpg.connect(dsn)
        try:
            plans = {
                "fence_runs": await conn.fetch(
                    "EXPLAIN " + Q["fence_runs"], ids, tokens, 30.0, [r.scheduled_for_us for r in batch]
                ),
                "extend_leases": await conn.fetch("EXPLAIN " + Q["extend_leases"], ids, tokens, 30.0),
                "release_claims": await conn.fetch("EXPLAIN " + Q["release_claims"], ids, tokens),
            }
            async with conn.transaction():
                await conn.execute("SET LOCAL enable_seqscan = off")
                janitor = await conn.fetch("EXPLAIN " + Q["expired_leases"], 0, 500)
                restart = await conn.fetch("EXPLAIN " + Q["retake_claims"], ENGINE, [0, 1], 30.0)
        finally:
            await conn.close()
        # and the statements still do their work
        fenced = await store.fence_runs(batch, lease_s=30)
        assert len(fenced) == 500
        # The NATS run path's take and an engine's heartbeat of what it published, on running rows
        # its holder has: by primary key too, not by the holder index (which the same statistics
        # make look nearly empty, and which holds every row the engine has fenced).
        ids, tokens = [r.job_id for r in fenced], [r.lease_token for r in fenced]
        conn = await asyncpg.connect(dsn)
        try:
            plans["take_runs"] = await conn.fetch(
                "EXPLAIN " + Q["take_runs"], ids, tokens, [ENGINE] * len(ids), "worker-1", 30.0
            )
            plans["extend_published"] = await conn.fetch(
                "EXPLAIN " + Q["extend_published"], ids, tokens, ENGINE, 30.0
            )
        finally:
            await conn.close()
        assert await store.release_claims(claimed[500:]) == 3500
    finally:
        await store.close()
    for name, plan in plans.items():
        text = "\n".join(r[0] for r in plan)
        assert "jobs_pkey" in text, (name, text)
        assert "jobs_leases" not in text and "jobs_claimed_by" not in text, (name, text)
        # Regression: joined on "j.job_id = locked.job_id", the lock CTE was rescanned once per row
        # of the batch (a nested loop over an estimated single claimed row): 250,000 comparisons
        # and ~150 ms per 500-row fence. It is a one-time gate now, the update never joins it.
        assert "locked.job_id" not in text, (name, text)
        assert "One-Time Filter" in text, (name, text)
    assert "jobs_leases" in "\n".join(r[0] for r in janitor)
    assert "jobs_claimed_by" in "\n".join(r[0] for r in restart)


async def _older_transactions_ended(conn: asyncpg.Connection) -> None:
    """Wait until no transaction older than now runs on the server, in any database. A snapshot's
    xmin is the oldest transaction running anywhere on the server, and a page is pruned of the
    versions the last statement left dead only below that xmin: while another database's writer
    (another test, another CI run) is older than them, they stay, the page has no room, and the
    update is not HOT (44 % were, with three test workers beside this test)."""
    mark = int(await conn.fetchval("SELECT pg_current_xact_id()::text"))

    async def passed() -> bool:
        return int(await conn.fetchval("SELECT pg_snapshot_xmin(pg_current_snapshot())::text")) > mark

    await until(passed, within=60, what="the transactions older than the last statement to end")


async def _updates_in(conn: asyncpg.Connection, query: str, *args: Any) -> tuple[int, int, int]:
    """Run one statement in a transaction of its own: (rows it returned, rows of ``jobs`` it
    updated, of those how many as HOT updates), from the backend's own counters (they hold what
    it has not yet reported, earlier transactions' too: the difference is the statement's)."""
    await _older_transactions_ended(conn)
    counters = (
        "SELECT pg_stat_get_xact_tuples_updated('jobs'::regclass) AS upd,"
        " pg_stat_get_xact_tuples_hot_updated('jobs'::regclass) AS hot"
    )
    async with conn.transaction():
        before = await conn.fetchrow(counters)
        rows = await conn.fetch(query, *args)
        after = await conn.fetchrow(counters)
    return len(rows), after["upd"] - before["upd"], after["hot"] - before["hot"]


async def test_the_fence_the_take_and_a_running_runs_heartbeats_are_hot_updates(
    fresh_dsns: list[str],
) -> None:
    """The fence (claimed -> running), the heartbeats of running runs (the worker's, and the
    engine's for runs it published) and a worker's take of a published run set no column an index
    reads, so PostgreSQL writes them as HOT updates: a new version beside the old one on its page,
    no index entry. Before migration 0012 the take set ``claimed_by`` (jobs_claimed_by's key,
    jobs_due's predicate) and none of its updates was HOT. Before migration 0010
    the fence set ``phase`` (in the predicates of jobs_due and jobs_split) and ``leased_until``
    (jobs_leases' key): 0 of 500 updates were HOT, each wrote six index entries (~24 us of a
    fence's ~33 us per row, docs/performance.md). A HOT update also needs room on the row's page
    (fillfactor 80, and the claim's dead versions pruned): 72-84 % of these small rows found it
    here, 98 % of the benchmark's (loadtest.fence_bench). Migrations 0018-0020 widened the row
    the fence writes (fenced_revision, folded_from, folded_into): 48-49 % find room now, so the
    test asks for more than 40 % (none at all is what a written index column gives)."""
    dsn = fresh_dsns[0]
    await _seed_burst(dsn, "erin", 2000)
    await analyze_jobs([dsn])
    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=2)
    conn = await asyncpg.connect(dsn)
    try:
        batch = (await _claim_everything(store))[:500]
        ids, tokens = [r.job_id for r in batch], [r.lease_token for r in batch]
        us = [r.scheduled_for_us for r in batch]
        seen = {
            "fence_runs": await _updates_in(conn, Q["fence_runs"], ids, tokens, 30.0, us),
            "extend_leases": await _updates_in(conn, Q["extend_leases"], ids, tokens, 30.0),
            "extend_published": await _updates_in(conn, Q["extend_published"], ids, tokens, ENGINE, 30.0),
            "take_runs": await _updates_in(
                conn, Q["take_runs"], ids, tokens, [ENGINE] * len(ids), "worker-1", 30.0
            ),
        }
    finally:
        await conn.close()
        await store.close()
    for name, (returned, updated, hot) in seen.items():
        assert returned == updated == 500, (name, returned, updated)
        assert hot > 200, f"{name}: {hot} of {updated} updates were HOT"


async def test_run_path_statements_stay_linear_on_a_small_table(fresh_dsns: list[str]) -> None:
    """Regression: on a table of a few thousand jobs whose statistics say nothing is claimed (an
    ANALYZE at a quiet moment: the claimed share is always small), the planner estimated one
    claimed row from the guards on ``jobs`` ("phase = 'claimed'"), scanned ``jobs`` for it and
    put the batch's ``unnest`` on the inner side of a nested loop: every row of the table
    compared with every row of the batch, 2.5 million comparisons and 300-750 ms per 500-row
    fence of a 5,000-job table (``loadtest.fence_bench``), where the fence takes ~15 ms. The
    guards are now read from the rows as locked, and ``jobs`` is reached by its primary key. The
    completion's statements are checked the same way (``finish_ordinary`` was built so)."""
    dsn = fresh_dsns[0]
    await _seed_burst(dsn, "dave", 5000)
    await analyze_jobs([dsn])  # all idle: what an engine's planner knows when the burst begins
    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=2)
    conn = await asyncpg.connect(dsn)
    try:
        claimed = await _claim_everything(store)
        assert len(claimed) == 5000
        batch = claimed[:500]
        ids, tokens = [r.job_id for r in batch], [r.lease_token for r in batch]
        plans = {
            "fence_runs": await analyzed(
                conn, Q["fence_runs"], ids, tokens, 30.0, [r.scheduled_for_us for r in batch]
            ),
            "extend_leases": await analyzed(conn, Q["extend_leases"], ids, tokens, 30.0),
            "release_claims": await analyzed(conn, Q["release_claims"], ids, tokens),
        }
        fenced = await store.fence_runs(batch, lease_s=30)
        assert len(fenced) == 500
        ids, tokens = [r.job_id for r in fenced], [r.lease_token for r in fenced]
        plans["take_runs"] = await analyzed(
            conn, Q["take_runs"], ids, tokens, [ENGINE] * len(ids), "worker-1", 30.0
        )
        plans["extend_published"] = await analyzed(conn, Q["extend_published"], ids, tokens, ENGINE, 30.0)
        # and the completion's statements on the same small table: the ordinary path's one
        # statement (guards read as locked, already) and the general path's lock
        now = datetime.now(UTC)
        for r in fenced:
            _ = r.spec.parsed  # the worker's parse, which the ordinary path reuses
        ok = Verdict(Outcome.SUCCEEDED, False, 200)
        ordinary = OrdinaryBatch.of([AttemptReport(r, ok, now, now) for r in fenced], [], now)
        plans["finish_ordinary"] = await analyzed(conn, Q["finish_ordinary"], [], [], *ordinary.arrays())
        plans["lock_for_completion"] = await analyzed(conn, Q["lock_for_completion"], ids, [])
    finally:
        await conn.close()
        await store.close()
    for name, nodes in ((n, p) for n, both in plans.items() for p in both):
        top = nodes[0]
        if name == "finish_ordinary":  # one row: the ids it left (all 500 one-offs updated)
            updates = [n for n in nodes if n["Node Type"] == "ModifyTable" and n["Operation"] == "Update"]
            assert sorted(n["Actual Rows"] for n in updates) == [0, 500], (name, updates)
        else:
            assert top["Actual Rows"] == 500, (name, top["Actual Rows"])  # and each did its work
        compared = sum(n.get("Rows Removed by Join Filter", 0) for n in nodes)
        assert compared < 5000, (name, compared)  # was 2,500,000 for a 5,000-job table
        # nothing is scanned again per row but a primary-key probe (a rescanned batch is the
        # quadratic plan whatever its filter removes)
        again = [(n["Node Type"], n["Actual Loops"]) for n in nodes if n["Actual Loops"] > 1]
        assert all(t == "Index Scan" for t, _ in again), (name, again)


async def test_table_writes_and_outcomes_count_a_run(fresh_dsns: list[str]) -> None:
    dsn = fresh_dsns[0]
    at = datetime.now(UTC) - timedelta(seconds=1)
    before = await table_writes([dsn])
    await seed_jobs([dsn] * 16, (BulkJob("dave", _spec(at, name=None)) for _ in range(10)), datetime.now(UTC))
    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=2)
    try:
        claimed = await _claim_everything(store)
        fenced = await store.fence_runs(claimed, lease_s=30)
        now = datetime.now(UTC)
        reports = [
            AttemptReport(
                f,
                Verdict(
                    Outcome.SUCCEEDED if i % 2 else Outcome.FAILED,
                    False,
                    error=None if i % 2 else "HTTP 500",
                ),
                started_at=now,
                finished_at=now,
            )
            for i, f in enumerate(fenced)
        ]
        stats = await store.complete_runs(reports)
    finally:
        await store.close()
    assert stats.applied == 10
    # Counters reach pg_stat_user_tables when a backend goes idle, at most once a second.
    after = before
    for _ in range(100):
        after = await table_writes([dsn])
        if after["ins"] - before["ins"] >= 20 and after["upd"] - before["upd"] >= 30:
            break
        await asyncio.sleep(0.2)
    assert after["ins"] - before["ins"] == 20  # 10 jobs + 10 history rows
    assert after["upd"] - before["upd"] == 30  # claim, fence, completion
    assert after["wal_bytes"] > before["wal_bytes"]
    assert await outcome_counts([dsn]) == {"succeeded": (5, None), "failed": (5, "HTTP 500")}


async def _label_rows(dsn: str) -> list[tuple[str, str, str, uuid.UUID]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT owner, key, value, job_id FROM job_labels")
    finally:
        await conn.close()
    return sorted((r["owner"], r["key"], r["value"], r["job_id"]) for r in rows)


async def test_a_load_with_the_trigger_off_writes_the_trigger_s_label_rows(fresh_dsns: list[str]) -> None:
    # The same jobs (same ids) into two databases: one by a plain COPY, the label trigger writing
    # job_labels; one by the benchmark's loader, which writes them itself with the trigger off.
    with_trigger, direct = fresh_dsns
    jobs = list(year_of_jobs(2000, datetime.now(UTC), random.Random(7)))
    rows = [row for row, _ in jobs]
    ids = [row[0] for row in rows]
    conn = await asyncpg.connect(with_trigger)
    try:
        await copy_jobs(conn, rows)
    finally:
        await conn.close()
    conn = await asyncpg.connect(direct)
    try:
        assert await copy_jobs_with_labels(conn, rows, [lr for _, lrs in jobs for lr in lrs]) == 2000
        assert await label_rows_differ(conn, ids) == 0
    finally:
        await conn.close()
    trigger_rows = await _label_rows(with_trigger)
    assert len(trigger_rows) == 8000
    assert await _label_rows(direct) == trigger_rows
    conn = await asyncpg.connect(direct)
    try:
        # The trigger was off for the load's transaction only: the next insert on the same
        # connection gets its label rows from the trigger again.
        spec = JobSpec(
            target=WebhookTarget(url="https://example.com/h"),
            schedule=OneOffSchedule(datetime.now(UTC) + timedelta(hours=1)),
            labels={"k": "v"},
        )
        [one] = job_rows([BulkJob("erin", spec)], datetime.now(UTC))
        await copy_jobs(conn, [one])
        assert await conn.fetchval("SELECT count(*) FROM job_labels WHERE owner = 'erin'") == 1
        # The check sees a missing row, a changed one (as missing: "present" is looked up under the
        # pairs the jobs carry), and a row the trigger would not make under such a pair.
        await conn.execute("DELETE FROM job_labels WHERE job_id = $1 AND key = 'team'", ids[0])
        await conn.execute("UPDATE job_labels SET value = 'x' WHERE job_id = $1 AND key = 'env'", ids[1])
        await conn.execute("INSERT INTO job_labels VALUES ($1, 'all', '1', $2)", rows[1][2], ids[2])
        assert await label_rows_differ(conn, ids[:3]) == 3
        assert await label_rows_differ(conn, ids[3:]) == 0
    finally:
        await conn.close()


async def test_a_load_with_triggers_off_refuses_a_trigger_it_does_not_know(fresh_dsns: list[str]) -> None:
    dsn = fresh_dsns[0]
    jobs = list(year_of_jobs(10, datetime.now(UTC), random.Random(8)))
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "CREATE FUNCTION bulk_test_noop() RETURNS trigger LANGUAGE plpgsql"
            " AS $$ BEGIN RETURN NULL; END $$"
        )
        await conn.execute(
            "CREATE TRIGGER bulk_test_other AFTER INSERT ON jobs"
            " FOR EACH STATEMENT EXECUTE FUNCTION bulk_test_noop()"
        )
        with pytest.raises(RuntimeError, match="bulk_test_other"):
            await copy_jobs_with_labels(conn, [r for r, _ in jobs], [lr for _, lrs in jobs for lr in lrs])
        assert await conn.fetchval("SELECT count(*) FROM jobs") == 0
    finally:
        await conn.close()


async def test_old_history_is_the_oldest_range_and_retention_deletes_it(fresh_dsns: list[str]) -> None:
    dsn = fresh_dsns[0]
    before = datetime.now(UTC) - timedelta(days=40)
    old = await seed_old_history(
        dsn,
        _spec(before, name=None),
        owner="old",
        finished_jobs=5,
        runs_per_job=3,
        cron_runs=40,
        finished_before=before,
        chunk=7,
    )
    assert (old.finished_jobs, old.runs, old.last_run_id - old.first_run_id + 1) == (5, 55, 55)
    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=2)
    conn = await asyncpg.connect(dsn)
    try:
        assert await old_history_left(conn, old) == HistoryLeft(runs=55, finished_jobs=5)
        stamps = await conn.fetchrow(
            "SELECT (SELECT max(finished_at) FROM runs) AS runs,"
            " (SELECT max(updated_at) FROM jobs WHERE state = 'completed') AS jobs"
        )
        assert stamps["runs"] < before and stamps["jobs"] < before
        # the 16 crons are live (paused), not finished: retention keeps them
        assert await conn.fetchval("SELECT count(*) FROM jobs WHERE state = 'paused'") == 16
        with pytest.raises(RuntimeError, match="runs must be empty"):
            await seed_old_history(
                dsn,
                _spec(before, name=None),
                owner="old",
                finished_jobs=1,
                runs_per_job=1,
                cron_runs=0,
                finished_before=before,
            )
        report = await RetentionService(store, RetentionConfig(batch=10, pause_s=0)).run_round()
        assert (report.runs, report.jobs) == (55, 5)
        assert await old_history_left(conn, old) == HistoryLeft(runs=0, finished_jobs=0)
        assert await conn.fetchval("SELECT count(*) FROM jobs WHERE state = 'paused'") == 16
    finally:
        await conn.close()
        await store.close()
