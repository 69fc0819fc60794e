"""Bundles: a claim batch's runs due at one millisecond for one owner travel as one wheel item.

What must hold: every run comes out once, in the order it would have fired unbundled; a bundle
answers for its runs' shard and owner lane; the fencer can take part of one; and a burst waiting
in an engine is held in a few objects, not one per run (the point: see ``runqueue.wire``)."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core.model import Broker, JobSpec, OneOffSchedule, QueueTarget
from duetime.engine.service import Engine, EngineConfig
from duetime.engine.wheel import TimerWheel
from duetime.runqueue import wire
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.memory import MemoryStore
from tests.support.memory_burst import burst_node

T0 = 1_790_000_000_000


def _entry(due_ms: int, lane: int, shard: int = 3) -> bytes:
    return wire.pack_entry(due_ms, uuid.uuid4(), random.randrange(1, 2**40), datetime.now(UTC), shard, lane)


def _batch(draw_dues: list[int], draw_lanes: list[int]) -> list[bytes]:
    return [_entry(T0 + d, lane) for d, lane in zip(draw_dues, draw_lanes, strict=True)]


_batches = st.integers(1, 300).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 3), min_size=n, max_size=n),
        st.lists(st.integers(0, 2), min_size=n, max_size=n),
    )
)


def _by_lane(fired: list[bytes]) -> tuple[dict[int, list[bytes]], list[int]]:
    """What the fencer sees of a fire: each owner lane's runs in order, and the order in which
    the lanes first appear (their turns); the interleaving across lanes is the fencer's."""
    lanes: dict[int, list[bytes]] = {}
    for e in fired:
        lanes.setdefault(wire.entry_lane(e), []).append(e)
    return lanes, list(lanes)


@settings(max_examples=150, deadline=None)
@given(_batches)
def test_a_bundled_batch_fires_every_run_once_in_the_unbundled_order(
    batch_spec: tuple[list[int], list[int]],
) -> None:
    entries = _batch(*batch_spec)
    items = wire.bundle(entries)
    assert sum(map(wire.runs_in, items)) == len(entries)
    plain, bundled = TimerWheel(T0 - 10), TimerWheel(T0 - 10)
    plain.insert_many(entries)
    bundled.insert_many(items)
    for now in (T0, T0 + 1, T0 + 2, T0 + 10):  # instant by instant, as the driver fires them
        fired_plain = plain.expire(now)
        fired_bundled = [e for item in bundled.expire(now) for e in wire.entries_in(item)]
        assert _by_lane(fired_bundled) == _by_lane(fired_plain)
        assert sorted(fired_bundled) == sorted(fired_plain)


def test_a_bundle_is_its_runs_shard_and_lane_and_lone_runs_stay_plain() -> None:
    same = [_entry(T0, lane=7, shard=11) for _ in range(5)]
    lone = _entry(T0 + 1, lane=7, shard=11)
    other_lane = _entry(T0, lane=8, shard=11)
    items = wire.bundle([*same, lone, other_lane])
    assert items[1:] == [lone, other_lane]  # alone at its instant or lane: itself
    (b,) = items[:1]
    assert wire.runs_in(b) == 5 and wire.entries_in(b) == same
    assert wire.entry_due_ms(b) == T0
    assert wire.entry_lane(b) == 7 and wire.entry_shard(b) == 11
    assert wire.runs_in(lone) == 1 and wire.entries_in(lone) == [lone]
    assert wire.entry_lane(lone) == 7 and wire.entry_shard(lone) == 11


def test_taking_part_of_a_bundle_leaves_the_rest_in_order() -> None:
    runs = [_entry(T0, lane=1) for _ in range(6)]
    (b,) = wire.bundle(runs)
    head, rest = wire.take_from(b, 2)
    assert head == runs[:2] and rest is not None and wire.entries_in(rest) == runs[2:]
    assert wire.entry_due_ms(rest) == T0
    head, last = wire.take_from(rest, 3)
    assert head == runs[2:5] and last == runs[5]  # one left: a plain entry again
    assert wire.take_from(last, 10) == ([runs[5]], None)


def test_bundles_are_capped() -> None:
    runs = [_entry(T0, lane=1) for _ in range(wire.BUNDLE_MAX + 1)]
    items = wire.bundle(runs)
    assert [wire.runs_in(i) for i in items] == [wire.BUNDLE_MAX, 1]
    assert [e for i in items for e in wire.entries_in(i)] == runs


async def test_a_waiting_burst_is_held_in_a_few_items_and_fenced_run_by_run() -> None:
    """3,000 runs due together wait as a handful of wheel items, fire into the owner lane as
    such, and still reach the run queue one run each, every one of them."""
    runs = 3000
    node = await burst_node(MemoryStore(), runs)
    engine = node.engine
    await engine.start()
    try:
        async with asyncio.timeout(30):
            while engine.waiting_runs < runs:  # noqa: ASYNC110 - claims have no event to wait on
                await asyncio.sleep(0.02)
        assert len(engine.wheel) <= runs // 100, f"{len(engine.wheel)} wheel items for {runs} runs"
        assert engine.held_runs == runs
        taken: set[uuid.UUID] = set()
        async with asyncio.timeout(30):
            while len(taken) < runs:
                run = await node.queue.get()
                taken.add(run.job_id)
        assert len(taken) == runs
        assert engine.waiting_runs == 0
    finally:
        await engine.stop()


def test_a_claim_after_a_gap_is_not_bundled_with_another_instant() -> None:
    a = [_entry(T0, 1) for _ in range(3)]
    b = [_entry(T0 + 1, 1) for _ in range(3)]
    items = wire.bundle([a[0], b[0], a[1], b[1], a[2], b[2]])
    assert [wire.entries_in(i) for i in items] == [a, b]
    assert datetime.fromtimestamp(wire.entry_due_ms(items[1]) / 1000, UTC) - datetime.fromtimestamp(
        wire.entry_due_ms(items[0]) / 1000, UTC
    ) == timedelta(milliseconds=1)


async def test_a_stop_gives_back_every_run_of_every_bundle() -> None:
    """A stop releases what has not fired: each run of each bundle, claimable by another engine."""
    store = MemoryStore()
    due = datetime.now(UTC) + timedelta(seconds=30)  # claimed, never fired here
    spec = JobSpec(target=QueueTarget(broker=Broker.REDIS, topic="t"), schedule=OneOffSchedule(run_at=due))
    for owner in ("alice", "bob"):
        for _ in range(400):
            await store.create_job(owner, spec)
    keeper = LeaseKeeper(store, lease_s=30, heartbeat_s=10)
    engine = Engine(store, InProcessRunQueue(), keeper, EngineConfig(engine_id="e1", poll_interval_s=0.05))
    await engine.start()
    try:
        async with asyncio.timeout(30):
            while engine.waiting_runs < 800:  # noqa: ASYNC110 - claims have no event to wait on
                await asyncio.sleep(0.02)
        assert len(engine.wheel) < 800 // 10
    finally:
        await engine.stop()
    assert engine.held_runs == 0
    claimable = 0
    for shard in range(16):
        claimable += len(await store.claim_due(shard, "e2", lookahead_s=60, lease_s=30, limit=1000))
    assert claimable == 800
