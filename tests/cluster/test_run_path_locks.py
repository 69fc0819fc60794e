"""The batch statements that engines and workers run against the same rows at the same time lock
those rows in one order: by job id, the order ``lock_for_completion`` (completions, the janitor)
uses too.

Regression: at 20,000 runs an engine's heartbeat of its published runs (``extend_published``)
and a worker's take (``take_runs``) locked overlapping rows in the orders of their input arrays
(the engine's fence order, the worker's message order). PostgreSQL broke the cycles as deadlocks
after ``deadlock_timeout``; the aborted heartbeat skipped the rest of its beat, the test's 4-second
leases of runs still waiting in NATS lapsed, and the janitor finished thousands of them as
``lease_expired`` and retried them (4,504 and 6,851 of 20,000 in two runs).

Each statement here gets its batch in descending id order while another transaction holds the
lowest row: a statement that locks in input order has taken the higher rows before it waits (the
half of a deadlock), one that locks in id order holds nothing while it waits.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from duetime.core.model import JobSpec, OneOffSchedule, WebhookTarget
from duetime.core.runpath import Claim, Lease, PublishedRun
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.cluster.harness import utcnow
from tests.support.locks import rows_held, wait_until_blocked

ENGINE = "lock-order-engine"
TOKEN = 7


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=2)
    yield s
    await s.close()


async def _running_jobs(store: PostgresStore, n: int) -> list[uuid.UUID]:
    """n jobs running under TOKEN, held by ENGINE; ascending by id. Written in descending order,
    so the table (and the holder index) hold them newest id first, as after a burst's fences."""
    owner = "lk_" + uuid.uuid4().hex[:6]
    await store.create_api_key(owner)
    spec = JobSpec(
        target=WebhookTarget(url="http://127.0.0.1:9/x"),
        schedule=OneOffSchedule(utcnow().replace(year=utcnow().year + 1)),
    )
    ids = [uuid.UUID((await store.create_job(owner, spec))[0].id) for _ in range(n)]
    for job_id in sorted(ids, reverse=True):
        await store.pool_for_shard(0).execute(
            "UPDATE jobs SET phase = 'running', lease_token = $2, claimed_by = $3, "
            "leased_until = now() + interval '1 minute' WHERE job_id = $1",
            job_id,
            TOKEN,
            ENGINE,
        )
    return sorted(ids)


async def _locks_in_id_order(
    dsn: str, ids: list[uuid.UUID], statement: Callable[[list[uuid.UUID]], Awaitable[object]]
) -> list[uuid.UUID]:
    """Run ``statement`` on ``ids`` (descending) while the lowest row is locked elsewhere; returns
    the rows it had locked by the time it waited for that one."""
    lowest, others = ids[0], ids[1:]
    blocker = await asyncpg.connect(dsn)
    probe = await asyncpg.connect(dsn)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT 1 FROM jobs WHERE job_id = $1 FOR UPDATE", lowest)
        task = asyncio.ensure_future(statement(sorted(ids, reverse=True)))
        # Until the statement waits for the blocker's lock (no wall-clock margin involved).
        await wait_until_blocked(probe, task)
        assert not task.done(), "the statement did not wait for the locked row"
        held = await rows_held(probe, others)
        await tx.rollback()
        await asyncio.wait_for(task, timeout=60)
        return held
    finally:
        await blocker.close()
        await probe.close()


async def test_take_runs_locks_in_job_id_order(store: PostgresStore, pg_dsn: str) -> None:
    ids = await _running_jobs(store, 3)

    async def take(batch: list[uuid.UUID]) -> object:
        return await store.take_runs(
            [PublishedRun(j, 0, TOKEN, ENGINE) for j in batch], holder="w", lease_s=30
        )

    assert await _locks_in_id_order(pg_dsn, ids, take) == []


async def test_extend_published_locks_in_job_id_order(store: PostgresStore, pg_dsn: str) -> None:
    ids = await _running_jobs(store, 3)

    async def extend(batch: list[uuid.UUID]) -> object:
        return await store.extend_published([Lease(j, 0, TOKEN) for j in batch], holder=ENGINE, lease_s=30)

    assert await _locks_in_id_order(pg_dsn, ids, extend) == []


async def test_extend_leases_locks_in_job_id_order(store: PostgresStore, pg_dsn: str) -> None:
    ids = await _running_jobs(store, 3)

    async def extend(batch: list[uuid.UUID]) -> object:
        return await store.extend_leases([Lease(j, 0, TOKEN) for j in batch], lease_s=30)

    assert await _locks_in_id_order(pg_dsn, ids, extend) == []


async def _claimed_jobs(store: PostgresStore, n: int) -> list[Claim]:
    """n jobs claimed under TOKEN by ENGINE, as the fence and a release find them; ascending by id."""
    ids = await _running_jobs(store, n)
    await store.pool_for_shard(0).execute(
        "UPDATE jobs SET phase = 'claimed' WHERE job_id = ANY($1::uuid[])", ids
    )
    now = utcnow()
    return [Claim(j, 0, TOKEN, now, now, 0, "scheduled", now) for j in ids]


async def test_fence_runs_locks_in_job_id_order(store: PostgresStore, pg_dsn: str) -> None:
    """The fence's lock is a one-time gate before the update (not a join the planner rescans per
    row): the whole batch is still locked in id order before any row is written."""
    claims = await _claimed_jobs(store, 3)
    by_id = {c.job_id: c for c in claims}

    async def fence(batch: list[uuid.UUID]) -> object:
        fenced = await store.fence_runs([by_id[j] for j in batch], lease_s=30)
        assert sorted(f.job_id for f in fenced) == sorted(batch)  # the gate lets every row through
        return fenced

    assert await _locks_in_id_order(pg_dsn, [c.job_id for c in claims], fence) == []


async def test_release_claims_locks_in_job_id_order(store: PostgresStore, pg_dsn: str) -> None:
    claims = await _claimed_jobs(store, 3)

    async def release(batch: list[uuid.UUID]) -> object:
        assert await store.release_claims([Lease(j, 0, TOKEN) for j in batch]) == len(batch)
        return None

    assert await _locks_in_id_order(pg_dsn, [c.job_id for c in claims], release) == []
