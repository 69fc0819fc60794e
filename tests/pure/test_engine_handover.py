"""``Engine.serve`` over the in-memory store: a shard dealt away stops being claimed and its
unfired claims are given back (claimable by another engine at once); a shard dealt in is claimed
within a poll; the claims of the shards kept stay where they are."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from duetime.core.ids import shard_of
from duetime.core.model import JobSpec, OneOffSchedule, WebhookTarget
from duetime.engine.service import Engine, EngineConfig
from duetime.runqueue import wire
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.memory import MemoryStore
from tests.support.wait import until


def _spec(at: datetime) -> JobSpec:
    return JobSpec(target=WebhookTarget(url="https://example.com/hook"), schedule=OneOffSchedule(run_at=at))


async def test_a_lost_shard_is_given_back_and_a_gained_one_claimed() -> None:
    store = MemoryStore()
    due = datetime.now(UTC) + timedelta(seconds=30)  # claimed into the wheel, never fired here
    jobs: dict[int, set[uuid.UUID]] = {s: set() for s in range(16)}
    for _ in range(320):
        job, _ = await store.create_job("alice", _spec(due))
        jobs[shard_of(uuid.UUID(job.id))].add(uuid.UUID(job.id))
    engine = Engine(
        store,
        InProcessRunQueue(),
        LeaseKeeper(store, lease_s=30, heartbeat_s=10),
        EngineConfig(engine_id="e1", poll_interval_s=0.05),
    )

    def in_wheel() -> set[uuid.UUID]:
        # The wheel's waiting entries, read without draining it (the test looks, it must not move).
        return {wire.unpack_entry(e).job_id for item in engine.wheel._live for e in wire.entries_in(item)}

    def of(shards: range) -> set[uuid.UUID]:
        return {j for s in shards for j in jobs[s]}

    await engine.start(frozenset(range(8)))
    try:
        await until(
            lambda: engine.waiting_runs == len(of(range(8))),
            within=5.0,
            what="shards 0-7 claimed",
            every=0.02,
        )
        before = in_wheel()
        assert before == of(range(8)), "only the shards it serves"
        await engine.serve(frozenset(range(4, 12)))
        assert engine.serving == frozenset(range(4, 12))
        assert not in_wheel() & of(range(4)), "the lost shards' claims left the wheel"
        await until(
            lambda: in_wheel() == of(range(4, 12)),
            within=5.0,
            what="shards 8-11 claimed within a poll",
            every=0.02,
        )
        # Given back unfired: another engine claims the lost shards' rows at once.
        for shard in range(4):
            rows = await store.claim_due(shard, "e2", lookahead_s=60, lease_s=30, limit=100)
            assert {r.job_id for r in rows} == jobs[shard]
        for shard in range(4, 8):  # kept: still e1's, nothing to claim for e2
            assert await store.claim_due(shard, "e2", lookahead_s=60, lease_s=30, limit=100) == []
    finally:
        await engine.stop()


async def test_fired_runs_not_yet_fenced_of_a_lost_shard_are_given_back_too() -> None:
    """Runs that fired but wait for the fencer (the run queue is full) are unfired claims as well:
    a handover takes them off the fencer's lanes and releases them, as a stop does."""
    store = MemoryStore()
    soon = datetime.now(UTC) + timedelta(milliseconds=300)
    created = [uuid.UUID((await store.create_job("alice", _spec(soon)))[0].id) for _ in range(60)]
    queue = InProcessRunQueue(maxsize=1)  # nobody takes from it: the fencer blocks on the second
    engine = Engine(
        store,
        queue,
        LeaseKeeper(store, lease_s=30, heartbeat_s=10),
        EngineConfig(engine_id="e1", poll_interval_s=0.05, fence_batch=1),
    )
    await engine.start()
    try:
        await until(
            lambda: engine.fence_progress >= 2 and engine.waiting_runs == 0,
            within=5.0,
            what="fired, fencer blocked",
            every=0.02,
        )
        waiting = engine._fired_count
        assert waiting >= len(created) - 2, "the rest wait on the fencer's lanes"
        await engine.serve(frozenset())
        assert engine._fired_count == 0 and not engine._lanes, "the lanes were emptied"
        claimable = 0
        for shard in range(16):
            claimable += len(await store.claim_due(shard, "e2", lookahead_s=60, lease_s=30, limit=100))
        assert claimable == waiting, "each waiting run given back, claimable by another engine"
    finally:
        taker = asyncio.create_task(_take_all(queue))  # lets the blocked fencer finish for stop()
        await engine.stop()
        taker.cancel()


async def _take_all(queue: InProcessRunQueue) -> None:
    while True:
        await queue.get()
