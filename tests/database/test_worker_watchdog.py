"""A call that hangs where no timeout notices must not hold a worker forever."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from duetime.core.model import JobSpec, OneOffSchedule, Outcome, WebhookTarget
from duetime.core.runpath import Delivery, FencedRun, RunSpec
from duetime.core.ssrf import AddressPolicy
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from duetime.workers.dispatch import CallResult, Dispatcher
from duetime.workers.pool import WorkerPool


class HangingDispatcher(Dispatcher):
    """Stands in for a client library that never answers (not a stand-in for a service)."""

    async def call(self, d: Delivery) -> CallResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=2)
    yield s
    await s.close()


async def test_a_hung_call_is_recorded_as_timed_out_by_the_watchdog(store: PostgresStore) -> None:
    owner = "wd_" + uuid.uuid4().hex[:6]
    await store.create_api_key(owner)
    now = datetime.now(UTC)
    spec = JobSpec(
        target=WebhookTarget(url="https://example.com/h", timeout_s=1), schedule=OneOffSchedule(now)
    )
    run = FencedRun(
        job_id=uuid.uuid4(),
        shard=0,
        owner=owner,
        lease_token=1,
        scheduled_for=now,
        due_at=now,
        attempt=1,
        spec=RunSpec.of(spec),
        run_kind="scheduled",
    )
    pool = WorkerPool(
        store,
        InProcessRunQueue(),
        HangingDispatcher(policy=AddressPolicy(), nats_url=None, redis_url=None),
        LeaseKeeper(store, lease_s=30, heartbeat_s=10),
        watchdog_s=0.2,
    )
    started = time.monotonic()
    report = await asyncio.wait_for(pool.call(run), timeout=10)
    assert report.outcome is Outcome.TIMED_OUT and report.retryable
    assert "watchdog" in (report.error or "")
    assert 1.0 <= time.monotonic() - started < 5.0
