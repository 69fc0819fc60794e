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

Two questions are asked of a late row:

- Is it later than its grace (``misfire_grace_s``)? Then it is *missed* and the job's ``misfire``
  policy applies: ``run_once`` runs the latest missed occurrence, ``skip`` records them skipped,
  ``run_all`` runs them all.
- Is more than one occurrence already due (the row is at least one schedule step behind)? Then the
  occurrences that are to run (``run_all``'s, or every late one still inside the grace) are a
  *catch-up*: they start at once, as fast as the overlap policy allows, and the job's own row moves
  on to its first occurrence that is not due yet, so it is on time from there on. Running them one
  by one on the job's row instead (one per claim round) would keep the job exactly as late as the
  outage was, for good, whenever the schedule is as fast as the claim rounds.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from duetime.core.model import CronSchedule, IntervalSchedule, JobSpec, Misfire, Overlap
from duetime.core.schedule import count_between, latest_at_or_before, next_occurrence

_TINY = timedelta(microseconds=1)

MISSED_SQL = (
    "j.run_kind = 'scheduled' AND j.attempt = 0 AND j.parent_id IS NULL\n"
    "AND (j.next_run_at < now() - make_interval(secs => (j.spec->>'misfire_grace_s')::int)\n"
    "OR (j.next_run_at <= now() - interval '1 second'\n"
    "AND COALESCE(j.spec->'schedule' ?| array['cron', 'every'], false)))"
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
    recurring: bool = False,
) -> bool:
    """Whether a row claimed at ``now`` must be judged here: the first attempt of a regular
    occurrence of the job's own row, due longer than the job's grace ago (missed), or, for a
    recurring job, a second or more ago (a schedule step behind: maybe a catch-up)."""
    return (
        run_kind == "scheduled"
        and attempt == 0
        and parent_id is None
        and (
            next_run_at < now - timedelta(seconds=grace_s)
            or (recurring and next_run_at <= now - timedelta(seconds=1))
        )
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


@dataclass(frozen=True, slots=True)
class CatchUp:
    """Start every occurrence of ``runs`` now, each in a run of its own, and move the job's row on.

    ``chained``: the overlap policy (skip, buffer_one) forbids runs of the job side by side, so
    the runs go back to back, each released when the one before it ends; under ``allow`` they all
    start together. ``skipped`` (and ``unrecorded`` more) are older occurrences past the cap.
    """

    runs: tuple[datetime, ...]
    next_scheduled_for: datetime | None
    chained: bool
    skipped: tuple[datetime, ...] = ()
    unrecorded: int = 0


Decision = FireNow | SkipTo | CatchUp


def decide(
    spec: JobSpec,
    scheduled_for: datetime,
    now: datetime,
    *,
    due_at: datetime | None = None,
    deferred: bool = False,
    spread: timedelta = timedelta(0),
    run_all_cap: int = 100,
    record_cap: int = 100,
) -> Decision:
    """The decision for a row claimed at ``now`` whose occurrence is ``scheduled_for``.

    ``due_at`` is when the row was due (the occurrence plus the job's spread and jitter); it is
    missed when that is more than the grace ago. Without it the row is taken as missed.

    ``spread`` is the job's fixed offset (``core.jitter.spread``): an occurrence is due only once
    its time plus the spread has passed, so the schedule is walked against ``now - spread``. A
    catch-up or run_once then never starts an occurrence before its spread time.

    ``deferred``: the row was made due later than its occurrence's own time on purpose (the run
    buffer_one kept for after a long run); the occurrences between were already passed over by
    the overlap policy, so there is no backlog to catch up, only this one run.
    """
    threshold = now - timedelta(seconds=spec.misfire_grace_s)
    missed = due_at is None or due_at < threshold
    # The same two instants on the schedule's own (nominal) times.
    nominal_now, nominal_threshold = now - spread, threshold - spread
    schedule = spec.schedule
    if not isinstance(schedule, CronSchedule | IntervalSchedule):
        if missed and spec.misfire is Misfire.SKIP:
            return SkipTo((scheduled_for,), None)
        return FireNow(scheduled_for)

    if deferred and (not missed or spec.misfire is Misfire.RUN_ALL):
        return FireNow(scheduled_for)
    if not missed or spec.misfire is Misfire.RUN_ALL:
        return _catch_up(spec, schedule, scheduled_for, nominal_now, cap=run_all_cap, record_cap=record_cap)

    if spec.misfire is Misfire.RUN_ONCE:
        latest = latest_at_or_before(schedule, nominal_now, scheduled_for)
        return FireNow(latest or scheduled_for)

    skipped = [scheduled_for]
    cursor = scheduled_for
    while len(skipped) < record_cap:
        nxt = next_occurrence(schedule, cursor)
        if nxt is None or nxt > nominal_threshold:
            break
        skipped.append(nxt)
        cursor = nxt
    following = next_occurrence(schedule, nominal_threshold)
    unrecorded = 0
    if len(skipped) == record_cap and following is not None:
        unrecorded = max(count_between(schedule, skipped[-1], nominal_threshold, 10_000_000), 0)
    return SkipTo(tuple(skipped), following, unrecorded)


def _catch_up(
    spec: JobSpec,
    schedule: CronSchedule | IntervalSchedule,
    scheduled_for: datetime,
    now: datetime,
    *,
    cap: int,
    record_cap: int,
) -> Decision:
    """Every occurrence from ``scheduled_for`` to ``now`` runs, at most ``cap`` of them (the
    latest); older ones beyond the cap are skipped and recorded, so a long outage cannot bury a
    job in backlog."""
    cap = max(cap, 1)
    later = count_between(schedule, scheduled_for, now, cap)
    if later == 0:
        return FireNow(scheduled_for)  # one occurrence due: the row runs it itself
    skipped: list[datetime] = []
    unrecorded = 0
    first_kept = scheduled_for
    if later + 1 > cap:
        keep_from = now
        for _ in range(cap):
            prev = latest_at_or_before(schedule, keep_from, scheduled_for)
            assert prev is not None  # at least cap + 1 occurrences lie in [scheduled_for, now]
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
        if len(skipped) == record_cap:
            unrecorded = count_between(schedule, skipped[-1], first_kept - _TINY, 10_000_000)
    runs = [first_kept]
    while len(runs) < cap:
        nxt = next_occurrence(schedule, runs[-1])
        if nxt is None or nxt > now:
            break
        runs.append(nxt)
    return CatchUp(
        runs=tuple(runs),
        next_scheduled_for=next_occurrence(schedule, runs[-1]),
        chained=spec.overlap is not Overlap.ALLOW,
        skipped=tuple(skipped),
        unrecorded=unrecorded,
    )
