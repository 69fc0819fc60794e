"""A worker that stops while runs wait for their host gives them back unused (issue 28: held runs
use no attempt and move no failure count, a shutdown included)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from duetime.core.ids import shard_of
from duetime.core.model import JobSpec, OneOffSchedule, WebhookTarget
from duetime.core.runpath import Delivery
from duetime.core.ssrf import AddressPolicy
from duetime.core.targethealth import HealthPolicy
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from duetime.workers.dispatch import CallResult, Dispatcher
from duetime.workers.pool import WorkerOptions, WorkerPool
from tests.support.wait import until


class HangingHost(Dispatcher):
    """A host that never answers (its calls end only when the worker gives them up)."""

    def __init__(self) -> None:
        super().__init__(policy=AddressPolicy(), nats_url=None, redis_url=None, host_concurrency=1)
        self.called: list[uuid.UUID] = []

    async def call(self, d: Delivery) -> CallResult:
        self.called.append(uuid.UUID(d.job_id))
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=2)
    yield s
    await s.close()


async def test_runs_waiting_for_their_host_at_shutdown_are_given_back_unused(store: PostgresStore) -> None:
    owner = "sd_" + uuid.uuid4().hex[:6]
    await store.create_api_key(owner)
    due = datetime.now(UTC) + timedelta(seconds=1)
    spec = JobSpec(
        target=WebhookTarget(url="https://example.com/h", timeout_s=30), schedule=OneOffSchedule(due)
    )
    ids = [uuid.UUID((await store.create_job(owner, spec))[0].id) for _ in range(5)]
    await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()))
    claims = [
        c
        for shard in sorted({shard_of(i) for i in ids})
        for c in await store.claim_due(shard, "e1", lookahead_s=60, lease_s=60, limit=100)
        if c.job_id in set(ids)
    ]
    runs = await store.fence_runs(claims, lease_s=60)
    assert len(runs) == 5
    queue = InProcessRunQueue()
    host = HangingHost()
    keeper = LeaseKeeper(store, lease_s=60, heartbeat_s=20)
    pool = WorkerPool(store, queue, host, keeper, options=WorkerOptions(health=HealthPolicy(max_limit=1)))
    await host.start()
    pool.start()
    try:
        for run in runs:
            keeper.track(run)
            await queue.put(run)
        await until(
            lambda: bool(host.called) and pool.queues.waiting == 4,
            within=10,
            what="one call in flight to the host, four runs waiting for it",
        )
    finally:
        await pool.stop(0.2)
        await host.close()
    [called] = host.called
    for jid in ids:
        runs_of = (await store.list_runs(owner, jid, limit=10, cursor=None)).items
        assert runs_of == [], "no attempt recorded for any of them"
    again = {
        c.job_id: c
        for shard in sorted({shard_of(i) for i in ids})
        for c in await store.claim_due(shard, "e2", lookahead_s=60, lease_s=60, limit=100)
        if c.job_id in set(ids)
    }
    assert set(again) == set(ids) - {called}, "the four that waited are claimable at once, unused"
    assert all(c.attempt == 0 for c in again.values())
