"""Per-owner fairness: the run queue and the fencer's take give owner lanes equal turns."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from duetime.core.runpath import FencedRun, RunSpec
from duetime.runqueue import wire
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.memory import MemoryStore

T = datetime(2026, 12, 1, tzinfo=UTC)


def run(owner: str) -> FencedRun:
    return FencedRun(
        job_id=uuid.uuid4(),
        shard=0,
        owner=owner,
        lease_token=1,
        scheduled_for=T,
        due_at=T,
        attempt=1,
        spec=RunSpec("{}", 1),
        run_kind="scheduled",
    )


async def test_queue_takes_owners_in_turn_and_fifo_within_an_owner() -> None:
    q = InProcessRunQueue(maxsize=10_000)
    a = [run("a") for _ in range(1000)]
    b = [run("b") for _ in range(3)]
    for r in a:
        await q.put(r)
    for r in b:
        await q.put(r)
    first = [await q.get() for _ in range(6)]
    assert [r.owner for r in first] == ["a", "b", "a", "b", "a", "b"]
    assert [r for r in first if r.owner == "b"] == b
    assert [r for r in first if r.owner == "a"] == a[:3]
    assert q.qsize() == 997


async def test_queue_bound_blocks_the_putter_until_a_get() -> None:
    q = InProcessRunQueue(maxsize=2)
    await q.put(run("a"))
    await q.put(run("a"))
    blocked = asyncio.create_task(q.put(run("b")))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    await q.get()
    await asyncio.wait_for(blocked, 1.0)
    assert q.qsize() == 2


async def test_a_waiting_getter_is_woken_by_a_put() -> None:
    q = InProcessRunQueue(maxsize=10)
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0.01)
    r = run("x")
    await q.put(r)
    assert await asyncio.wait_for(getter, 1.0) is r


def test_entries_carry_the_owner_lane() -> None:
    jid = uuid.uuid4()
    e = wire.pack_entry(123, jid, 7, T, 3, wire.owner_lane("alice"))
    u = wire.unpack_entry(e)
    assert (u.due_ms, u.job_id, u.lease_token, u.scheduled_for, u.shard) == (123, jid, 7, T, 3)
    assert u.lane == wire.entry_lane(e) == wire.owner_lane("alice")
    assert wire.owner_lane("alice") != wire.owner_lane("bob")


async def test_the_fencer_takes_fired_entries_in_owner_turns() -> None:
    from duetime.engine.clock import FakeClock
    from duetime.engine.service import Engine, EngineConfig

    store = MemoryStore()
    keeper = LeaseKeeper(store, lease_s=30, heartbeat_s=10)
    engine = Engine(store, InProcessRunQueue(), keeper, EngineConfig(engine_id="t"), clock=FakeClock(0))
    lane_a, lane_b = wire.owner_lane("a"), wire.owner_lane("b")
    fired = [wire.pack_entry(0, uuid.uuid4(), 1, T, 0, lane_a) for _ in range(10_000)]
    fired += [wire.pack_entry(0, uuid.uuid4(), 1, T, 0, lane_b) for _ in range(300)]
    engine._queue_fired(fired)
    first = engine._take_fair(500)
    lanes = [wire.entry_lane(e) for e in first]
    assert lanes.count(lane_b) == 250 and lanes.count(lane_a) == 250
    second = engine._take_fair(500)
    assert [wire.entry_lane(e) for e in second].count(lane_b) == 50  # the rest of B's, then A's
    assert engine._take_fair(10**6)[-1] == fired[9_999]  # FIFO within a lane, nothing lost
    assert engine._fired_count == 0
