"""The engine over the in-memory store: no database, the same run path. A due job is claimed,
fired at its time, fenced into the run queue; its outcome finishes it; on stop the engine gives
back what it claimed and has not fired."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from duetime.core.ids import shard_of
from duetime.core.model import JobSpec, JobState, OneOffSchedule, Outcome, WebhookTarget
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
