"""A call that hangs where no timeout notices must not hold a worker forever."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from duetime.core.model import JobSpec, OneOffSchedule, Outcome, WebhookTarget
from duetime.core.runpath import AttemptReport, Delivery, FencedRun, RunSpec, Verdict
from duetime.core.ssrf import AddressPolicy
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from duetime.workers.dispatch import CallResult, Dispatcher
from duetime.workers.http1 import Answer, Endpoint
from duetime.workers.pool import WorkerPool
from duetime.workers.webhook import Started


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


class BeginHangsDispatcher(Dispatcher):
    """Calls in a task answer at once; calls started without a task (``begin``) never answer:
    a client that loses a request where no timeout of its own notices."""

    def __init__(self) -> None:
        super().__init__(policy=AddressPolicy(), nats_url=None, redis_url=None)
        self.begun = 0

    async def call(self, d: Delivery) -> CallResult:
        now = self.now()
        return CallResult(Verdict(Outcome.SUCCEEDED, False, 200), now, now)

    def begin(self, d: Delivery, now: datetime) -> Verdict | Started:
        self.begun += 1
        target = d.target
        assert isinstance(target, WebhookTarget)
        never: asyncio.Future[Answer | Verdict] = asyncio.get_running_loop().create_future()
        endpoint = Endpoint(tls=True, host="example.com", port=443, authority="example.com", target="/h")
        return Started(never, target.timeout_s, endpoint, "example.com")


async def test_a_call_started_without_a_task_is_recorded_as_timed_out_by_the_watchdog(
    store: PostgresStore,
) -> None:
    """The pool starts webhook calls without a task once the owner's secrets are cached (the
    first call reads them in a task); the watchdog covers those calls too."""
    owner = "wd_" + uuid.uuid4().hex[:6]
    await store.create_api_key(owner)
    now = datetime.now(UTC)
    spec = JobSpec(
        target=WebhookTarget(url="https://example.com/h", timeout_s=1), schedule=OneOffSchedule(now)
    )
    recorded: list[AttemptReport] = []
    more = asyncio.Event()

    def on_recorded(reports: list[AttemptReport]) -> None:
        recorded.extend(reports)
        more.set()

    queue = InProcessRunQueue()
    dispatcher = BeginHangsDispatcher()
    pool = WorkerPool(
        store,
        queue,
        dispatcher,
        LeaseKeeper(store, lease_s=30, heartbeat_s=10),
        watchdog_s=0.2,
        on_recorded=on_recorded,
    )
    await dispatcher.start()
    pool.start()
    try:
        started = time.monotonic()
        for i in range(2):
            await queue.put(
                FencedRun(
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
            )
            async with asyncio.timeout(15):
                while len(recorded) <= i:
                    more.clear()
                    await more.wait()
        took = time.monotonic() - started
    finally:
        await pool.stop(1.0)
        await dispatcher.close()
    assert dispatcher.begun == 1
    first, second = recorded
    assert first.outcome is Outcome.SUCCEEDED
    assert second.outcome is Outcome.TIMED_OUT and second.retryable
    assert "watchdog" in (second.error or "")
    assert 1.0 <= took < 10.0
