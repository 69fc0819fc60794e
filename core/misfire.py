"""Missed occurrences: which claimed row is missed, and what its job's policy does with it. Pure.

Applied at claim time, so the same rule covers an outage, a paused job that was resumed, and an
engine that fell behind. Only the first attempt of a regular occurrence is judged; retries, manual
triggers and occurrence rows (overlap=allow, backfill: occurrences that already came due) are
never "missed".

The rule "is this row missed" is ``missed`` below. The claim statements must apply it in the
database, where the rows are (``claim_due`` and ``retake_claims`` return the spec only of missed
rows), so they carry ``MISSED_SQL``, its SQL spelling, verbatim; tests/unit/test_lifecycle.py
checks that both statements carry exactly this text, and tests/integration/test_storage.py that
the database and ``missed`` agree row by row.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from duetime.core.model import CronSchedule, JobSpec, Misfire
from duetime.core.schedule import count_between, latest_at_or_before, next_occurrence

_TINY = timedelta(microseconds=1)

MISSED_SQL = (
    "j.run_kind = 'scheduled' AND j.attempt = 0 AND j.parent_id IS NULL\n"
    "AND j.next_run_at < now() - make_interval(secs => (j.spec->>'misfire_grace_s')::int)"
)
"""``missed`` in SQL, over a row ``j`` of ``jobs`` at the database's ``now()``."""


def missed(
    *,
    run_kind: str,
    attempt: int,
    parent_id: uuid.UUID | None,
    next_run_at: datetime,
    grace_s: int,
    now: datetime,
) -> bool:
    """Whether a row claimed at ``now`` is missed: the first attempt of a regular occurrence of
    the job's own row, due longer than the job's grace ago."""
    return (
        run_kind == "scheduled"
        and attempt == 0
        and parent_id is None
        and next_run_at < now - timedelta(seconds=grace_s)
    )


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
