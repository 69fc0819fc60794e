"""How long a claim lasts beyond its lease: the fencer's time for what the engine already holds."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from duetime.engine.clock import FakeClock
from duetime.engine.service import Engine, EngineConfig
from duetime.runqueue import wire
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.memory import MemoryStore

T = datetime(2026, 12, 1, tzinfo=UTC)


def _engine(held: int) -> Engine:
    config = EngineConfig(engine_id="t", lease_s=30)
    store = MemoryStore()
    keeper = LeaseKeeper(store, lease_s=30, heartbeat_s=10)
    engine = Engine(store, InProcessRunQueue(), keeper, config, clock=FakeClock(0))
    engine._queue_fired([wire.pack_entry(0, uuid.uuid4(), 1, T, 0) for _ in range(held)])
    return engine


def test_nothing_held_means_no_slack() -> None:
    assert _engine(0)._claim_slack_s() == 0.0


def test_a_burst_behind_the_claim_adds_the_fencers_time_up_to_three_leases() -> None:
    engine = _engine(40_000)
    assert engine._claim_slack_s() == 20.0  # 2,000 runs/s before any fence statement
    engine.fence_progress, engine.fence_time_s = 10_000, 1.0  # the fencer's capacity: 10,000/s
    assert engine._claim_slack_s() == 4.0
    engine.fence_time_s = 100.0  # 100/s: capped
    assert engine._claim_slack_s() == 90.0


def test_steady_operation_keeps_the_slack_small_whatever_the_throughput() -> None:
    """Regression guard: a throughput-based rate (low when little is due) would have given every
    claim of a steadily busy engine a minute or more of slack, and delayed the rescue of a dead
    engine's claims by as much. The capacity of the fence statements does not depend on load."""
    engine = _engine(6_000)  # a minute of 100 runs/s in the wheel
    engine.fence_progress, engine.fence_time_s = 6_000, 1.2  # 6,000 single-run fences of 0.2 ms
    assert engine._claim_slack_s() == 1.2
