"""The job state machine: what a row becomes after each event of its run path. Pure.

Storage reads the locked rows, calls these functions, and writes the results in the same
transaction, so the rule for "what happens next" lives here once and is tested with a fake clock.
Which owner action is allowed in which state, and which run-path event may take a row in which
phase, are the tables of ``core.states``; docs/state-machine.md draws them.

Owner-facing transitions (API):            Run path (engine/workers), per row:
  scheduled ─pause→ paused ─resume→ scheduled     idle ─claim→ claimed ─fence→ running ─complete→ idle
  scheduled|paused ─DELETE→ cancelled             claimed ─release/revoke→ idle
  dead ─replay→ scheduled                         claimed|running ─lease lapses→ idle (janitor)
  scheduled ─last run succeeds→ completed (one-off)
  scheduled ─attempts run out→ dead (one-off)
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from duetime.core import jitter, retry, states
from duetime.core.model import (
    CronSchedule,
    IntervalSchedule,
    JobSpec,
    JobState,
    OneOffSchedule,
    Outcome,
    Overlap,
)
from duetime.core.schedule import count_between, latest_at_or_before, next_occurrence

#: At most this many occurrences passed over by an overlap policy are written to the history one
#: by one; the last one written says how many more there were.
OVERLAP_RECORD_CAP = 100

#: Re-exported from the table it is drawn from (``core.states``).
OWNER_TRANSITIONS = states.OWNER_TRANSITIONS

OVERLAP_SKIP_REASON = "skipped: the previous run of this job was still in flight (overlap policy {policy})"


@dataclass(frozen=True, slots=True)
class RowPlan:
    """The scheduling columns of a job row: the run it will do next."""

    state: JobState
    next_run_at: datetime | None
    scheduled_for: datetime | None
    attempt: int
    run_kind: str = "scheduled"  # "scheduled" or "manual" (a trigger)
    resume_at: datetime | None = None  # the regular occurrence a manual run stepped in front of
    pending_triggers: tuple[datetime, ...] = field(default_factory=tuple)
    # overlap=allow: the latest occurrence already handed to a run of its own while this row's
    # run was in flight; the schedule goes on after it.
    handed_upto: datetime | None = None
    # Output only, never stored: occurrences this plan passed over because they came due while
    # the previous run was in flight (overlap skip/buffer_one). The writer records them skipped.
    overlap_skipped: tuple[datetime, ...] = field(default_factory=tuple)
    overlap_unrecorded: int = 0
    # Output only, never stored: this plan is a retry of the same occurrence (it is not over), so
    # the failure count (core.failures) waits for its last attempt.
    retrying: bool = field(default=False, compare=False)


def _regular(job_id: uuid.UUID, spec: JobSpec, occurrence: datetime | None, state: JobState) -> RowPlan:
    if occurrence is None:
        return RowPlan(state=state, next_run_at=None, scheduled_for=None, attempt=0)
    return RowPlan(
        state=state,
        next_run_at=jitter.due_at(job_id, occurrence, spec),
        scheduled_for=occurrence,
        attempt=0,
    )


def initial_plan(job_id: uuid.UUID, spec: JobSpec, now: datetime) -> RowPlan:
    """The row of a new job, or of a job whose schedule was just replaced.

    A spread job's timeline is its schedule moved by its fixed offset, so its first occurrence is
    the first whose *spread time* is after ``now`` (an hourly job created at 10:30 whose offset
    is 50 minutes runs the 10:00 occurrence at 10:50), the same rule as the job's preview and
    the misfire policy's."""
    schedule = spec.schedule
    if isinstance(schedule, OneOffSchedule):
        plan = _regular(job_id, spec, schedule.run_at, JobState.SCHEDULED)
        # A run_at in the past runs at once; it is due now, not "missed".
        if plan.next_run_at is not None and plan.next_run_at < now:
            plan = replace(plan, next_run_at=now)
        return plan
    from duetime.core.schedule import first_occurrence

    first = first_occurrence(schedule, now - jitter.spread(job_id, spec))
    return _regular(job_id, spec, first, JobState.SCHEDULED if first else JobState.COMPLETED)


def start_manual(plan: RowPlan, now: datetime) -> RowPlan:
    """A trigger: when the row is free, the manual run steps in front of the regular one."""
    return replace(
        plan,
        run_kind="manual",
        resume_at=plan.scheduled_for,
        scheduled_for=now,
        next_run_at=now,
        attempt=0,
    )


def split_point(spec: JobSpec, plan: RowPlan) -> datetime | None:
    """overlap=allow: the occurrence at which a run still in flight must make way.

    Stored on the row (``split_at``) so the engine can find, with one index range scan, the rows
    whose next occurrence comes due while their current run is in flight, and start that
    occurrence in a row of its own. None for everything else: one-offs, other policies, manual
    runs (a trigger steps in front of the schedule, it does not run beside it).
    """
    schedule = spec.schedule
    if (
        spec.overlap is not Overlap.ALLOW
        or not isinstance(schedule, CronSchedule | IntervalSchedule)
        or plan.state is not JobState.SCHEDULED
        or plan.run_kind != "scheduled"
        or plan.scheduled_for is None
    ):
        return None
    after = plan.scheduled_for
    if plan.handed_upto is not None and plan.handed_upto > after:
        after = plan.handed_upto
    return next_occurrence(schedule, after)


@dataclass(frozen=True, slots=True)
class _Overdue:
    came: list[datetime]  # the first OVERLAP_RECORD_CAP occurrences already due
    more: int  # how many more were due
    last: datetime | None  # the last occurrence that was due
    following: datetime | None  # the first occurrence not yet due


def _overlapping(
    job_id: uuid.UUID, spec: JobSpec, first: datetime, now: datetime, done_upto: datetime | None
) -> _Overdue:
    """Occurrences from ``first`` on that were already due at ``now``, leaving out those after
    ``first`` up to ``done_upto`` (already run or recorded)."""
    schedule = spec.schedule
    came: list[datetime] = []
    more = 0
    last: datetime | None = None
    occ: datetime | None = first
    while occ is not None and jitter.due_at(job_id, occ, spec) <= now:
        if len(came) == OVERLAP_RECORD_CAP:
            # A long run under a fast cron: count the rest instead of walking them one by one.
            # Every occurrence up to here is due whatever its jitter (the spread is the job's own).
            horizon = max(now - jitter.spread(job_id, spec) - timedelta(seconds=spec.jitter_s), came[-1])
            more = count_between(schedule, came[-1], horizon, 10_000_000)
            if more:
                last = latest_at_or_before(schedule, horizon, came[-1])
            occ = next_occurrence(schedule, horizon)
            while occ is not None and jitter.due_at(job_id, occ, spec) <= now:
                more += 1
                last = occ
                occ = next_occurrence(schedule, occ)
            break
        came.append(occ)
        last = occ
        occ = next_occurrence(schedule, occ if done_upto is None or done_upto < occ else done_upto)
    return _Overdue(came, more, last, occ)


def _later_than(floor: datetime, *candidates: datetime | None) -> datetime | None:
    """The latest candidate if it is after ``floor``, else None."""
    latest = max((c for c in candidates if c is not None), default=None)
    return latest if latest is not None and latest > floor else None


def _apply_overlap(job_id: uuid.UUID, spec: JobSpec, base: RowPlan, now: datetime | None) -> RowPlan:
    """skip / buffer_one: occurrences that came due while the run that just ended was in flight."""
    if (
        now is None
        or spec.overlap is Overlap.ALLOW
        or not isinstance(spec.schedule, CronSchedule | IntervalSchedule)
        or base.state is not JobState.SCHEDULED
        or base.scheduled_for is None
        or base.next_run_at is None
        or base.next_run_at > now
    ):
        return base
    due = _overlapping(job_id, spec, base.scheduled_for, now, base.handed_upto)
    if not due.came:
        return base
    if spec.overlap is Overlap.BUFFER_ONE:
        # The first one that came due runs now, right after the run that held it up; the rest
        # are skipped, and the schedule goes on after the last of them (handed_upto).
        return replace(
            base,
            next_run_at=now,
            scheduled_for=due.came[0],
            attempt=0,
            handed_upto=_later_than(due.came[0], due.last, base.handed_upto),
            overlap_skipped=tuple(due.came[1:]),
            overlap_unrecorded=due.more,
        )
    nxt = _regular(job_id, spec, due.following, JobState.SCHEDULED if due.following else JobState.COMPLETED)
    return replace(nxt, overlap_skipped=tuple(due.came), overlap_unrecorded=due.more)


def _after_final(
    job_id: uuid.UUID, spec: JobSpec, plan: RowPlan, succeeded: bool, now: datetime | None = None
) -> RowPlan:
    """The occurrence is over (succeeded, dead-lettered, or failed for good): what comes next."""
    if plan.run_kind == "manual":
        base = replace(_regular(job_id, spec, plan.resume_at, plan.state), handed_upto=plan.handed_upto)
        if plan.resume_at is None and isinstance(spec.schedule, OneOffSchedule):
            base = replace(base, state=JobState.COMPLETED)
    elif isinstance(spec.schedule, OneOffSchedule):
        base = RowPlan(
            state=JobState.COMPLETED if succeeded else JobState.DEAD,
            next_run_at=None,
            scheduled_for=plan.scheduled_for,
            attempt=plan.attempt,
        )
    else:
        assert isinstance(spec.schedule, CronSchedule | IntervalSchedule)
        after = plan.scheduled_for
        if plan.handed_upto is not None and (after is None or plan.handed_upto > after):
            after = plan.handed_upto  # later occurrences already ran beside this one (allow)
        following = next_occurrence(spec.schedule, after) if after else None
        base = _regular(job_id, spec, following, JobState.SCHEDULED if following else JobState.COMPLETED)
    base = _apply_overlap(job_id, spec, base, now)
    if base.pending_triggers != plan.pending_triggers:  # a copy only when there is one to make
        base = replace(base, pending_triggers=plan.pending_triggers)
    if base.pending_triggers and base.state == JobState.SCHEDULED:
        first, rest = base.pending_triggers[0], base.pending_triggers[1:]
        base = replace(start_manual(base, first), pending_triggers=rest)
    return base


def _would_retry(spec: JobSpec, *, attempt: int, outcome: Outcome, retryable: bool) -> bool:
    return (
        outcome not in (Outcome.SUCCEEDED, Outcome.SKIPPED)
        and retryable
        and attempt < spec.retry.max_attempts
    )


def retry_window_exceeded(
    spec: JobSpec,
    *,
    attempt: int,
    outcome: Outcome,
    retryable: bool,
    now: datetime,
    due: datetime,
    retry_after_s: float | None = None,
) -> bool:
    """Whether this attempt's occurrence is over only because its next attempt could not start
    inside ``retry.max_duration_s`` of ``due``: it then fails with ``retry.WINDOW_EXCEEDED``."""
    return _would_retry(spec, attempt=attempt, outcome=outcome, retryable=retryable) and retry.window_closed(
        spec.retry, now, due, retry_after_s
    )


def _retried(
    spec: JobSpec,
    plan: RowPlan,
    *,
    attempt: int,
    outcome: Outcome,
    retryable: bool,
    now: datetime,
    rng: random.Random | None,
    due: datetime | None,
    retry_after_s: float | None,
) -> RowPlan | None:
    """The retry of the same occurrence after attempt ``attempt``, or None when it is over."""
    if not _would_retry(spec, attempt=attempt, outcome=outcome, retryable=retryable):
        return None
    at = retry.plan_retry(
        spec.retry,
        attempt,
        now,
        due=due or plan.scheduled_for or now,
        retry_after=retry_after_s,
        rng=rng,
    )
    return None if at is None else replace(plan, attempt=attempt, next_run_at=at, retrying=True)


def after_attempt(
    job_id: uuid.UUID,
    spec: JobSpec,
    plan: RowPlan,
    *,
    attempt: int,
    outcome: Outcome,
    retryable: bool,
    now: datetime,
    rng: random.Random | None = None,
    due: datetime | None = None,
    retry_after_s: float | None = None,
) -> RowPlan:
    """What the row becomes after attempt number ``attempt`` of its current run ended.

    ``due`` is when the occurrence was due (its jitter included): ``retry.max_duration_s`` counts
    from it. ``retry_after_s`` is the wait a 429/503 answer asked for.

    ``plan.state`` is the row's state *now* (an owner may have paused or cancelled it while the
    call was in flight); a cancelled job stays cancelled and a paused one stays paused, but the
    occurrence still advances so a resume does not run it a second time.
    """
    succeeded = outcome is Outcome.SUCCEEDED
    retried = _retried(
        spec,
        plan,
        attempt=attempt,
        outcome=outcome,
        retryable=retryable,
        now=now,
        rng=rng,
        due=due,
        retry_after_s=retry_after_s,
    )
    if retried is not None:
        return retried
    # The copies below are made only when they change something: this runs once per recorded
    # attempt, and a dataclass copy costs a few microseconds.
    if plan.attempt != attempt:
        plan = replace(plan, attempt=attempt)
    owner_state = plan.state
    if owner_state is not JobState.SCHEDULED:
        plan = replace(plan, state=JobState.SCHEDULED)
    nxt = _after_final(job_id, spec, plan, succeeded, now)
    if owner_state == JobState.CANCELLED:
        return replace(nxt, state=JobState.CANCELLED, next_run_at=None)
    if owner_state == JobState.PAUSED and nxt.state == JobState.SCHEDULED:
        return replace(nxt, state=JobState.PAUSED)
    return nxt


def ends_one_off(spec: JobSpec, plan: RowPlan, *, outcome: Outcome) -> bool:
    """Whether this attempt completes a one-off for good, with nothing else to decide.

    A succeeded attempt of a one-off's run on its schedule, on a row that is scheduled with no
    trigger waiting and no regular run to resume: ``after_attempt`` then answers the row as it
    was, completed, with no next run (its occurrence and attempt kept, no split point, nothing
    handed over), whatever else the spec says (retries, jitter and overlap do not come into a
    success of a one-off). The completion's common case is this one in a burst of one-offs, and
    its one statement writes that answer without computing the whole plan
    (``tests/pure/test_lifecycle_one_off.py`` holds the two equal).
    """
    return (
        outcome is Outcome.SUCCEEDED
        and isinstance(spec.schedule, OneOffSchedule)
        and plan.state is JobState.SCHEDULED
        and plan.run_kind == "scheduled"
        and plan.resume_at is None
        and not plan.pending_triggers
        and plan.handed_upto is None
    )


def after_occurrence_attempt(
    spec: JobSpec,
    plan: RowPlan,
    *,
    attempt: int,
    outcome: Outcome,
    retryable: bool,
    now: datetime,
    rng: random.Random | None = None,
    due: datetime | None = None,
    retry_after_s: float | None = None,
) -> RowPlan | None:
    """An occurrence row (one occurrence of a recurring job run in a row of its own, for
    overlap=allow or a backfill): its retry, or None when the occurrence is over and the row goes.

    It never advances the schedule (its parent row does that) and an owner's pause or cancel of
    the parent reaches it as its ``state``: a cancelled occurrence is not retried.
    """
    if plan.state is JobState.CANCELLED:
        return None
    return _retried(
        spec,
        plan,
        attempt=attempt,
        outcome=outcome,
        retryable=retryable,
        now=now,
        rng=rng,
        due=due,
        retry_after_s=retry_after_s,
    )


# ---------------------------------------------------------------------------------- owner actions


@dataclass(frozen=True, slots=True)
class OwnerStep:
    """What an owner action makes of a job's row: the plan to write, and whether a claimed run's
    lease is given back (``revoke``: its fence then fails, so a pause, cancel or new schedule
    stops a run already waiting in a wheel; a running call is never revoked, it finishes)."""

    plan: RowPlan
    revoke: bool


def owner_step(action: states.OwnerAction, plan: RowPlan, *, now: datetime, idle: bool) -> OwnerStep | None:
    """The row after pause, resume, cancel, trigger or replay, by the owner table
    (``core.states.OWNER_TABLE``); None for a no-op. A refused action raises its 409 here.

    ``plan.state`` is the job's state now; ``idle``: the row's phase is idle (no run claimed or in
    flight), which is when a trigger can step in front of the regular occurrence at once.
    """
    A = states.OwnerAction
    move = states.owner_move(action, plan.state)
    if move.noop:
        return None
    to = move.to if move.to is not None else plan.state
    if action is A.PAUSE:
        return OwnerStep(replace(plan, state=to), revoke=True)
    if action is A.RESUME:
        # Occurrences missed while paused are left overdue on purpose: the claim applies the
        # job's misfire policy to them, the same rule as after an outage.
        return OwnerStep(replace(plan, state=to), revoke=False)
    if action is A.CANCEL:
        return OwnerStep(replace(plan, state=to, next_run_at=None, pending_triggers=()), revoke=True)
    if action is A.REPLAY:
        return OwnerStep(
            replace(plan, state=to, attempt=0, next_run_at=now, run_kind="scheduled"), revoke=False
        )
    if action is A.TRIGGER:
        if idle and plan.attempt == 0 and plan.run_kind == "scheduled":
            return OwnerStep(start_manual(plan, now), revoke=False)
        # A run is in the wheel, in flight, or waiting for a retry: queue the trigger; it starts
        # as soon as that run's occurrence is over.
        return OwnerStep(replace(plan, pending_triggers=(*plan.pending_triggers, now)), revoke=False)
    raise ValueError(f"{action.value} is not an action on the row alone; see update_step, core.backfill")


def update_step(
    job_id: uuid.UUID, spec: JobSpec, plan: RowPlan, *, timing_changed: bool, now: datetime
) -> OwnerStep:
    """The row after a PATCH (``spec`` is the merged new spec). A new schedule or jitter starts
    over from the new schedule (queued triggers kept) and revokes a claimed run of the old one;
    a paused or dead job stays so. Anything else leaves the plan as it is. 409 where the owner
    table refuses an update."""
    states.owner_move(states.OwnerAction.UPDATE, plan.state)
    if not timing_changed:
        return OwnerStep(plan, revoke=False)
    fresh = replace(initial_plan(job_id, spec, now), pending_triggers=plan.pending_triggers)
    if plan.state in (JobState.PAUSED, JobState.DEAD) and fresh.state is JobState.SCHEDULED:
        fresh = replace(fresh, state=plan.state)
    return OwnerStep(fresh, revoke=True)
