"""Migration 0013 (the fence remembers what it fenced) on a database with a run in flight.

The database is migrated up to 0012 and given a run in flight, in its second attempt, which the
previous release fenced (so nothing of ``fenced_*`` is set), then migrated to the end: its engine's
restart expires it from the row's own columns, as before the upgrade. A run a process of the
previous release fences after the upgrade, on a row whose earlier run a new fence described, is
expired from its row too: the earlier run's values are under an earlier lease token.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from duetime.core.ids import new_job_id, shard_of
from duetime.core.model import Outcome
from duetime.core.runpath import AttemptReport, Verdict
from duetime.storage.migrate import migrate
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.support.migrations import database_before

SPEC = {"target": {"type": "queue", "broker": "nats", "topic": "t"}, "schedule": {"cron": "@hourly"}}
ENGINE = "engine-1"
FENCED = "fenced_token, fenced_for, fenced_due, fenced_attempt, fenced_version, fenced_kind"
# The fence of migration 0012's release: phase, occurrence and run lease, nothing of fenced_*.
OLD_FENCE = (
    "UPDATE jobs SET phase = 'running', scheduled_for = next_run_at,"
    " run_until = now() + interval '1 minute' WHERE job_id = $1 AND lease_token = $2"
)


@pytest.fixture
async def old_db(run_tag: str) -> AsyncIterator[str]:
    async with database_before(13, f"duetime_test_{run_tag}_m13") as dsn:
        yield dsn


async def _history(store: PostgresStore, job_id: object) -> list[tuple[datetime, int, str, int]]:
    rows = await store.pool_for_shard(0).fetch(
        "SELECT scheduled_for, attempt, outcome, fencing_token FROM runs WHERE job_id = $1 ORDER BY run_id",
        job_id,
    )
    return [(r["scheduled_for"], r["attempt"], r["outcome"], r["fencing_token"]) for r in rows]


async def test_a_run_fenced_before_the_upgrade_expires_from_its_row(old_db: str) -> None:
    occurrence = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    job_id = new_job_id()
    conn = await asyncpg.connect(old_db)
    try:
        await conn.execute(
            "INSERT INTO jobs (job_id, shard, owner, spec, state, phase, next_run_at, scheduled_for,"
            " attempt, lease_token, claimed_by, leased_until, run_until) VALUES ($1, $2, 'o', $3::jsonb,"
            " 'scheduled', 'running', $4, $4, 1, 3, $5, now() + interval '1 minute',"
            " now() + interval '1 minute')",
            job_id,
            shard_of(job_id),
            json.dumps(SPEC),
            occurrence,
            ENGINE,
        )
    finally:
        await conn.close()
    assert (await migrate(old_db))[0] == "0013_fenced.sql"
    store = await PostgresStore.open(ShardMap.single(old_db), pool_size=2)
    try:
        pool = store.pool_for_shard(0)
        fenced = await pool.fetchrow(f"SELECT {FENCED} FROM jobs WHERE job_id = $1", job_id)
        assert set(dict(fenced).values()) == {None}, "the upgrade writes no row"
        assert (await store.expire_running_of(ENGINE, [shard_of(job_id)])).applied == 1
        assert await _history(store, job_id) == [(occurrence, 2, "lease_expired", 3)]
        row = await pool.fetchrow("SELECT phase, scheduled_for, attempt FROM jobs WHERE job_id = $1", job_id)
        assert dict(row) == {"phase": "idle", "scheduled_for": occurrence, "attempt": 2}, "retried"
    finally:
        await store.close()


async def test_a_run_an_old_process_fenced_after_a_new_one_expires_from_its_row(old_db: str) -> None:
    await migrate(old_db)
    job_id = new_job_id()
    shard = shard_of(job_id)
    store = await PostgresStore.open(ShardMap.single(old_db), pool_size=2)
    try:
        pool = store.pool_for_shard(0)
        await pool.execute(
            "INSERT INTO jobs (job_id, shard, owner, spec, state, next_run_at, scheduled_for)"
            " VALUES ($1, $2, 'o', $3, 'scheduled', now(), now())",
            job_id,
            shard,
            SPEC,  # the store's pools encode jsonb themselves
        )
        # A new engine runs the first attempt: its fence records it, and it fails (retried).
        [claim] = await store.claim_due(shard, ENGINE, lookahead_s=60, lease_s=30, limit=10)
        [first] = await store.fence_runs([claim], lease_s=30)
        t = datetime.now(UTC)
        failed = AttemptReport(first, Verdict(Outcome.FAILED, True, 500), started_at=t, finished_at=t)
        assert (await store.complete_runs([failed])).applied == 1
        # An engine of the previous release claims the retry and fences it: fenced_* still
        # describe the first attempt, under the first lease's token.
        [again] = await store.claim_due(shard, ENGINE, lookahead_s=60, lease_s=30, limit=10)
        assert again.lease_token > first.lease_token and again.attempt == 1
        assert await pool.execute(OLD_FENCE, job_id, again.lease_token) == "UPDATE 1"
        stale = await pool.fetchrow("SELECT fenced_token, fenced_attempt FROM jobs WHERE job_id = $1", job_id)
        assert dict(stale) == {"fenced_token": first.lease_token, "fenced_attempt": 0}
        assert (await store.expire_running_of(ENGINE, [shard])).applied == 1
        history = await _history(store, job_id)
        assert [(attempt, outcome, token) for _, attempt, outcome, token in history] == [
            (1, "failed", first.lease_token),
            (2, "lease_expired", again.lease_token),
        ], "the second attempt, read from the row: not the first one again"
    finally:
        await store.close()
