"""Backfill: which past occurrences of a recurring job to run again, and when each may start. Pure.

A backfill is a list of *occurrence rows* (see storage migration 0003): each runs one occurrence,
with that occurrence's own ``scheduled_for`` and therefore its own Idempotency-Key
(``<job id>:<scheduled_for>``), through the same claim, fence, retry and history as any run.

Pacing keeps a large backfill from starving other work: under ``overlap=allow`` the runs are
spread at ``pace_per_s``; under ``skip`` and ``buffer_one`` (runs of the job never overlap) they
go one at a time, each released when the one before it ends, so they are paced by the target.
The fair run queue then gives every owner its turn whatever one owner backfills.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from duetime.core.errors import Conflict, InvalidRequest
from duetime.core.model import CronSchedule, IntervalSchedule, JobSpec, Overlap
from duetime.core.schedule import next_occurrence
from duetime.core.workbudget import WorkBudget, WorkExhausted

_TINY = timedelta(microseconds=1)
# The search steps (core.workbudget) one backfill may spend finding its occurrences: 1,000
# occurrences of any cron that fires at least yearly take a few thousand. The search runs in the
# store's transaction, under the job's row lock, so a range a cron crosses only in centuries
# (``from`` in year 2 with a cron that fires once in years) is refused, not searched for seconds.
BACKFILL_MAX_STEPS = 8_000


@dataclass(frozen=True, slots=True)
class BackfillRun:
    scheduled_for: datetime
    due_at: datetime | None  # None: waits until the backfilled run before it has ended


def plan_backfill(
    spec: JobSpec,
    start: datetime,
    end: datetime,
    now: datetime,
    *,
    max_occurrences: int,
    pace_per_s: float,
    chain_busy: bool,
) -> list[BackfillRun]:
    """The occurrences in [start, end) that are not after ``now``, oldest first, with their start.

    ``chain_busy``: an earlier backfill of this job (skip/buffer_one) still has runs waiting, so
    these join the end of its line instead of starting a second one.
    """
    schedule = spec.schedule
    if not isinstance(schedule, CronSchedule | IntervalSchedule):
        raise InvalidRequest(
            "only a recurring (cron or every) job can be backfilled; a one-off job has a single run "
            "(use POST /v1/jobs/{id}/trigger for an extra run)",
            code="not_recurring",
            field="schedule",
        )
    if end <= start:
        raise InvalidRequest(
            f"'to' ({end.isoformat()}) must be after 'from' ({start.isoformat()}); "
            "the range is from inclusive, to exclusive",
            code="invalid_value",
            field="to",
        )
    # Occurrences later than the request are not backfilled: the schedule runs them itself.
    last = min(end - _TINY, now)
    found: list[datetime] = []
    budget = WorkBudget(BACKFILL_MAX_STEPS)
    try:
        occ = next_occurrence(schedule, start - _TINY, budget)
        while occ is not None and occ <= last:
            if len(found) == max_occurrences:
                raise InvalidRequest(
                    f"the range holds more than {max_occurrences} occurrences; backfill at most "
                    f"{max_occurrences} at a time (ask for a shorter range, then the next one)",
                    code="backfill_too_large",
                    field="to",
                )
            found.append(occ)
            occ = next_occurrence(schedule, occ, budget)
    except WorkExhausted:
        reached = f" (the search had reached {found[-1].isoformat()})" if found else ""
        raise InvalidRequest(
            f"finding this range's occurrences takes more than the {BACKFILL_MAX_STEPS} search steps "
            f"one backfill may use{reached}: the schedule fires rarely over a long range; ask for a "
            f"shorter range, starting nearer the first occurrence you want",
            code="backfill_too_large",
            field="from",
        ) from None
    if spec.overlap is Overlap.ALLOW:
        step = 1.0 / pace_per_s
        return [BackfillRun(o, now + timedelta(seconds=i * step)) for i, o in enumerate(found)]
    return [BackfillRun(o, now if i == 0 and not chain_busy else None) for i, o in enumerate(found)]


def require_room(pending: int, wanted: int, max_occurrences: int) -> None:
    """At most ``max_occurrences`` backfilled or overlapping runs of one job wait at a time: the
    bound that keeps one owner's backfill from flooding a shard. Both stores ask this one rule."""
    if pending + wanted > max_occurrences:
        raise Conflict(
            f"this job has {pending} backfilled or overlapping runs not finished yet and at "
            f"most {max_occurrences} may wait at a time; wait for them, or ask for at most "
            f"{max(max_occurrences - pending, 0)} occurrences",
            code="backfill_in_progress",
        )
