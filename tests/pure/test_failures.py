"""Failure handling's rules (core/failures.py) with a fake clock: failing after N consecutive
failed occurrences and only once, recovered on the first success after it, the pause count, a
resume that starts the count over (on the in-memory store), and the delivery service's retry
decision (workers/events.py: the default retry policy)."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from duetime.core.failures import (
    EventType,
    FailureCount,
    OccurrenceEnd,
    event_id,
    events_of,
    may_pause,
    step,
    tracked,
)
from duetime.core.model import (
    Broker,
    CronSchedule,
    JobSpec,
    JobState,
    OnFailure,
    Outcome,
    Overlap,
    QueueTarget,
    WebhookTarget,
)
from duetime.core.runpath import Verdict
from duetime.storage.memory import MemoryStore
from duetime.storage.ports import OutboxEvent
from duetime.workers.events import DEFAULT_POLICY, settle

T0 = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
JOB = uuid.UUID("0190f2a0-0000-7000-8000-000000000001")
HOOK = WebhookTarget(url="https://example.com/failures")


def spec(*, after: int | None = 1, pause: int | None = None) -> JobSpec:
    return JobSpec(
        target=WebhookTarget(url="https://example.com/run"),
        schedule=CronSchedule(cron="* * * * *"),
        name="nightly",
        labels={"team": "ops"},
        on_failure=None if after is None else OnFailure(target=HOOK, after=after),
        pause_after_failures=pause,
    )


def end(k: int, outcome: Outcome = Outcome.FAILED) -> OccurrenceEnd:
    """The k-th occurrence (a minute apart), recorded 2 s after it was due."""
    at = T0 + timedelta(minutes=k)
    return OccurrenceEnd(
        JOB, at, 1, outcome, 500 if outcome is Outcome.FAILED else 200, None, at + timedelta(seconds=2)
    )


def run(s: JobSpec, outcomes: list[Outcome], state: JobState = JobState.SCHEDULED) -> list[list[EventType]]:
    """The events of each occurrence in turn; the state follows the pauses."""
    count = FailureCount()
    out = []
    for k, outcome in enumerate(outcomes):
        result = step(s, count, end(k, outcome), state)
        count = result.count
        if result.pause:
            state = JobState.PAUSED
        out.append(list(result.events))
    return out


F, OK, T = Outcome.FAILED, Outcome.SUCCEEDED, Outcome.TIMED_OUT


def test_failing_after_n_is_sent_once_and_recovered_on_the_first_success() -> None:
    got = run(spec(after=3), [F, F, T, F, F, OK, OK, F, F, F])
    assert got == [
        [],
        [],
        [EventType.FAILING],
        [],
        [],
        [EventType.RECOVERED],
        [],
        [],
        [],
        [EventType.FAILING],
    ]


def test_a_success_before_n_starts_the_count_over() -> None:
    assert run(spec(after=2), [F, OK, F, OK, F]) == [[], [], [], [], []]


def test_skipped_and_lease_expired_outcomes() -> None:
    # A skipped occurrence is not an ended run; a lease that lapsed on the last attempt is a failure.
    assert end(0, Outcome.LEASE_EXPIRED).failed and not end(0, Outcome.SKIPPED).failed


def test_the_pause_count_pauses_once_and_sends_job_paused() -> None:
    got = run(spec(after=1, pause=3), [F, F, F, F])
    assert got == [[EventType.FAILING], [], [EventType.PAUSED], []]  # paused: the 4th does not pause again


def test_failing_and_paused_on_the_same_occurrence_in_that_order() -> None:
    result = step(spec(after=2, pause=2), FailureCount(1, False), end(1), JobState.SCHEDULED)
    assert result.events == (EventType.FAILING, EventType.PAUSED) and result.pause
    assert result.count == FailureCount(2, True)


def test_pause_without_on_failure_sends_nothing() -> None:
    result = step(spec(after=None, pause=1), FailureCount(), end(0), JobState.SCHEDULED)
    assert result.pause and result.events == () and result.count == FailureCount(1, False)


@pytest.mark.parametrize("state", [JobState.PAUSED, JobState.DEAD, JobState.COMPLETED, JobState.CANCELLED])
def test_only_a_scheduled_job_pauses_itself(state: JobState) -> None:
    assert not may_pause(state)
    assert not step(spec(pause=1), FailureCount(5, True), end(0), state).pause
    assert may_pause(JobState.SCHEDULED)


def test_a_job_that_no_longer_counts_has_its_count_reset() -> None:
    untracked = spec(after=None)
    assert not tracked(untracked)
    result = step(untracked, FailureCount(7, True), end(0), JobState.SCHEDULED)
    assert result == step(untracked, FailureCount(), end(0, OK), JobState.SCHEDULED)
    assert result.count == FailureCount() and result.events == ()


def test_an_after_lowered_below_the_count_fires_on_the_next_failure() -> None:
    result = step(spec(after=2), FailureCount(5, False), end(0), JobState.SCHEDULED)
    assert result.events == (EventType.FAILING,) and result.count == FailureCount(6, True)


def test_the_event_body_and_its_stable_id() -> None:
    s = spec(after=1)
    e = end(0)
    result = step(s, FailureCount(), e, JobState.SCHEDULED)
    [event] = events_of(s, e, result, shard=3, owner="alice")
    assert event.body == {
        "type": "job.failing",
        "job_id": str(JOB),
        "name": "nightly",
        "labels": {"team": "ops"},
        "scheduled_for": "2026-12-01T03:00:00Z",
        "attempts": 1,
        "consecutive_failures": 1,
        "outcome": "failed",
        "status_code": 500,
        "error": None,
        "at": "2026-12-01T03:00:02Z",
    }
    assert event.event_id == f"{JOB}:2026-12-01T03:00:00Z:job.failing"
    assert event.event_id == event_id(str(JOB), e.scheduled_for, EventType.FAILING)
    assert (event.target, event.shard, event.owner) == (HOOK, 3, "alice")


# ---------------------------------------------------------------------------------- on the fake store


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.now


async def _occurrence(store: MemoryStore, clock: Clock, owner: str, jid: uuid.UUID, outcome: Outcome) -> None:
    from duetime.core.ids import shard_of
    from duetime.core.runpath import AttemptReport

    clock.now += timedelta(seconds=10)
    await store.trigger_job(owner, jid)
    claims = await store.claim_due(shard_of(jid), "e1", lookahead_s=1, lease_s=30, limit=10)
    [run_] = await store.fence_runs(claims, lease_s=30)
    verdict = Verdict(outcome, False, 500 if outcome is F else 200)
    await store.complete_runs([AttemptReport(run_, verdict, clock.now, clock.now)])


async def test_on_the_memory_store_a_resume_starts_the_count_over() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    s = JobSpec(
        target=QueueTarget(broker=Broker.NATS, topic="runs"),
        schedule=CronSchedule(cron="0 0 1 1 *"),
        overlap=Overlap.SKIP,
        on_failure=OnFailure(target=HOOK, after=2),
        pause_after_failures=3,
    )
    job, _ = await store.create_job("alice", s)
    jid = uuid.UUID(job.id)
    for _ in range(3):
        await _occurrence(store, clock, "alice", jid, F)
    assert (await store.get_job("alice", jid)).state is JobState.PAUSED
    assert [e.kind for e in store.failure_events()] == [EventType.FAILING, EventType.PAUSED]
    paused = store.failure_events()[1]
    assert paused.body["at"] == clock.now.strftime("%Y-%m-%dT%H:%M:%SZ")  # the store's clock
    await store.resume_job("alice", jid)
    for _ in range(2):  # two more: under the pause count again, and still failing (no event)
        await _occurrence(store, clock, "alice", jid, F)
    assert (await store.get_job("alice", jid)).state is JobState.SCHEDULED
    assert len(store.failure_events()) == 2
    await _occurrence(store, clock, "alice", jid, F)  # the third since the resume
    assert (await store.get_job("alice", jid)).state is JobState.PAUSED
    await store.resume_job("alice", jid)
    await _occurrence(store, clock, "alice", jid, OK)
    assert [e.kind for e in store.failure_events()] == [
        EventType.FAILING,
        EventType.PAUSED,
        EventType.PAUSED,
        EventType.RECOVERED,
    ]


# ---------------------------------------------------------------------------------- delivery retries


def outbox_event(attempts: int) -> OutboxEvent:
    return OutboxEvent(
        seq=1,
        database="memory",
        event_id=f"{JOB}:2026-12-01T03:00:00Z:job.failing",
        kind="job.failing",
        job_id=JOB,
        owner="alice",
        scheduled_for=T0,
        fencing_token=1,
        target=HOOK,
        body={},
        attempts=attempts,
    )


def test_a_delivered_event_is_settled_delivered() -> None:
    assert settle(outbox_event(1), Verdict(OK, False, 200), T0).delivered


def test_a_retryable_failure_waits_by_the_default_policy_until_its_attempts_run_out() -> None:
    random.seed(7)
    for attempt in range(1, DEFAULT_POLICY.max_attempts):
        s = settle(outbox_event(attempt), Verdict(F, True, 503, "HTTP 503"), T0)
        assert not s.delivered and s.retry_at is not None and s.error == "HTTP 503"
        ceiling = min(DEFAULT_POLICY.backoff_max_s, 2.0 ** (attempt - 1))
        assert T0 <= s.retry_at <= T0 + timedelta(seconds=ceiling)
    last = settle(outbox_event(DEFAULT_POLICY.max_attempts), Verdict(F, True, 503, "HTTP 503"), T0)
    assert not last.delivered and last.retry_at is None  # given up


def test_a_final_failure_is_given_up_at_once_and_retry_after_is_honoured() -> None:
    gone = settle(outbox_event(1), Verdict(F, False, 404, "HTTP 404"), T0)
    assert gone.retry_at is None and gone.error == "HTTP 404"
    wait = settle(outbox_event(1), Verdict(F, True, 429, "HTTP 429", retry_after_s=30.0), T0)
    assert wait.retry_at is not None and wait.retry_at >= T0 + timedelta(seconds=30)
    capped = settle(outbox_event(1), Verdict(F, True, 503, "HTTP 503", retry_after_s=86400.0), T0)
    assert capped.retry_at is not None and capped.retry_at <= T0 + timedelta(
        seconds=DEFAULT_POLICY.backoff_max_s
    )


# ---------------------------------------------------------------------------------- the CLI's flags


def test_jobs_create_flags_make_on_failure_and_pause_after_failures() -> None:
    from duetime.cli import _spec_from_args, build_parser

    args = build_parser().parse_args(
        [
            "jobs",
            "create",
            "--webhook-url",
            "https://example.com/run",
            "--every",
            "1h",
            "--on-failure-url",
            "https://example.com/pager",
            "--on-failure-after",
            "3",
            "--pause-after-failures",
            "10",
        ]
    )
    spec = _spec_from_args(args)
    assert spec["on_failure"] == {
        "target": {"type": "webhook", "url": "https://example.com/pager"},
        "after": 3,
    }
    assert spec["pause_after_failures"] == 10


def test_on_failure_after_alone_is_a_usage_error() -> None:
    from duetime.cli import _JobsUsage, _spec_from_args, build_parser

    args = build_parser().parse_args(
        ["jobs", "update", "0190f2a0-0000-7000-8000-000000000001", "--on-failure-after", "2"]
    )
    with pytest.raises(_JobsUsage, match="--on-failure-url"):
        _spec_from_args(args, patch=True)


# ---------------------------------------------------------------------------------- headers of an event


def test_an_event_is_keyed_and_marked_in_webhook_headers_and_queue_messages() -> None:
    from dataclasses import replace

    from duetime.core import signing
    from duetime.core.runpath import Delivery
    from duetime.workers.queues import message_headers, redis_fields
    from duetime.workers.webhook import contract_headers

    secret = signing.new_signing_secret()
    d = Delivery(
        job_id=str(JOB),
        scheduled_for=T0,
        attempt=2,
        fencing_token=7,
        owner="alice",
        signing_secret=secret,
        payload={"type": "job.paused"},
        target=HOOK,
        event="job.paused",
    )
    body = signing.encode_body(d.payload)
    key = f"{JOB}:2026-12-01T03:00:00Z:job.paused"
    h = contract_headers(d, body, T0)
    assert h["webhook-id"] == h["Idempotency-Key"] == key and h["Duetime-Event"] == "job.paused"
    assert signing.verify_signature(secret, h, body, now=T0)
    q = message_headers(d)
    assert q["Idempotency-Key"] == key and q["Duetime-Event"] == "job.paused"
    fields = redis_fields(d, body)
    assert fields["idempotency_key"] == key and fields["duetime_event"] == "job.paused"
    run = replace(d, event=None)  # a run's call: its own key, no event header
    assert contract_headers(run, body, T0)["webhook-id"] == f"{JOB}:2026-12-01T03:00:00Z"
    assert "Duetime-Event" not in contract_headers(run, body, T0)
    assert "duetime_event" not in redis_fields(run, body)
