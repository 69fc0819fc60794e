"""Flow control under real concurrency on PostgreSQL: workers asking at the same moment, through
two stores (two pools, as two processes would), never start more calls of a key than its
parallelism, and keys asked in opposite orders never deadlock.

A worker's calls in flight are at most the slots its holder row says (it starts calls only after
a grant, and a finished call frees its slot only at its next ask), so the calls in flight across
workers, counted here as they start and end, stay within the parallelism exactly when the store's
grants do.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator

import pytest

from duetime.storage.ports import FlowAsk
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap

FAST = 10000.0  # the rate never limits here: parallelism is what is tested


@pytest.fixture(scope="module")
async def stores(pg_dsn: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    first = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=4)
    second = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=4)
    yield first, second
    await first.close()
    await second.close()


def owner() -> str:
    return "flow-" + uuid.uuid4().hex[:10]


async def test_many_workers_asking_at_once_get_exactly_the_parallelism(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    o, parallelism = owner(), 7
    one = FlowAsk(owner=o, key="api", rate_per_s=FAST, parallelism=parallelism, want=1, running=0)
    grants = await asyncio.gather(*(stores[i % 2].take_flow(f"w{i}", [one], hold_s=30) for i in range(60)))
    assert sum(g.granted for [g] in grants) == parallelism


class Worker:
    """A worker's flow loop in miniature: ask for what it could start, start what it is granted,
    each call ending a moment later; report its running calls with every ask."""

    def __init__(self, name: str, store: PostgresStore, keys: list[str], in_flight: dict[str, int]) -> None:
        self.name, self.store, self.keys = name, store, keys
        self.running = dict.fromkeys(keys, 0)
        self.in_flight = in_flight  # across all workers, per key
        self.peak = dict.fromkeys(keys, 0)
        self.started = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def call(self, key: str) -> None:
        await asyncio.sleep(random.uniform(0.0, 0.03))
        self.running[key] -= 1
        self.in_flight[key] -= 1

    async def run(self, owner: str, parallelism: int, rounds: int) -> None:
        for _ in range(rounds):
            asks = [
                FlowAsk(owner, key, FAST, parallelism, want=random.randint(0, 4), running=self.running[key])
                for key in self.keys
            ]
            for grant in await self.store.take_flow(self.name, asks, hold_s=30):
                for _ in range(grant.granted):
                    self.running[grant.key] += 1
                    self.in_flight[grant.key] += 1
                    self.peak[grant.key] = max(self.peak[grant.key], self.in_flight[grant.key])
                    self.started += 1
                    task = asyncio.create_task(self.call(grant.key))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
            await asyncio.sleep(random.uniform(0.0, 0.005))
        await asyncio.gather(*self.tasks)
        await self.store.take_flow(
            self.name, [FlowAsk(owner, key, FAST, parallelism, 0, 0) for key in self.keys], hold_s=30
        )


async def test_two_workers_never_exceed_the_parallelism_and_never_deadlock(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    o, parallelism, keys = owner(), 3, ["a", "b", "c", "d"]
    in_flight = dict.fromkeys(keys, 0)
    # Two workers per store; half ask for the keys in the opposite order.
    workers = [Worker(f"w{i}", stores[i % 2], keys if i < 2 else keys[::-1], in_flight) for i in range(4)]
    await asyncio.gather(*(w.run(o, parallelism, rounds=60) for w in workers))
    peaks = {key: max(w.peak[key] for w in workers) for key in keys}
    assert all(peak <= parallelism for peak in peaks.values()), peaks
    assert max(peaks.values()) == parallelism, peaks  # the limit was reached: the case was contended
    assert sum(w.started for w in workers) > 50
    assert in_flight == dict.fromkeys(keys, 0)
    # every worker gave its slots back: the next worker gets them all
    fresh = [FlowAsk(o, key, FAST, parallelism, want=parallelism, running=0) for key in keys]
    assert [g.granted for g in await stores[0].take_flow("late", fresh, hold_s=30)] == [parallelism] * 4
