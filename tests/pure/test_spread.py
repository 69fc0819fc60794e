"""Stable spread (``spread_s``): one fixed offset per job, from its id, in ``[0, spread_s)``.

It is stable (the same for every occurrence, every process, every release: the derivation is
published, and pinned here), within its bounds, even across ids, and it moves everything that
asks when an occurrence is due: the row's ``next_run_at`` (``core.lifecycle``), the misfire
policy's view of what is already due (``core.misfire``), and the engine's firing."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from duetime.core import codec
from duetime.core.ids import shard_of
from duetime.core.jitter import due_at, jitter_ms, spread, spread_ms
from duetime.core.lifecycle import RowPlan, after_attempt, initial_plan
from duetime.core.misfire import CatchUp, FireNow, SkipTo, decide
from duetime.core.model import (
    Broker,
    CronSchedule,
    JobSpec,
    JobState,
    Misfire,
    OneOffSchedule,
    Outcome,
    Overlap,
    QueueTarget,
    Schedule,
)
from duetime.core.schedule import occurrences
from duetime.core.spectext import spec_from_text
from duetime.engine.service import Engine, EngineConfig
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.memory import MemoryStore
from duetime.storage.registry_rules import timing_changed

TARGET = QueueTarget(broker=Broker.REDIS, topic="spread")
HOURLY = CronSchedule(cron="0 * * * *")
PINNED = uuid.UUID("0190a3c4-5b6d-7e8f-9a0b-1c2d3e4f5a6b")
ids = st.builds(uuid.UUID, int=st.integers(0, 2**128 - 1))


def spec(schedule: Schedule = HOURLY, **kw: Any) -> JobSpec:
    return JobSpec(target=TARGET, schedule=schedule, **kw)


def test_the_derivation_is_pinned() -> None:
    """docs/scheduling.md publishes it: BLAKE2b-64 of the id's 16 bytes, personalised
    ``duetime-spread``, read as a fraction of 2**64 of the window. A change moves every job."""
    assert spread_ms(PINNED, 3600) == 266_772
    assert spread_ms(PINNED, 60) == 4_446
    assert spread_ms(PINNED, 0) == 0


@given(job_id=ids, spread_s=st.integers(0, 3600))
def test_within_its_window_and_the_same_every_time(job_id: uuid.UUID, spread_s: int) -> None:
    offset = spread_ms(job_id, spread_s)
    assert offset == spread_ms(job_id, spread_s)
    assert offset == 0 if spread_s == 0 else 0 <= offset < spread_s * 1000


@given(job_id=ids, spread_s=st.integers(1, 1800))
def test_a_job_keeps_its_place_when_the_window_is_resized(job_id: uuid.UUID, spread_s: int) -> None:
    assert spread_ms(job_id, 2 * spread_s) - 2 * spread_ms(job_id, spread_s) in (0, 1)


def test_ids_land_evenly_over_the_window() -> None:
    """100 000 ids over an hour, by minute: each minute within 10 % of its share (one standard
    deviation is 2.4 %), so a thousand jobs on one round time become ~17 a minute."""
    rng = random.Random(31)
    minutes = Counter(spread_ms(uuid.UUID(int=rng.getrandbits(128)), 3600) // 60_000 for _ in range(100_000))
    share = 100_000 / 60
    assert set(minutes) == set(range(60))
    assert all(abs(count - share) < 0.1 * share for count in minutes.values()), minutes


def test_shard_and_spread_are_independent() -> None:
    rng = random.Random(7)
    by_shard: dict[int, list[int]] = {}
    for _ in range(32_000):
        job_id = uuid.UUID(int=rng.getrandbits(128))
        by_shard.setdefault(shard_of(job_id), []).append(spread_ms(job_id, 3600))
    for offsets in by_shard.values():
        mean_minutes = sum(offsets) / len(offsets) / 60_000
        assert 28 < mean_minutes < 32, mean_minutes  # 30 expected, standard deviation about 0.4


@given(job_id=ids, spread_s=st.integers(0, 3600), jitter_s=st.integers(0, 60))
def test_every_occurrence_is_due_at_the_same_offset_plus_its_jitter(
    job_id: uuid.UUID, spread_s: int, jitter_s: int
) -> None:
    job = spec(spread_s=spread_s, jitter_s=jitter_s)
    fixed = timedelta(milliseconds=spread_ms(job_id, spread_s))
    for occurrence in occurrences(HOURLY, datetime(2026, 3, 1, tzinfo=UTC), 5):
        delay = due_at(job_id, occurrence, job) - occurrence - fixed
        assert delay == timedelta(milliseconds=jitter_ms(job_id, occurrence, jitter_s))
        assert timedelta(0) <= delay <= timedelta(seconds=jitter_s)


# -- the row's first occurrence -------------------------------------------------------------------


@given(job_id=ids, minute=st.integers(0, 59), second=st.integers(0, 59))
def test_a_new_job_is_due_at_its_first_spread_time_after_creation(
    job_id: uuid.UUID, minute: int, second: int
) -> None:
    """An hourly job's timeline is its schedule moved by its offset: created at 10:mm:ss, it is
    due at the first hh:00 + offset after that, never more than an hour away."""
    job = spec(spread_s=3600)
    now = datetime(2026, 3, 1, 10, minute, second, tzinfo=UTC)
    plan = initial_plan(job_id, job, now)
    assert plan.next_run_at is not None and plan.scheduled_for is not None
    assert plan.next_run_at - plan.scheduled_for == spread(job_id, job)
    assert plan.scheduled_for.minute == plan.scheduled_for.second == 0
    assert now < plan.next_run_at <= now + timedelta(hours=1)


def test_a_one_off_is_moved_too_and_a_past_one_still_runs_at_once() -> None:
    job_id = PINNED
    at = datetime(2026, 3, 1, 12, tzinfo=UTC)
    job = spec(schedule=OneOffSchedule(run_at=at), spread_s=3600)
    assert initial_plan(job_id, job, at - timedelta(days=1)).next_run_at == at + spread(job_id, job)
    later = at + timedelta(hours=2)
    assert initial_plan(job_id, job, later).next_run_at == later


# -- misfire: what is already due --------------------------------------------------------------------


def test_a_catch_up_does_not_start_an_occurrence_before_its_spread_time() -> None:
    """Hourly, 50 minutes' offset, down from 10:00 to 12:20: 10:00 and 11:00 (due 10:50 and
    11:50) are due; 12:00 is due at 12:50, so it is the row's next, not a catch-up run at 12:20."""
    job = spec(misfire=Misfire.RUN_ALL, misfire_grace_s=60)
    offset = timedelta(minutes=50)
    t10 = datetime(2026, 3, 1, 10, tzinfo=UTC)
    now = t10 + timedelta(hours=2, minutes=20)
    decision = decide(job, t10, now, due_at=t10 + offset, spread=offset)
    assert isinstance(decision, CatchUp)
    assert decision.runs == (t10, t10 + timedelta(hours=1))
    assert decision.next_scheduled_for == t10 + timedelta(hours=2)
    # Without the spread every occurrence up to now was due: the old reading, which fired early.
    unspread = decide(job, t10, now, due_at=t10 + offset)
    assert isinstance(unspread, CatchUp) and unspread.runs[-1] == t10 + timedelta(hours=2)


def test_run_once_and_skip_read_the_clock_the_spread_earlier() -> None:
    offset = timedelta(minutes=50)
    t10 = datetime(2026, 3, 1, 10, tzinfo=UTC)
    now = t10 + timedelta(hours=2, minutes=20)
    once = decide(spec(misfire=Misfire.RUN_ONCE), t10, now, due_at=t10 + offset, spread=offset)
    assert once == FireNow(t10 + timedelta(hours=1))
    skip = decide(spec(misfire=Misfire.SKIP), t10, now, due_at=t10 + offset, spread=offset)
    assert skip == SkipTo((t10, t10 + timedelta(hours=1)), t10 + timedelta(hours=2))


def test_overlap_skip_counts_occurrences_due_at_their_spread_time() -> None:
    """overlap=skip after a long run: only occurrences whose spread time has passed were missed."""
    job_id = PINNED
    job = spec(overlap=Overlap.SKIP, spread_s=3600)
    offset = spread(job_id, job)
    assert offset == timedelta(seconds=266.772)
    t10 = datetime(2026, 3, 1, 10, tzinfo=UTC)
    plan = RowPlan(JobState.SCHEDULED, t10 + offset, t10, 1)
    now = t10 + timedelta(hours=2, minutes=2)  # 11:00 came due at 11:04:26.772, 12:00 comes at 12:04
    nxt = after_attempt(job_id, job, plan, attempt=1, outcome=Outcome.SUCCEEDED, retryable=False, now=now)
    assert nxt.overlap_skipped == (t10 + timedelta(hours=1),)
    assert (nxt.scheduled_for, nxt.next_run_at) == (
        t10 + timedelta(hours=2),
        t10 + timedelta(hours=2) + offset,
    )


# -- firing ----------------------------------------------------------------------------------------


async def test_the_engine_fires_at_the_spread_time_with_the_nominal_scheduled_for() -> None:
    store = MemoryStore()
    job = spec(schedule=CronSchedule(cron="* * * * * *"), spread_s=2)
    made, _ = await store.create_job("alice", job)
    jid = uuid.UUID(made.id)
    offset = spread(jid, job)
    queue = InProcessRunQueue()
    keeper = LeaseKeeper(store, lease_s=30, heartbeat_s=10)
    engine = Engine(
        store, queue, keeper, EngineConfig(engine_id="e1", shards=(shard_of(jid),), poll_interval_s=0.05)
    )
    await engine.start()
    try:
        run = await asyncio.wait_for(queue.get(), timeout=10)
        fired = datetime.now(UTC)
        assert run.scheduled_for.microsecond == 0, "Duetime-Scheduled-For stays the nominal second"
        assert run.due_at == run.scheduled_for + offset
        assert fired >= run.due_at, "fired at its spread time, not before"
    finally:
        await engine.stop()


def test_a_spec_stored_before_spread_s_reads_as_zero() -> None:
    """Specs are stored as JSON; one written before spread_s existed has no such key. It decodes
    as 0, and an update that only adds ``spread_s: 0`` does not restart the job's timing."""
    old = {"schedule": {"cron": "0 * * * *", "timezone": "UTC"}, "jitter_s": 0}
    assert not timing_changed(old, {**old, "spread_s": 0})
    assert timing_changed(old, {**old, "spread_s": 60})
    assert timing_changed({**old, "spread_s": 60}, {**old, "spread_s": 61})
    stored = codec.spec_to_json(spec())
    del stored["spread_s"]
    assert codec.spec_from_json(stored).spread_s == 0
    assert spec_from_text(json.dumps(stored)).spread_s == 0
