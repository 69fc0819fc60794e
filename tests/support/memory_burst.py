"""A node over the in-memory store for memory tests: the engine, a thousand workers on the Redis
batch path (a stub broker that answers every XADD with success) and the lease keeper, with a
burst of one-off Redis jobs due a second from now. Shared by the tests that count which runs a
node keeps alive during and after a burst (tests/pure/test_nothing_kept_*.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from duetime.core.model import Broker, JobSpec, OneOffSchedule, Outcome, QueueTarget
from duetime.core.runpath import Delivery, Verdict
from duetime.engine.service import Engine, EngineConfig
from duetime.runqueue import metrics
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.memory import MemoryStore
from duetime.workers.dispatch import Dispatcher
from duetime.workers.pool import WorkerPool


@dataclass
class _Sent:
    started_at: datetime
    finished_at: datetime
    verdicts: list[Verdict]


class RedisThatSucceeds:
    """The dispatcher's Redis batch path, answering every XADD with success after a moment."""

    broker_timeout_s = 10.0
    host_concurrency = 256
    host_rate_per_s = 10000.0
    host_burst = None
    host_of = staticmethod(Dispatcher.host_of)

    async def deliver_redis_many(self, deliveries: list[Delivery]) -> _Sent:
        started = datetime.now(UTC)
        await asyncio.sleep(0.001)
        return _Sent(started, datetime.now(UTC), [Verdict(Outcome.SUCCEEDED, False, None)] * len(deliveries))


@dataclass
class BurstNode:
    queue: InProcessRunQueue
    keeper: LeaseKeeper
    pool: WorkerPool
    engine: Engine
    recorded_before: float = 0.0  # completions() when the node started (see running)


async def burst_node(store: MemoryStore, runs: int) -> BurstNode:
    """``runs`` one-off Redis jobs due in a second, and a node (not started) to fire them."""
    due = datetime.now(UTC) + timedelta(seconds=1)
    spec = JobSpec(
        target=QueueTarget(broker=Broker.REDIS, topic="burst"), schedule=OneOffSchedule(run_at=due)
    )
    for _ in range(runs):
        await store.create_job("alice", spec)
    queue = InProcessRunQueue()
    keeper = LeaseKeeper(store, lease_s=30, heartbeat_s=10)
    pool = WorkerPool(store, queue, RedisThatSucceeds(), keeper, concurrency=1024)  # type: ignore[arg-type]
    engine = Engine(
        store, queue, keeper, EngineConfig(engine_id="e1", shards=tuple(range(16)), poll_interval_s=0.05)
    )
    return BurstNode(queue, keeper, pool, engine)


def completions() -> float:
    """Outcomes recorded by completers so far (a process-wide counter)."""
    return sum(s.value for m in metrics.COMPLETIONS.collect() for s in m.samples if s.name.endswith("_total"))


@contextlib.asynccontextmanager
async def running(node: BurstNode) -> AsyncIterator[BurstNode]:
    """The node's workers and engine started, and stopped again on the way out."""
    node.recorded_before = completions()
    node.pool.start()
    await node.engine.start()
    try:
        yield node
    finally:
        await node.engine.stop()
        await node.pool.stop(5)


async def recorded(
    node: BurstNode, runs: int, *, poll_s: float, timeout_s: float, sample: Callable[[], None] | None = None
) -> None:
    """Return once ``runs`` outcomes were recorded since the node started, polling every
    ``poll_s`` (the pool offers no event for "recorded") and calling ``sample`` after each poll."""
    async with asyncio.timeout(timeout_s):
        while completions() - node.recorded_before < runs:
            await asyncio.sleep(poll_s)
            if sample is not None:
                sample()
