"""Overlap policy and backfill planning, with a fake clock: what a recurring job's row becomes when
occurrences came due while its run was in flight, and which occurrences a backfill runs when."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from duetime.core.backfill import plan_backfill
from duetime.core.errors import InvalidRequest
from duetime.core.lifecycle import (
    OVERLAP_RECORD_CAP,
    RowPlan,
    after_attempt,
    after_occurrence_attempt,
    split_point,
    start_manual,
)
from duetime.core.model import (
    CronSchedule,
    JobSpec,
    JobState,
    OneOffSchedule,
    Outcome,
    Overlap,
    RetryPolicy,
    WebhookTarget,
)

JOB = uuid.UUID("01890000-0000-7000-8000-000000000001")
T0 = datetime(2026, 12, 1, 0, 0, 0, tzinfo=UTC)
S = timedelta(seconds=1)


def spec(overlap: Overlap, cron: str = "* * * * * *", **kw: object) -> JobSpec:
    return JobSpec(
        target=WebhookTarget(url="https://example.com/hook"),
        schedule=CronSchedule(cron=cron),
        overlap=overlap,
        **kw,  # type: ignore[arg-type]
    )


def running(at: datetime, **kw: object) -> RowPlan:
    return RowPlan(state=JobState.SCHEDULED, next_run_at=at, scheduled_for=at, attempt=0, **kw)  # type: ignore[arg-type]


def finish(sp: JobSpec, plan: RowPlan, now: datetime, outcome: Outcome = Outcome.SUCCEEDED) -> RowPlan:
    return after_attempt(JOB, sp, plan, attempt=1, outcome=outcome, retryable=True, now=now)


# ---------------------------------------------------------------------------- skip


def test_skip_records_every_occurrence_that_came_due_while_the_run_was_in_flight() -> None:
    # every second; the run of T0 took 3.5 s: T0+1, +2, +3 came due while it ran
    plan = finish(spec(Overlap.SKIP), running(T0), now=T0 + 3.5 * S)
    assert plan.overlap_skipped == (T0 + S, T0 + 2 * S, T0 + 3 * S)
    assert plan.scheduled_for == T0 + 4 * S and plan.next_run_at == T0 + 4 * S
    assert plan.overlap_unrecorded == 0 and plan.state is JobState.SCHEDULED


def test_skip_does_nothing_when_the_run_ended_before_the_next_occurrence() -> None:
    plan = finish(spec(Overlap.SKIP), running(T0), now=T0 + 0.4 * S)
    assert plan.overlap_skipped == ()
    assert plan.scheduled_for == T0 + S


def test_a_very_long_run_under_a_fast_cron_records_a_capped_number_and_counts_the_rest() -> None:
    plan = finish(spec(Overlap.SKIP), running(T0), now=T0 + 1000.5 * S)
    assert len(plan.overlap_skipped) == OVERLAP_RECORD_CAP
    assert plan.overlap_skipped[0] == T0 + S
    assert plan.overlap_unrecorded == 1000 - OVERLAP_RECORD_CAP
    assert plan.scheduled_for == T0 + 1001 * S


def test_skip_also_applies_when_the_occurrence_ended_in_failure_after_its_retries() -> None:
    sp = spec(Overlap.SKIP, retry=RetryPolicy(max_attempts=1))
    plan = finish(sp, running(T0), now=T0 + 2.5 * S, outcome=Outcome.FAILED)
    assert plan.overlap_skipped == (T0 + S, T0 + 2 * S)
    assert plan.scheduled_for == T0 + 3 * S


def test_a_retry_is_not_an_overlap_decision_yet() -> None:
    # the occurrence is not over: the row waits for its retry, nothing is skipped yet
    plan = finish(spec(Overlap.SKIP), running(T0), now=T0 + 5.5 * S, outcome=Outcome.FAILED)
    assert plan.overlap_skipped == () and plan.scheduled_for == T0 and plan.next_run_at is not None
    assert plan.attempt == 1


# ---------------------------------------------------------------------------- buffer_one


def test_buffer_one_runs_the_first_that_came_due_at_once_and_skips_the_rest() -> None:
    now = T0 + 3.5 * S
    plan = finish(spec(Overlap.BUFFER_ONE), running(T0), now=now)
    assert plan.scheduled_for == T0 + S and plan.next_run_at == now
    assert plan.overlap_skipped == (T0 + 2 * S, T0 + 3 * S)
    assert plan.handed_upto == T0 + 3 * S


def test_buffer_one_goes_on_after_what_it_skipped_and_never_records_one_twice() -> None:
    sp = spec(Overlap.BUFFER_ONE)
    first = finish(sp, running(T0), now=T0 + 3.5 * S)  # buffered T0+1, skipped +2, +3
    # the buffered run started at T0+3.5 and took 3 s more: +4, +5, +6 came due meanwhile
    second = finish(sp, replace(first, overlap_skipped=()), now=T0 + 6.5 * S)
    assert second.scheduled_for == T0 + 4 * S and second.next_run_at == T0 + 6.5 * S
    assert second.overlap_skipped == (T0 + 5 * S, T0 + 6 * S)
    # and when a buffered run ends in time, the schedule simply goes on after the skipped ones
    third = finish(sp, replace(second, overlap_skipped=()), now=T0 + 6.6 * S)
    assert third.scheduled_for == T0 + 7 * S and third.overlap_skipped == ()
    assert third.handed_upto is None


def test_buffer_one_with_only_one_due_skips_nothing() -> None:
    plan = finish(spec(Overlap.BUFFER_ONE), running(T0), now=T0 + 1.5 * S)
    assert plan.scheduled_for == T0 + S and plan.overlap_skipped == () and plan.handed_upto is None


def test_a_trigger_queued_behind_a_buffered_run_does_not_record_skips_twice() -> None:
    sp = spec(Overlap.BUFFER_ONE)
    plan = replace(running(T0), pending_triggers=(T0 + 0.2 * S,))
    after = finish(sp, plan, now=T0 + 3.5 * S)
    # the trigger steps in front; the buffered occurrence (T0+1) waits behind it as resume_at
    assert after.run_kind == "manual" and after.resume_at == T0 + S
    assert after.overlap_skipped == (T0 + 2 * S, T0 + 3 * S)
    manual_done = finish(sp, replace(after, overlap_skipped=()), now=T0 + 3.7 * S)
    assert manual_done.scheduled_for == T0 + S  # the buffered one, still owed
    assert manual_done.overlap_skipped == ()  # +2 and +3 were recorded already


# ---------------------------------------------------------------------------- allow


def test_allow_leaves_late_occurrences_to_the_misfire_policy_and_marks_where_to_split() -> None:
    sp = spec(Overlap.ALLOW)
    plan = finish(sp, running(T0), now=T0 + 3.5 * S)
    assert plan.overlap_skipped == () and plan.scheduled_for == T0 + S
    # while a run of occurrence T0 is in flight, the next one (T0+1) must start beside it
    assert split_point(sp, running(T0)) == T0 + S
    # once T0+1 was handed to a row of its own, the next split is T0+2 and the row goes on after
    handed = running(T0, handed_upto=T0 + S)
    assert split_point(sp, handed) == T0 + 2 * S
    assert finish(sp, handed, now=T0 + 1.2 * S).scheduled_for == T0 + 2 * S


@pytest.mark.parametrize(
    "sp, plan",
    [
        (spec(Overlap.SKIP), running(T0)),
        (spec(Overlap.BUFFER_ONE), running(T0)),
        (
            JobSpec(target=WebhookTarget(url="https://e.com"), schedule=OneOffSchedule(T0)),
            running(T0),
        ),
        (spec(Overlap.ALLOW), replace(running(T0), state=JobState.PAUSED)),
        (spec(Overlap.ALLOW), start_manual(running(T0), T0)),
    ],
)
def test_only_scheduled_runs_of_allow_crons_split(sp: JobSpec, plan: RowPlan) -> None:
    assert split_point(sp, plan) is None


def test_an_occurrence_row_retries_and_then_goes() -> None:
    sp = spec(Overlap.ALLOW, retry=RetryPolicy(max_attempts=2))
    row = running(T0)
    retried = after_occurrence_attempt(sp, row, attempt=1, outcome=Outcome.FAILED, retryable=True, now=T0)
    assert retried is not None and retried.attempt == 1 and retried.next_run_at is not None
    assert retried.scheduled_for == T0  # it never moves on to another occurrence
    assert (
        after_occurrence_attempt(sp, row, attempt=2, outcome=Outcome.FAILED, retryable=True, now=T0) is None
    )
    assert (
        after_occurrence_attempt(sp, row, attempt=1, outcome=Outcome.SUCCEEDED, retryable=False, now=T0)
        is None
    )
    cancelled = replace(row, state=JobState.CANCELLED)
    assert (
        after_occurrence_attempt(sp, cancelled, attempt=1, outcome=Outcome.FAILED, retryable=True, now=T0)
        is None
    )


# ---------------------------------------------------------------------------- backfill


def test_backfill_under_allow_is_paced() -> None:
    runs = plan_backfill(
        spec(Overlap.ALLOW, cron="0 * * * *"),
        T0 - timedelta(hours=5),
        T0,
        T0 + 30 * S,
        max_occurrences=1000,
        pace_per_s=4.0,
        chain_busy=False,
    )
    assert [r.scheduled_for for r in runs] == [T0 - timedelta(hours=h) for h in (5, 4, 3, 2, 1)]
    assert [r.due_at for r in runs] == [T0 + 30 * S + timedelta(seconds=i / 4) for i in range(5)]


def test_backfill_range_is_from_inclusive_to_exclusive_and_never_after_now() -> None:
    sp = spec(Overlap.ALLOW, cron="0 * * * *")
    runs = plan_backfill(
        sp,
        T0 - timedelta(hours=2),
        T0 + timedelta(hours=3),
        T0,
        max_occurrences=10,
        pace_per_s=1,
        chain_busy=False,
    )
    assert [r.scheduled_for for r in runs] == [T0 - timedelta(hours=2), T0 - timedelta(hours=1), T0]
    runs = plan_backfill(
        sp,
        T0 - timedelta(hours=2),
        T0,
        T0 + timedelta(days=1),
        max_occurrences=10,
        pace_per_s=1,
        chain_busy=False,
    )
    assert [r.scheduled_for for r in runs] == [T0 - timedelta(hours=2), T0 - timedelta(hours=1)]


@pytest.mark.parametrize("overlap", [Overlap.SKIP, Overlap.BUFFER_ONE])
def test_backfill_without_overlap_runs_one_at_a_time(overlap: Overlap) -> None:
    sp = spec(overlap, cron="0 * * * *")
    runs = plan_backfill(
        sp, T0 - timedelta(hours=3), T0, T0, max_occurrences=10, pace_per_s=100, chain_busy=False
    )
    assert [r.due_at for r in runs] == [T0, None, None]
    busy = plan_backfill(
        sp, T0 - timedelta(hours=3), T0, T0, max_occurrences=10, pace_per_s=100, chain_busy=True
    )
    assert [r.due_at for r in busy] == [None, None, None]


def test_backfill_refusals_say_what_to_do() -> None:
    sp = spec(Overlap.ALLOW, cron="* * * * *")
    with pytest.raises(InvalidRequest) as too_many:
        plan_backfill(
            sp, T0 - timedelta(hours=2), T0, T0, max_occurrences=100, pace_per_s=1, chain_busy=False
        )
    assert too_many.value.code == "backfill_too_large" and "at most 100" in too_many.value.message
    with pytest.raises(InvalidRequest) as backwards:
        plan_backfill(sp, T0, T0, T0, max_occurrences=100, pace_per_s=1, chain_busy=False)
    assert backwards.value.field == "to"
    one_off = JobSpec(target=WebhookTarget(url="https://e.com"), schedule=OneOffSchedule(T0))
    with pytest.raises(InvalidRequest) as not_recurring:
        plan_backfill(one_off, T0 - S, T0, T0, max_occurrences=100, pace_per_s=1, chain_busy=False)
    assert not_recurring.value.code == "not_recurring" and "trigger" in not_recurring.value.message
