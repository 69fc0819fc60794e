"""A bulk pause, resume or cancel locks each batch's jobs and their occurrence rows together, in job
id order, as the engine's fence does, so the two never wait on each other in a cycle.

Regression: under load, ``tests/faults/test_races.py::test_bulk_pause_and_cancel_racing_the_fire``
got 409 concurrent_update for a bulk pause. The batch locked its jobs in id order first and their
occurrence rows afterwards: holding a later job's row, it waited for an earlier job's occurrence row
(ids are time-ordered, so an occurrence row sorts between its job and the jobs created after it).
An engine's fence holding that occurrence row, and waiting in id order for the later job's row,
closed the cycle and PostgreSQL aborted one side as a deadlock.

Here the earlier job's occurrence row is held elsewhere while the bulk action runs: a batch that
locks in id order holds no row above the one it waits for; the old order held the later job.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from duetime.core.model import Broker, CronSchedule, JobSpec, Overlap, QueueTarget
from duetime.storage.ports import BulkAction, BulkResult
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.support.locks import rows_held, wait_until_blocked


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=2)
    yield s
    await s.close()


def _spec(group: str) -> JobSpec:
    return JobSpec(
        target=QueueTarget(broker=Broker.NATS, topic="bulk-locks.t"),
        # Far in the future: no engine of another test claims these.
        schedule=CronSchedule(cron="0 0 1 1 *"),
        overlap=Overlap.ALLOW,
        labels={"group": group},
    )


async def _families(store: PostgresStore) -> tuple[str, str, uuid.UUID, list[uuid.UUID]]:
    """Two jobs of one owner and label, the first with backfilled occurrence rows created between
    the two; returns the owner, the label, the first job's lowest occurrence row and every row of
    both families."""
    owner = "bl_" + uuid.uuid4().hex[:6]
    group = uuid.uuid4().hex[:8]
    await store.create_api_key(owner)
    first, _ = await store.create_job(owner, _spec(group))
    first_id = uuid.UUID(first.id)
    end = datetime.now(UTC) - timedelta(days=1)
    await store.backfill_job(
        owner, first_id, end - timedelta(days=800), end, max_occurrences=10, pace_per_s=1000.0
    )
    second, _ = await store.create_job(owner, _spec(group))
    second_id = uuid.UUID(second.id)
    pool = store.pool_for_shard(0)
    children = sorted(
        r["job_id"] for r in await pool.fetch("SELECT job_id FROM jobs WHERE parent_id = $1", first_id)
    )
    assert children, "the backfill made occurrence rows"
    # The premise: the occurrence rows sort between the two jobs.
    assert first_id < children[0] < second_id
    return owner, group, children[0], [first_id, *children, second_id]


async def _held_while_waiting(
    dsn: str, blocked: uuid.UUID, family: list[uuid.UUID], action: asyncio.Future[BulkResult]
) -> list[uuid.UUID]:
    """The rows of ``family`` that ``action`` holds once it waits for ``blocked`` (locked by the
    caller's blocker); the action is then let through."""
    probe = await asyncpg.connect(dsn)
    try:
        await wait_until_blocked(probe, action)
        assert not action.done(), "the bulk action did not wait for the locked occurrence row"
        return await rows_held(probe, (job_id for job_id in family if job_id != blocked))
    finally:
        await probe.close()


@pytest.mark.parametrize("action", ["pause", "cancel"])
async def test_a_bulk_batch_locks_jobs_and_occurrences_in_id_order(
    store: PostgresStore, pg_dsn: str, action: BulkAction
) -> None:
    owner, group, blocked, family = await _families(store)
    blocker = await asyncpg.connect(pg_dsn)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT 1 FROM jobs WHERE job_id = $1 FOR UPDATE", blocked)
        task = asyncio.ensure_future(
            store.bulk_action(owner, action, {"group": group}, state=None, max_jobs=100)
        )
        held = await _held_while_waiting(pg_dsn, blocked, family, task)
        await tx.rollback()
        result = await asyncio.wait_for(task, timeout=60)
    finally:
        await blocker.close()
    assert [job_id for job_id in held if job_id > blocked] == [], "a row above the awaited one was held"
    assert (result.matched, result.changed) == (2, 2)
