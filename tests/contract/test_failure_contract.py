"""Failure handling's contract, for every store: an occurrence's last attempt counts in the
completion's transaction, ``job.failing`` is written once at ``on_failure.after``, the job
pauses at ``pause_after_failures`` (``job.paused``), a resume starts the count over, the first
success after ``job.failing`` writes ``job.recovered``; and the outbox's claim, settle and purge."""

from __future__ import annotations

import uuid
from datetime import timedelta

from duetime.core.model import JobState, OnFailure, Outcome, Overlap, RetryPolicy, WebhookTarget
from duetime.storage.ports import EventSettlement, OutboxEvent
from tests.contract.conftest import Store, cron, engine_id, new_owner, now
from tests.contract.test_runstore_contract import claim, fence, report, running_with_occurrences

HOOK = WebhookTarget(url="https://example.com/failures", headers={"X-Token": "t0k"})


async def _occurrence(store: Store, owner: str, engine: str, jid: uuid.UUID, outcome: Outcome) -> None:
    """One occurrence of ``jid`` (a trigger: due now) that ends with ``outcome`` at its first attempt."""
    await store.trigger_job(owner, jid)
    [run] = await fence(store, (await claim(store, engine, [jid])).values())
    await store.complete_runs([report(run, outcome, retryable=False)])


async def _events(store: Store, owner: str) -> list[OutboxEvent]:
    """This owner's due events (claimed, so a second call sees none until their lease ends)."""
    return [e for e in await store.claim_events(limit=1000, lease_s=30) if e.owner == owner]


async def test_failing_once_then_paused_then_recovered_after_resume(store: Store) -> None:
    o, e = new_owner(), engine_id()
    spec = cron(
        "0 0 1 1 *",
        name="nightly-" + o,
        labels={"team": "ops"},
        overlap=Overlap.SKIP,
        on_failure=OnFailure(target=HOOK, after=2),
        pause_after_failures=3,
    )
    job, _ = await store.create_job(o, spec)
    jid = uuid.UUID(job.id)
    assert (await store.get_job(o, jid)).spec.on_failure == OnFailure(target=HOOK, after=2)

    await _occurrence(store, o, e, jid, Outcome.FAILED)
    assert await _events(store, o) == []
    await _occurrence(store, o, e, jid, Outcome.FAILED)
    [failing] = await _events(store, o)
    assert failing.kind == "job.failing" and failing.target == HOOK and failing.job_id == jid
    body = failing.body
    assert body["type"] == "job.failing" and body["job_id"] == str(jid)
    assert body["name"] == "nightly-" + o and body["labels"] == {"team": "ops"}
    assert body["consecutive_failures"] == 2 and body["attempts"] == 1
    assert body["outcome"] == "failed" and body["status_code"] == 500
    assert failing.event_id == f"{jid}:{body['scheduled_for']}:job.failing"
    assert set(body) == {
        "type", "job_id", "name", "labels", "scheduled_for", "attempts",
        "consecutive_failures", "outcome", "status_code", "error", "at",
    }  # fmt: skip

    await _occurrence(store, o, e, jid, Outcome.TIMED_OUT)  # the third: paused, not failing again
    assert (await store.get_job(o, jid)).state is JobState.PAUSED
    [paused] = await _events(store, o)
    assert paused.kind == "job.paused" and paused.body["consecutive_failures"] == 3
    assert paused.body["outcome"] == "timed_out"

    await store.resume_job(o, jid)  # the count starts over: two more failures do not pause it
    await _occurrence(store, o, e, jid, Outcome.FAILED)
    await _occurrence(store, o, e, jid, Outcome.FAILED)
    assert (await store.get_job(o, jid)).state is JobState.SCHEDULED
    assert await _events(store, o) == []  # still failing since job.failing: not sent again
    await _occurrence(store, o, e, jid, Outcome.SUCCEEDED)
    [recovered] = await _events(store, o)
    assert recovered.kind == "job.recovered" and recovered.body["consecutive_failures"] == 0
    assert recovered.body["outcome"] == "succeeded"
    await _occurrence(store, o, e, jid, Outcome.SUCCEEDED)
    assert await _events(store, o) == []


async def test_a_retried_attempt_is_not_a_failed_occurrence(store: Store) -> None:
    o, e = new_owner(), engine_id()
    retry = RetryPolicy(max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.01)
    spec = cron("0 0 1 1 *", overlap=Overlap.SKIP, retry=retry, on_failure=OnFailure(target=HOOK))
    job, _ = await store.create_job(o, spec)
    jid = uuid.UUID(job.id)
    await store.trigger_job(o, jid)
    [run] = await fence(store, (await claim(store, e, [jid])).values())
    await store.complete_runs([report(run, Outcome.FAILED, retryable=True)])
    assert await _events(store, o) == []  # a retry is due: the occurrence is not over
    [again] = await fence(store, (await claim(store, e, [jid])).values())  # the retry, due within 10 ms
    assert again.attempt == 2
    await store.complete_runs([report(again, Outcome.FAILED, retryable=True)])
    [failing] = await _events(store, o)
    assert failing.kind == "job.failing" and failing.body["attempts"] == 2


async def test_without_failure_handling_nothing_is_counted(store: Store) -> None:
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("0 0 1 1 *", overlap=Overlap.SKIP, pause_after_failures=None))
    jid = uuid.UUID(job.id)
    for _ in range(3):
        await _occurrence(store, o, e, jid, Outcome.FAILED)
    assert (await store.get_job(o, jid)).state is JobState.SCHEDULED
    assert await _events(store, o) == []


async def test_pause_after_failures_alone_pauses_without_events(store: Store) -> None:
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("0 0 1 1 *", overlap=Overlap.SKIP, pause_after_failures=1))
    jid = uuid.UUID(job.id)
    await _occurrence(store, o, e, jid, Outcome.FAILED)
    assert (await store.get_job(o, jid)).state is JobState.PAUSED
    assert await _events(store, o) == []


async def test_the_outbox_settles_delivered_retried_and_given_up_events(store: Store) -> None:
    o, e = new_owner(), engine_id()
    spec = cron("0 0 1 1 *", overlap=Overlap.SKIP, on_failure=OnFailure(target=HOOK))
    jids = []
    for _ in range(3):
        job, _ = await store.create_job(o, spec)
        jids.append(uuid.UUID(job.id))
        await _occurrence(store, o, e, jids[-1], Outcome.FAILED)
    events = await _events(store, o)
    assert sorted(ev.job_id for ev in events) == sorted(jids)
    assert all(ev.attempts == 1 for ev in events)
    assert await _events(store, o) == []  # leased
    delivered, retried, given_up = sorted(events, key=lambda ev: jids.index(ev.job_id))
    await store.settle_events(
        [
            EventSettlement(delivered, delivered=True),
            EventSettlement(
                retried, delivered=False, retry_at=now() - timedelta(seconds=1), error="HTTP 503"
            ),
            EventSettlement(given_up, delivered=False, retry_at=None, error="HTTP 404"),
        ]
    )
    [again] = await _events(store, o)
    assert again.event_id == retried.event_id and again.attempts == 2
    # A settle under the old attempt number changes nothing (another holder took it over).
    await store.settle_events([EventSettlement(retried, delivered=True)])
    await store.settle_events([EventSettlement(again, delivered=True)])
    assert await _events(store, o) == []
    assert await store.purge_given_up_events(before=now() + timedelta(seconds=5), limit=1000) >= 1


async def test_an_occurrence_row_counts_for_its_job_and_pauses_it(store: Store) -> None:
    """overlap=allow: an occurrence run in a row of its own fails; its job's count (on the job's
    row, locked with the batch) moves, and the job pauses while its own run is in flight."""
    o, e = new_owner(), engine_id()
    spec = cron("* * * * * *", on_failure=OnFailure(target=HOOK), pause_after_failures=1)
    job, _ = await store.create_job(o, spec)  # overlap=allow is the default
    jid = uuid.UUID(job.id)
    run, occurrences = await running_with_occurrences(store, o, e, jid)
    [occ] = await fence(store, occurrences[:1])
    assert occ.parent_id == jid
    await store.complete_runs([report(occ, Outcome.FAILED)])
    assert (await store.get_job(o, jid)).state is JobState.PAUSED
    assert await fence(store, occurrences[1:]) == []  # no other run of it starts now
    kinds = [ev.kind for ev in await _events(store, o)]
    assert sorted(kinds) == ["job.failing", "job.paused"]
    # The job's own run, in flight all along, finishes: the job stays paused, and has recovered.
    await store.complete_runs([report(run, Outcome.SUCCEEDED)])
    assert (await store.get_job(o, jid)).state is JobState.PAUSED
    [recovered] = await _events(store, o)
    assert recovered.kind == "job.recovered" and recovered.job_id == jid


async def test_claims_of_the_outbox_are_exclusive_and_leased(store: Store) -> None:
    """Several delivery services share the outbox: concurrent claims take disjoint events, and an
    event whose holder never settles comes due again after its lease, under a new attempt number
    that fences the old holder's settle out."""
    import asyncio

    o, e = new_owner(), engine_id()
    spec = cron("0 0 1 1 *", overlap=Overlap.SKIP, on_failure=OnFailure(target=HOOK))
    for _ in range(6):
        job, _ = await store.create_job(o, spec)
        await _occurrence(store, o, e, uuid.UUID(job.id), Outcome.FAILED)
    a, b = await asyncio.gather(
        store.claim_events(limit=1000, lease_s=2.0), store.claim_events(limit=1000, lease_s=2.0)
    )
    mine_a = {ev.event_id for ev in a if ev.owner == o}
    mine_b = {ev.event_id for ev in b if ev.owner == o}
    assert not mine_a & mine_b and len(mine_a | mine_b) == 6
    held = [ev for ev in a + b if ev.owner == o]
    assert await _events(store, o) == []
    await asyncio.sleep(2.5)  # the holders died: their leases end
    again = await _events(store, o)
    assert sorted(ev.event_id for ev in again) == sorted(ev.event_id for ev in held)
    assert all(ev.attempts == 2 for ev in again)
    await store.settle_events([EventSettlement(ev, delivered=True) for ev in held])  # too late
    await store.settle_events([EventSettlement(ev, delivered=False, retry_at=now()) for ev in again])
    assert len(await _events(store, o)) == 6  # the old holder's settle changed nothing
