"""The Retention port's contract (engine/retention.py stands on it), for every store: finished
jobs older than the cut go with their history, young ones and jobs still scheduled stay; old
history goes batch by batch while its job stays; target health reports older than the cut go.

The PostgreSQL stores share their databases between cases, so a sweep here deletes the old rows
of other cases too: each case asserts only about rows of its own."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

from duetime.core.errors import NotFound
from duetime.core.model import JobState, Outcome, Overlap, TargetState
from duetime.storage.ports import FinishedJobsSweep, TargetHealthReport
from tests.contract.conftest import Store, cron, engine_id, new_owner, now
from tests.contract.test_runstore_contract import claim, due_job, fence, report
from tests.support.wait import until

LATER = timedelta(minutes=1)


async def _sweep_finished(store: Store, before: datetime) -> FinishedJobsSweep:
    jobs = history = 0
    for dsn in store.databases():
        while True:
            sweep = await store.delete_finished_jobs(dsn, before=before, limit=200)
            assert sweep is not None, "nothing else holds the maintenance lock here"
            jobs, history = jobs + sweep.jobs, history + sweep.history
            if sweep.jobs < 200:
                break
    return FinishedJobsSweep(jobs=jobs, history=history)


async def _sweep_history(store: Store, before: datetime) -> int:
    """As the service walks it: batch after batch, each from where the last one stopped."""
    deleted = 0
    for dsn in store.databases():
        after = 0
        while True:
            sweep = await store.delete_old_runs(dsn, before=before, limit=200, after=after)
            assert sweep is not None, "nothing else holds the maintenance lock here"
            deleted += sweep.deleted
            if sweep.deleted == 0 or sweep.walked is None:
                break
            assert sweep.walked > after
            after = sweep.walked
    return deleted


async def _completed_one_off(store: Store, owner: str) -> uuid.UUID:
    jid = await due_job(store, owner)
    [run] = await fence(store, (await claim(store, engine_id(), [jid])).values())
    await store.complete_runs([report(run, Outcome.SUCCEEDED)])
    assert (await store.get_job(owner, jid)).state is JobState.COMPLETED
    return jid


async def _recurring_with_history(store: Store, owner: str) -> uuid.UUID:
    job, _ = await store.create_job(owner, cron("* * * * * *", overlap=Overlap.SKIP))
    jid = uuid.UUID(job.id)
    [run] = await fence(store, (await claim(store, engine_id(), [jid])).values())
    await store.complete_runs([report(run, Outcome.SUCCEEDED)])
    return jid


async def test_a_finished_job_goes_with_its_history_and_a_scheduled_one_stays(store: Store) -> None:
    o = new_owner()
    done = await _completed_one_off(store, o)
    cancelled, _ = await store.create_job(o, cron("0 0 * * *"))
    await store.cancel_job(o, uuid.UUID(cancelled.id))
    active = await _recurring_with_history(store, o)
    swept = await _sweep_finished(store, now() + LATER)
    assert swept.jobs >= 2 and swept.history >= 1
    for gone in (done, uuid.UUID(cancelled.id)):
        with pytest.raises(NotFound):
            await store.get_job(o, gone)
    assert (await store.get_job(o, active)).state is JobState.SCHEDULED
    assert len((await store.list_runs(o, active, limit=10, cursor=None)).items) == 1


async def test_a_job_finished_after_the_cut_stays(store: Store) -> None:
    o = new_owner()
    done = await _completed_one_off(store, o)
    await _sweep_finished(store, now() - LATER)
    assert (await store.get_job(o, done)).state is JobState.COMPLETED
    assert len((await store.list_runs(o, done, limit=10, cursor=None)).items) == 1


async def test_old_history_goes_batch_by_batch_and_its_job_stays(store: Store) -> None:
    o = new_owner()
    jid = await _recurring_with_history(store, o)
    await _sweep_history(store, now() - LATER)
    assert len((await store.list_runs(o, jid, limit=10, cursor=None)).items) == 1, "young history stays"
    assert await _sweep_history(store, now() + LATER) >= 1
    assert (await store.list_runs(o, jid, limit=10, cursor=None)).items == []
    job = await store.get_job(o, jid)
    assert job.state is JobState.SCHEDULED and job.last_run is not None, "the job keeps its last run"


async def test_target_reports_older_than_the_cut_go(store: Store) -> None:
    o, w = new_owner(), "w_" + uuid.uuid4().hex[:8]
    rep = TargetHealthReport(o, "example.com:443", TargetState.HEALTHY, 8, None, 1, 0, 0)
    await store.report_target_health(w, [rep])
    await store.purge_target_health(older_than_s=3600)
    assert [t.host for t in (await store.list_targets(o, limit=10, cursor=None)).items] == ["example.com:443"]

    async def purged() -> bool:
        await store.purge_target_health(older_than_s=0)
        return (await store.list_targets(o, limit=10, cursor=None)).items == []

    await until(purged, within=5, what="a report older than a cut of 0 s to go")
