"""After a burst drains, a node keeps none of its runs: the engine over the in-memory store, the
worker pool on its Redis batch path (a stub broker), and a thousand workers.

Each idle worker used to keep the runs, reports and batch of its last iteration alive in its
coroutine's frame while it waited for the next run: up to 500 fenced runs (spec, parsed spec,
deliveries, reports) per worker, a thousand workers, so half a million runs of a node after a
million-run burst, never freed (issue 16: RSS 1.25 GB per node). The fencer's last batch and each
completion writer's last batch were kept the same way."""

from __future__ import annotations

import asyncio
import gc
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from duetime.core.model import Broker, JobSpec, OneOffSchedule, Outcome, QueueTarget
from duetime.core.runpath import AttemptReport, Delivery, FencedRun, Verdict
from duetime.engine.service import Engine, EngineConfig
from duetime.runqueue import metrics
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.memory import MemoryStore
from duetime.workers.pool import WorkerPool

RUNS = 3000


@dataclass
class _Sent:
    started_at: datetime
    finished_at: datetime
    verdicts: list[Verdict]


class _RedisThatSucceeds:
    """The dispatcher's Redis batch path, answering every XADD with success after a moment."""

    broker_timeout_s = 10.0

    async def deliver_redis_many(self, deliveries: list[Delivery]) -> _Sent:
        started = datetime.now(UTC)
        await asyncio.sleep(0.001)
        return _Sent(started, datetime.now(UTC), [Verdict(Outcome.SUCCEEDED, False, None)] * len(deliveries))


def _alive(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, kind))


async def test_no_run_or_report_stays_alive_once_a_burst_is_recorded() -> None:
    store = MemoryStore()
    due = datetime.now(UTC) + timedelta(seconds=1)
    spec = JobSpec(
        target=QueueTarget(broker=Broker.REDIS, topic="burst"), schedule=OneOffSchedule(run_at=due)
    )
    for _ in range(RUNS):
        await store.create_job("alice", spec)
    queue = InProcessRunQueue()
    keeper = LeaseKeeper(store, lease_s=30, heartbeat_s=10)
    pool = WorkerPool(store, queue, _RedisThatSucceeds(), keeper, concurrency=1024)  # type: ignore[arg-type]
    engine = Engine(
        store, queue, keeper, EngineConfig(engine_id="e1", shards=tuple(range(16)), poll_interval_s=0.05)
    )
    before = _completions()
    pool.start()
    await engine.start()
    try:
        async with asyncio.timeout(60):
            # polled: the pool offers no event for "recorded" (ASYNC110)
            while _completions() - before < RUNS:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            while len(keeper):  # noqa: ASYNC110 - the last batch's leases go once it is recorded
                await asyncio.sleep(0.05)
        assert not queue.qsize()
        assert _alive(FencedRun) == 0, "fenced runs kept alive after their outcomes were recorded"
        assert _alive(AttemptReport) == 0, "reports kept alive after they were recorded"
    finally:
        await engine.stop()
        await pool.stop(5)


def _completions() -> float:
    """Outcomes recorded by the completer so far (a process-wide counter)."""
    return sum(s.value for m in metrics.COMPLETIONS.collect() for s in m.samples if s.name.endswith("_total"))
