"""What to do with an occurrence claimed later than its grace. Pure: time is an argument.

Applied at claim time, so the same rule covers an outage, a paused job that was resumed, and an
engine that fell behind. Only a run's first attempt of a regular occurrence is judged; retries and
manual triggers are never "missed".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from duetime.core.model import CronSchedule, JobSpec, Misfire
from duetime.core.schedule import count_between, latest_at_or_before, next_occurrence

_TINY = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class FireNow:
    """Fire this occurrence now (for run_once, the most recent missed one)."""

    scheduled_for: datetime


@dataclass(frozen=True, slots=True)
class SkipTo:
    """Record ``skipped`` (oldest first, at most the recording cap) and move on to ``next``."""

    skipped: tuple[datetime, ...]
    next_scheduled_for: datetime | None
    unrecorded: int = 0  # skipped occurrences past the recording cap (counted, not written)


Decision = FireNow | SkipTo


def decide(
    spec: JobSpec,
    scheduled_for: datetime,
    now: datetime,
    *,
    run_all_cap: int = 100,
    record_cap: int = 100,
) -> Decision:
    threshold = now - timedelta(seconds=spec.misfire_grace_s)
    schedule = spec.schedule
    if not isinstance(schedule, CronSchedule):
        if spec.misfire is Misfire.SKIP:
            return SkipTo((scheduled_for,), None)
        return FireNow(scheduled_for)

    if spec.misfire is Misfire.RUN_ONCE:
        latest = latest_at_or_before(schedule, now, scheduled_for)
        return FireNow(latest or scheduled_for)

    if spec.misfire is Misfire.SKIP:
        skipped = [scheduled_for]
        cursor = scheduled_for
        while len(skipped) < record_cap:
            nxt = next_occurrence(schedule, cursor)
            if nxt is None or nxt > threshold:
                break
            skipped.append(nxt)
            cursor = nxt
        following = next_occurrence(schedule, threshold)
        unrecorded = 0
        if len(skipped) == record_cap and following is not None:
            unrecorded = max(count_between(schedule, skipped[-1], threshold, 10_000_000), 0)
        return SkipTo(tuple(skipped), following, unrecorded)

    # run_all: every missed occurrence runs, oldest first, but at most run_all_cap of them; older
    # ones beyond the cap are skipped (and recorded) so a long outage cannot bury a job in backlog.
    missed_after = count_between(schedule, scheduled_for, now, run_all_cap)
    if missed_after + 1 <= run_all_cap:
        return FireNow(scheduled_for)
    keep_from = now
    for _ in range(run_all_cap):
        prev = latest_at_or_before(schedule, keep_from, scheduled_for)
        if prev is None:
            return FireNow(scheduled_for)
        keep_from = prev - _TINY
    first_kept = keep_from + _TINY
    skipped = [scheduled_for]
    cursor = scheduled_for
    while len(skipped) < record_cap:
        nxt = next_occurrence(schedule, cursor)
        if nxt is None or nxt >= first_kept:
            break
        skipped.append(nxt)
        cursor = nxt
    return SkipTo(tuple(skipped), first_kept)
