"""The job state machine: what a row becomes after each event of its run path. Pure.

Storage reads the locked rows, calls these functions, and writes the results in the same
transaction, so the rule for "what happens next" lives here once and is tested with a fake clock.
The diagram and the table of transitions are in docs/state-machine.md.

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
from datetime import datetime

from core import jitter, retry
from core.model import CronSchedule, JobSpec, JobState, OneOffSchedule, Outcome
from core.schedule import next_occurrence

#: Which owner actions are allowed from which state; anything else answers 409.
OWNER_TRANSITIONS: dict[str, frozenset[JobState]] = {
    "update": frozenset({JobState.SCHEDULED, JobState.PAUSED, JobState.DEAD}),
    "pause": frozenset({JobState.SCHEDULED, JobState.PAUSED}),
    "resume": frozenset({JobState.SCHEDULED, JobState.PAUSED}),
    "trigger": frozenset({JobState.SCHEDULED}),
    "replay": frozenset({JobState.DEAD}),
    "cancel": frozenset(JobState),
}


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


def _regular(job_id: uuid.UUID, spec: JobSpec, occurrence: datetime | None, state: JobState) -> RowPlan:
    if occurrence is None:
        return RowPlan(state=state, next_run_at=None, scheduled_for=None, attempt=0)
    return RowPlan(
        state=state,
        next_run_at=jitter.due_at(job_id, occurrence, spec.jitter_s),
        scheduled_for=occurrence,
        attempt=0,
    )


def initial_plan(job_id: uuid.UUID, spec: JobSpec, now: datetime) -> RowPlan:
    """The row of a new job, or of a job whose schedule was just replaced."""
    schedule = spec.schedule
    if isinstance(schedule, OneOffSchedule):
        plan = _regular(job_id, spec, schedule.run_at, JobState.SCHEDULED)
        # A run_at in the past runs at once; it is due now, not "missed".
        if plan.next_run_at is not None and plan.next_run_at < now:
            plan = replace(plan, next_run_at=now)
        return plan
    from core.schedule import first_occurrence

    first = first_occurrence(schedule, now)
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


def _after_final(job_id: uuid.UUID, spec: JobSpec, plan: RowPlan, succeeded: bool) -> RowPlan:
    """The occurrence is over (succeeded, dead-lettered, or failed for good): what comes next."""
    if plan.run_kind == "manual":
        base = _regular(job_id, spec, plan.resume_at, plan.state)
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
        assert isinstance(spec.schedule, CronSchedule)
        following = next_occurrence(spec.schedule, plan.scheduled_for) if plan.scheduled_for else None
        base = _regular(job_id, spec, following, JobState.SCHEDULED if following else JobState.COMPLETED)
    base = replace(base, pending_triggers=plan.pending_triggers)
    if base.pending_triggers and base.state == JobState.SCHEDULED:
        first, rest = base.pending_triggers[0], base.pending_triggers[1:]
        base = replace(start_manual(base, first), pending_triggers=rest)
    return base


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
) -> RowPlan:
    """What the row becomes after attempt number ``attempt`` of its current run ended.

    ``plan.state`` is the row's state *now* (an owner may have paused or cancelled it while the
    call was in flight); a cancelled job stays cancelled and a paused one stays paused, but the
    occurrence still advances so a resume does not run it a second time.
    """
    succeeded = outcome is Outcome.SUCCEEDED
    plan = replace(plan, attempt=attempt)
    retry_left = retryable and attempt < spec.retry.max_attempts
    if not succeeded and outcome is not Outcome.SKIPPED and retry_left:
        return replace(plan, next_run_at=retry.next_retry_at(spec.retry, attempt, now, rng))
    owner_state = plan.state
    nxt = _after_final(job_id, spec, replace(plan, state=JobState.SCHEDULED), succeeded)
    if owner_state == JobState.CANCELLED:
        return replace(nxt, state=JobState.CANCELLED, next_run_at=None)
    if owner_state == JobState.PAUSED and nxt.state == JobState.SCHEDULED:
        return replace(nxt, state=JobState.PAUSED)
    return nxt
