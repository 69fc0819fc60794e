"""Runs to a Redis stream go out in batches, also when the run queue is full.

A worker on the Redis path takes the runs queued behind its own, up to the pool's bound on runs
in flight. A worker that found the bound reached sent its one run alone, and with the run queue
full (the fencer ahead of the target, as at a million-run burst once fences got cheap) the
thousand workers each sending one run at a time was a state the pool stayed in: 8,979 calls for
10,000 runs here (on `main` too), and twice the node's CPU per run at a million (issue 16, ninth
session). Runs now wait in the Redis host's queue and the pump starts them a pipeline at a time
(workers/hostqueues.py)."""

from __future__ import annotations

import asyncio

from duetime.core.runpath import Delivery
from duetime.storage.memory import MemoryStore
from tests.support.memory_burst import RedisThatSucceeds, burst_node, recorded, running

RUNS = 10_000


class _CountedRedis(RedisThatSucceeds):
    def __init__(self) -> None:
        self.sizes: list[int] = []

    async def deliver_redis_many(self, deliveries: list[Delivery]):
        self.sizes.append(len(deliveries))
        await asyncio.sleep(0.005)  # a pipeline's round trip: the calls in flight reach the bound
        return await super().deliver_redis_many(deliveries)


async def test_a_full_run_queue_goes_out_in_batches_not_one_run_at_a_time() -> None:
    node = await burst_node(MemoryStore(), RUNS)
    redis = _CountedRedis()
    node.pool._dispatcher = redis  # type: ignore[assignment]
    in_flight = [0]
    async with running(node):
        await recorded(
            node,
            RUNS,
            poll_s=0.005,
            timeout_s=90,
            sample=lambda: in_flight.append(node.pool.queues.in_flight),
        )
    most_in_flight = max(in_flight)
    assert sum(redis.sizes) == RUNS
    # 20 calls of 500 here; 8,979 before the change
    assert len(redis.sizes) <= RUNS // 100, f"{len(redis.sizes)} calls for {RUNS} runs"
    assert most_in_flight <= 1024  # the pool's bound (2,045 before: a run each past it)
