"""The engine over the in-memory store: no database, the same run path. A due job is claimed,
fired at its time, fenced into the run queue; its outcome finishes it; on stop the engine gives
back what it claimed and has not fired."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from duetime.core.ids import shard_of
from duetime.core.model import JobSpec, JobState, Misfire, OneOffSchedule, Outcome, WebhookTarget
from duetime.core.runpath import AttemptReport, Verdict
from duetime.engine.service import Engine, EngineConfig
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.memory import MemoryStore

OWNER = "alice"


def _spec(at: datetime) -> JobSpec:
    return JobSpec(target=WebhookTarget(url="https://example.com/hook"), schedule=OneOffSchedule(run_at=at))


async def test_a_due_job_reaches_the_run_queue_once_and_its_outcome_finishes_it() -> None:
    store = MemoryStore()
    job, _ = await store.create_job(OWNER, _spec(datetime.now(UTC) + timedelta(milliseconds=200)))
    later, _ = await store.create_job(OWNER, _spec(datetime.now(UTC) + timedelta(seconds=30)))
    jid = uuid.UUID(job.id)
    queue = InProcessRunQueue()
    keeper = LeaseKeeper(store, lease_s=30, heartbeat_s=10)
    shards = tuple(sorted({shard_of(jid), shard_of(uuid.UUID(later.id))}))
    engine = Engine(store, queue, keeper, EngineConfig(engine_id="e1", shards=shards, poll_interval_s=0.05))
    await engine.start()
    try:
        run = await asyncio.wait_for(queue.get(), timeout=10)
        assert (run.job_id, run.attempt, run.owner) == (jid, 1, OWNER)
        assert datetime.now(UTC) >= run.due_at, "fired at its due time, not before"
        started = finished = datetime.now(UTC)
        report = AttemptReport(
            run, Verdict(Outcome.SUCCEEDED, False, 200), started_at=started, finished_at=finished
        )
        assert (await store.complete_runs([report])).applied == 1
        assert (await store.complete_runs([replace(report, finished_at=finished)])).stale == 1
        assert (await store.get_job(OWNER, jid)).state is JobState.COMPLETED
        await asyncio.sleep(0.2)
        assert queue.get_nowait() is None, "called once"
    finally:
        await engine.stop()
    # The job due in 30 s sat claimed in the wheel; stopping gave it back, claimable at once.
    rows = await store.claim_due(shard_of(uuid.UUID(later.id)), "e2", lookahead_s=60, lease_s=30, limit=10)
    assert [str(r.job_id) for r in rows] == [later.id]


async def _short_lease_engine(store: MemoryStore, jid: uuid.UUID) -> tuple[Engine, InProcessRunQueue]:
    """A started engine serving ``jid``'s shard with 2 s leases and a janitor every 0.2 s: a claim
    nobody fires would be renewed (or rescued) within the tests' waits."""
    queue = InProcessRunQueue()
    keeper = LeaseKeeper(store, lease_s=2, heartbeat_s=1)
    config = EngineConfig(
        engine_id="e1", shards=(shard_of(jid),), poll_interval_s=0.05, lease_s=2, janitor_interval_s=0.2
    )
    engine = Engine(store, queue, keeper, config)
    await engine.start()
    return engine, queue


class _AnswerLostOnce(MemoryStore):
    """A store whose first claim is made and committed but whose answer never reaches the engine,
    as when PostgreSQL restarts between the commit and the reply."""

    lost: int = 0

    async def claim_due(self, shard: int, engine_id: str, **kw):
        rows = await super().claim_due(shard, engine_id, **kw)
        if rows and not self.lost:
            self.lost = len(rows)
            raise ConnectionResetError("connection was closed in the middle of operation")
        return rows


async def test_a_claim_whose_answer_was_lost_still_fires() -> None:
    """The rows a lost answer claimed are the engine's, but not in its wheel. Before the fix the
    janitor's keep-alive of "this engine's waiting claims" renewed their leases for good: they
    were never fired nor rescued (a database restart left jobs scheduled for ever). The claim
    loop now takes such rows back after a failed claim."""
    store = _AnswerLostOnce()
    job, _ = await store.create_job(OWNER, _spec(datetime.now(UTC) + timedelta(milliseconds=300)))
    jid = uuid.UUID(job.id)
    engine, queue = await _short_lease_engine(store, jid)
    try:
        run = await asyncio.wait_for(queue.get(), timeout=8)
        assert store.lost == 1
        assert run.job_id == jid
    finally:
        await engine.stop()


class _SkipFailsOnce(MemoryStore):
    """A store whose first write of skipped occurrences fails (the database went away)."""

    failed: int = 0

    async def skip_missed(self, skips):
        if not self.failed:
            self.failed = len(skips)
            raise ConnectionResetError("connection was closed in the middle of operation")
        return await super().skip_missed(skips)


async def test_a_claim_whose_skip_write_failed_is_taken_back_and_finished() -> None:
    """A row the misfire policy skips is held by nothing but the write of the skip. Before the
    fix a failed write killed the claim loop (the engine crashed); now the claim loop takes the
    row back and the skip is written on the next round."""
    store = _SkipFailsOnce()
    spec = replace(_spec(datetime.now(UTC) + timedelta(seconds=600)), misfire=Misfire.SKIP)
    job, _ = await store.create_job(OWNER, spec)
    jid = uuid.UUID(job.id)
    # Missed by ten minutes, as after an outage (a create in the past is due now, not missed).
    store._jobs[jid].next_run_at = store._jobs[jid].scheduled_for = datetime.now(UTC) - timedelta(seconds=600)
    engine, queue = await _short_lease_engine(store, jid)
    try:
        for _ in range(160):
            if (await store.get_job(OWNER, jid)).state is not JobState.SCHEDULED:
                break
            await asyncio.sleep(0.05)
        assert store.failed == 1
        assert engine.crashed is None
        assert (await store.get_job(OWNER, jid)).state is JobState.COMPLETED
        assert queue.get_nowait() is None, "skipped, never called"
    finally:
        await engine.stop()
