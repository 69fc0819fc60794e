"""``core.lifecycle.ends_one_off`` against ``after_attempt``: where it says a one-off is over, the
completion's one statement writes constants (completed, no next run, occurrence and attempt
kept, no split point, nothing handed over) instead of the plan ``after_attempt`` computes. The
two must agree for every spec and row it says so of, and it must say so of nothing else that a
statement guard would let through."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core.lifecycle import RowPlan, after_attempt, ends_one_off, split_point
from duetime.core.model import (
    Broker,
    CronSchedule,
    IntervalSchedule,
    JobSpec,
    JobState,
    Misfire,
    OneOffSchedule,
    OnFailure,
    Outcome,
    Overlap,
    QueueTarget,
    RetryPolicy,
    Schedule,
    WebhookTarget,
)

T = datetime(2026, 12, 3, 0, 0, tzinfo=UTC)
HOOK = WebhookTarget(url="https://example.com/hook")

schedules: st.SearchStrategy[Schedule] = st.one_of(
    st.builds(OneOffSchedule, st.just(T)),
    st.just(CronSchedule(cron="0 * * * * *", timezone="UTC")),
    st.just(IntervalSchedule(every="30s", every_s=30, start_at=T - timedelta(hours=1))),
)
specs = st.builds(
    JobSpec,
    target=st.sampled_from([HOOK, QueueTarget(broker=Broker.REDIS, topic="t")]),
    schedule=schedules,
    retry=st.builds(
        RetryPolicy,
        max_attempts=st.integers(1, 6),
        max_duration_s=st.one_of(st.none(), st.integers(1, 3600)),
    ),
    misfire=st.sampled_from(list(Misfire)),
    jitter_s=st.integers(0, 60),
    spread_s=st.integers(0, 60),
    overlap=st.sampled_from(list(Overlap)),
    on_failure=st.one_of(st.none(), st.just(OnFailure(target=HOOK, after=2))),
    pause_after_failures=st.one_of(st.none(), st.integers(1, 5)),
)
rows = st.builds(
    RowPlan,
    state=st.sampled_from(list(JobState)),
    next_run_at=st.just(T),
    scheduled_for=st.just(T),
    attempt=st.integers(1, 6),
    run_kind=st.sampled_from(["scheduled", "manual"]),
    resume_at=st.one_of(st.none(), st.just(T + timedelta(hours=1))),
    pending_triggers=st.one_of(st.just(()), st.just((T + timedelta(minutes=5),))),
    handed_upto=st.one_of(st.none(), st.just(T - timedelta(minutes=1))),
)


@settings(max_examples=300, deadline=None)
@given(
    spec=specs,
    at=st.builds(lambda s: T + timedelta(seconds=s), st.integers(-86_400, 86_400)),
    attempt=st.integers(1, 6),
    late_s=st.integers(0, 7200),
)
def test_a_one_off_that_ends_becomes_what_the_statement_writes(
    spec: JobSpec, at: datetime, attempt: int, late_s: int
) -> None:
    spec = replace(spec, schedule=OneOffSchedule(at))
    row = RowPlan(JobState.SCHEDULED, at, at, attempt)  # as its fence left it
    assert ends_one_off(spec, row, outcome=Outcome.SUCCEEDED)
    plan = after_attempt(
        uuid.UUID(int=7),
        spec,
        row,
        attempt=attempt,
        outcome=Outcome.SUCCEEDED,
        retryable=True,
        now=at + timedelta(seconds=late_s),
        due=at,
    )
    # what finish_ordinary's one-off update writes (and keeps: scheduled_for, run_kind, ...)
    assert plan == RowPlan(JobState.COMPLETED, None, at, attempt)
    assert split_point(spec, plan) is None
    assert not plan.retrying


@settings(max_examples=400, deadline=None)
@given(spec=specs, row=rows, outcome=st.sampled_from(list(Outcome)))
def test_only_a_plain_success_of_a_one_off_ends_it(spec: JobSpec, row: RowPlan, outcome: Outcome) -> None:
    plain = (
        row.state is JobState.SCHEDULED
        and row.run_kind == "scheduled"
        and row.resume_at is None
        and not row.pending_triggers
        and row.handed_upto is None
    )
    expected = outcome is Outcome.SUCCEEDED and isinstance(spec.schedule, OneOffSchedule) and plain
    assert ends_one_off(spec, row, outcome=outcome) is expected
