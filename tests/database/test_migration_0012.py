"""Migration 0012 (the HOT take) on a database with runs the previous release published and took.

The database is migrated up to 0011 and given, for one engine, a run it published that no worker
took yet (``claimed_by`` the engine's) and a run a worker of the previous release took (that
worker's id in ``claimed_by``), then migrated to the end. The new statements keep the first one
the engine's (its heartbeat, its restart) and leave the second to its worker, whose take is not
repeated by a new worker; ``taken_by`` outside ``running`` is refused.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from duetime.core.ids import new_job_id, shard_of
from duetime.storage.migrate import migrate
from duetime.storage.ports import Lease, PublishedRun
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.support.migrations import database_before

SPEC = {
    "target": {"type": "queue", "broker": "nats", "topic": "t"},
    "schedule": {"run_at": "2030-01-01T00:00:00Z"},
}
ENGINE = "engine-1"


@pytest.fixture
async def old_db(run_tag: str) -> AsyncIterator[str]:
    async with database_before(12, f"duetime_test_{run_tag}_m12") as dsn:
        yield dsn


async def _running(conn: asyncpg.Connection, holder: str) -> Lease:
    job_id = new_job_id()
    await conn.execute(
        "INSERT INTO jobs (job_id, shard, owner, spec, state, phase, next_run_at, scheduled_for,"
        " lease_token, claimed_by, leased_until, run_until) VALUES ($1, $2, 'o', $3::jsonb,"
        " 'scheduled', 'running', $4, $4, 3, $5, now() + interval '1 minute', now() + interval '1 minute')",
        job_id,
        shard_of(job_id),
        json.dumps(SPEC),
        datetime.now(UTC),
        holder,
    )
    return Lease(job_id, shard_of(job_id), 3)


async def test_runs_published_and_taken_before_the_upgrade_stay_whose_they_were(old_db: str) -> None:
    conn = await asyncpg.connect(old_db)
    try:
        published = await _running(conn, ENGINE)
        taken = await _running(conn, "worker-old")
    finally:
        await conn.close()
    assert (await migrate(old_db))[0] == "0012_hot_take.sql"
    store = await PostgresStore.open(ShardMap.single(old_db), pool_size=2)
    try:
        held = await store.extend_published([published, taken], holder=ENGINE, lease_s=30)
        assert held == {published.job_id}, "the engine keeps only the run nobody took"
        again = PublishedRun(taken.job_id, taken.shard, taken.lease_token, ENGINE)
        assert await store.take_runs([again], holder="worker-new", lease_s=30) == set(), "taken once"
        shards = sorted({published.shard, taken.shard})
        assert (await store.expire_running_of(ENGINE, shards)).applied == 1
        rows = {
            r["job_id"]: (r["phase"], r["claimed_by"], r["taken_by"])
            for r in await store.pool_for_shard(0).fetch(
                "SELECT job_id, phase, claimed_by, taken_by FROM jobs"
            )
        }
        assert rows == {published.job_id: ("idle", None, None), taken.job_id: ("running", "worker-old", None)}
        with pytest.raises(asyncpg.CheckViolationError, match="jobs_taken_only_running"):
            await store.pool_for_shard(0).execute(
                "UPDATE jobs SET taken_by = 'w' WHERE job_id = $1", published.job_id
            )
    finally:
        await store.close()


async def test_a_run_the_new_take_took_is_its_workers_until_it_ends(old_db: str) -> None:
    await migrate(old_db)
    conn = await asyncpg.connect(old_db)
    try:
        run = await _running(conn, ENGINE)
    finally:
        await conn.close()
    store = await PostgresStore.open(ShardMap.single(old_db), pool_size=2)
    try:
        message = PublishedRun(run.job_id, run.shard, run.lease_token, ENGINE)
        assert await store.take_runs([message], holder="worker-a", lease_s=30) == {run}
        assert await store.take_runs([message], holder="worker-b", lease_s=30) == set()
        assert await store.extend_published([run], holder=ENGINE, lease_s=30) == set()
        assert await store.expire_published_of(ENGINE, [run.shard]) == 0
        assert (await store.expire_running_of(ENGINE, [run.shard])).applied == 0
        row = await store.pool_for_shard(0).fetchrow(
            "SELECT phase, claimed_by, taken_by FROM jobs WHERE job_id = $1", run.job_id
        )
        assert dict(row) == {"phase": "running", "claimed_by": ENGINE, "taken_by": "worker-a"}
    finally:
        await store.close()
