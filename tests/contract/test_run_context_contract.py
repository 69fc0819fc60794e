"""The run context the fence returns (issue 30, item 4; migration 0019), for every store: the job's
last success, when it was made, and what run_once folded into the run, read with the row the fence
fences. The schedule math made of it is pure (tests/pure/test_run_context_math.py); the headers it
becomes are tests/processes/test_run_context.py's."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

from duetime.core.ids import shard_of
from duetime.core.model import Outcome, Overlap
from duetime.core.runpath import Claim, FencedRun, FenceRequest, RunContext, Skip
from tests.contract.conftest import Store, cron, engine_id, new_owner, now
from tests.contract.test_runstore_contract import (
    RETRY_AT_ONCE,
    claim,
    fence,
    lease,
    report,
)


async def _next_run(store: Store, jid: uuid.UUID, *, moved_to: timedelta | None = None) -> FencedRun:
    """The job's row claimed and fenced (as a fired wheel entry names it: ``moved_to`` later than
    the row's occurrence is what run_once's FireNow hands the fence)."""
    row = (await claim(store, engine_id(), [jid]))[jid]
    if moved_to is None:
        [run] = await fence(store, [row])
    else:
        item = FenceRequest(row.job_id, row.shard, row.lease_token, row.scheduled_for + moved_to)
        [run] = await store.fence_runs([item], lease_s=30)
    return run


async def _due_of(
    store: Store, owner: str, jid: uuid.UUID, engine: str, *, lookahead_s: float
) -> list[Claim]:
    """The owner's rows due on the job's shard (its occurrence rows with it), claimed."""
    due = await store.claim_due(shard_of(jid), engine, lookahead_s=lookahead_s, lease_s=30, limit=500)
    return [r for r in due if r.owner == owner]


async def test_the_fence_returns_the_newest_occurrence_that_succeeded(store: Store) -> None:
    o = new_owner()
    job, _ = await store.create_job(o, cron("* * * * * *", overlap=Overlap.SKIP, retry=RETRY_AT_ONCE))
    jid = uuid.UUID(job.id)
    first = await _next_run(store, jid)
    assert first.last_success_for is None, "nothing succeeded yet"
    assert first.job_created_at == job.created_at, "the job's first occurrence follows from it"
    await store.complete_runs([report(first, Outcome.SUCCEEDED)])

    second = await _next_run(store, jid)
    assert second.scheduled_for > first.scheduled_for
    assert second.last_success_for == first.scheduled_for
    await store.complete_runs([report(second, Outcome.FAILED, retryable=True)])
    retry = await _next_run(store, jid)
    assert (retry.scheduled_for, retry.attempt) == (second.scheduled_for, 2)
    assert retry.last_success_for == first.scheduled_for, "a failed attempt is no success"
    await store.complete_runs([report(retry, Outcome.FAILED, retryable=False)])

    third = await _next_run(store, jid)
    assert third.last_success_for == first.scheduled_for, "nor is a failed occurrence"
    await store.complete_runs([report(third, Outcome.SUCCEEDED)])
    fourth = await _next_run(store, jid)
    assert fourth.last_success_for == third.scheduled_for


async def test_a_stale_success_is_no_success(store: Store) -> None:
    """A report whose lease was taken over changes nothing, its success neither."""
    o = new_owner()
    job, _ = await store.create_job(o, cron("* * * * * *", overlap=Overlap.SKIP))
    jid = uuid.UUID(job.id)
    run = await _next_run(store, jid)
    assert await store.return_unstarted([lease(run)]) == 1
    assert (await store.complete_runs([report(run, Outcome.SUCCEEDED)])).stale == 1
    again = await _next_run(store, jid)
    assert again.last_success_for is None


async def test_a_run_that_folded_missed_occurrences_carries_the_oldest_on_every_attempt(store: Store) -> None:
    """The wheel entry of a run_once run names a later occurrence than the row's: the row's own
    was the oldest one missed. Every attempt of that occurrence returns it; the next occurrence
    does not; a run given back unused and folded further keeps the oldest."""
    o = new_owner()
    job, _ = await store.create_job(o, cron("* * * * * *", overlap=Overlap.SKIP, retry=RETRY_AT_ONCE))
    jid = uuid.UUID(job.id)
    plain = await _next_run(store, jid)
    assert plain.folded_from is None, "an occurrence run as it came"
    await store.complete_runs([report(plain, Outcome.SUCCEEDED)])

    row = (await claim(store, engine_id(), [jid]))[jid]
    oldest = row.scheduled_for
    item = FenceRequest(row.job_id, row.shard, row.lease_token, oldest + timedelta(seconds=5))
    [folded] = await store.fence_runs([item], lease_s=30)
    assert (folded.scheduled_for, folded.folded_from) == (oldest + timedelta(seconds=5), oldest)
    assert await store.return_unstarted([lease(folded)]) == 1  # the worker stopped before calling
    again = await _next_run(store, jid, moved_to=timedelta(seconds=3))
    assert again.scheduled_for == oldest + timedelta(seconds=8)
    assert again.folded_from == oldest, "folded twice: the oldest of all is kept"
    await store.complete_runs([report(again, Outcome.FAILED, retryable=True)])

    retry = await _next_run(store, jid)
    assert (retry.scheduled_for, retry.attempt, retry.folded_from) == (again.scheduled_for, 2, oldest)
    await store.complete_runs([report(retry, Outcome.SUCCEEDED)])
    following = await _next_run(store, jid)
    assert following.scheduled_for > retry.scheduled_for
    assert following.folded_from is None, "the next occurrence stands for itself"
    assert following.last_success_for == retry.scheduled_for


async def test_occurrence_rows_carry_their_jobs_context_and_spec_version(store: Store) -> None:
    """A catch-up's occurrence rows run as the job: its creation, its last success, its spec
    version; their successes are the job's."""
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("0 * * * *"))
    jid = uuid.UUID(job.id)
    edited = await store.update_job(o, jid, cron("30 * * * *"))  # a new schedule: a new spec version
    assert edited.next_run_at is not None
    await store.trigger_job(o, jid)
    own = (await claim(store, e, [jid]))[jid]
    [triggered] = await fence(store, [own])
    assert triggered.spec.version >= 2
    await store.complete_runs([report(triggered, Outcome.SUCCEEDED)])

    await store.trigger_job(o, jid)
    row = (await claim(store, e, [jid]))[jid]
    # occurrences later than the triggered run's, so that they are the newest successes
    base = triggered.scheduled_for.replace(microsecond=0) + timedelta(seconds=1)
    backlog = tuple(base + timedelta(seconds=s) for s in (0, 1, 2))
    item = Skip(jid, row.shard, row.lease_token, (), edited.next_run_at, catch_up=backlog)
    assert (await store.skip_missed([item])).applied == 1
    got = [
        r
        for r in await store.claim_due(shard_of(jid), e, lookahead_s=0, lease_s=30, limit=500)
        if r.owner == o
    ]
    runs = await fence(store, got)
    assert sorted(r.scheduled_for for r in runs) == list(backlog)
    for run in runs:
        assert run.parent_id == jid
        assert run.job_created_at == job.created_at
        assert run.last_success_for == triggered.scheduled_for
        assert run.spec.version == triggered.spec.version, "the job's version, not the row's own"
    await store.complete_runs([report(r, Outcome.SUCCEEDED) for r in runs])

    # a backfill's rows are occurrence rows too, made by the registry: they see those successes
    done = await store.backfill_job(
        o, jid, now() - timedelta(hours=2), now(), max_occurrences=5, pace_per_s=100
    )
    assert done.queued >= 1
    backfilled = await fence(
        store,
        [
            r
            for r in await store.claim_due(shard_of(jid), e, lookahead_s=5, lease_s=30, limit=500)
            if r.owner == o
        ],
    )
    assert len(backfilled) == done.queued
    for run in backfilled:
        assert run.last_success_for == max(backlog), "the occurrence rows' successes are the job's"
        assert run.spec.version == triggered.spec.version


async def test_the_run_is_told_the_spec_version_the_api_shows(store: Store) -> None:
    """Duetime-Spec-Version is the job's spec_version as its Job, Runs and change history show
    it (migration 0018): a change of the payload alone is a new version to the owner, though the
    run path's own counter (spec.version) moves only with the timing."""
    o = new_owner()
    job, _ = await store.create_job(o, cron("* * * * * *", overlap=Overlap.SKIP))
    jid = uuid.UUID(job.id)
    edited = await store.update_job(o, jid, replace(job.spec, payload={"v": 2}))
    assert edited.spec_version == 2
    run = await _next_run(store, jid)
    assert (run.spec_version, run.spec.version) == (2, 1)
    assert RunContext.of(run, run.spec.parsed).spec_version == 2
    await store.complete_runs([report(run, Outcome.SUCCEEDED)])
    [ran] = (await store.list_runs(o, jid, limit=10, cursor=None)).items
    assert ran.spec_version == run.spec_version
