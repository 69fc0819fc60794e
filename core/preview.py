"""Schedule preview: the next occurrences of a schedule (or of a job) before they fire.

The preview exists so an owner can see what a cron expression means on the wall clock of its zone
*before* a DST change surprises them, so it must never disagree with the engine. It therefore
walks the schedule with the engine's own chain (``core.schedule.chain``: ``first_occurrence`` for
the first run of a job created at ``from``, then ``next_occurrence`` from each previous
*scheduled* time) and reads each instant with ``describe_instant``. Nothing here computes an
occurrence by itself; the DST labels only explain instants the engine chose.

Occurrences that a ``dst_gap: "skip"`` rule drops leave no instant behind; ``skipped_gaps`` finds
them from the zone's transitions. Occurrences on excluded days are found by ``excluded_between``,
which searches the schedule only inside the excluded ranges.

The work is bounded: a ``WorkBudget`` of ``MAX_PREVIEW_STEPS`` search steps covers the whole
answer. A schedule whose occurrences are so sparse, or whose zone-years so many, that the budget
runs out gets the occurrences found so far and ``truncated: true``, with ``resume_from``: the
``from`` of a follow-up request that carries on where this one stopped. A truncated answer rather
than a 422, because the schedule is valid (``POST /v1/jobs`` accepts it) and what was found is
correct; refusing it would make the preview disagree with registration.

Pure: no I/O, so the API can run it in a worker process.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from duetime.core.codec import format_time
from duetime.core.cron import cron_notes, parse_cron
from duetime.core.errors import DuetimeError
from duetime.core.jitter import due_at, spread
from duetime.core.model import CronSchedule, DstGap, IntervalSchedule, JobSpec, OneOffSchedule, Schedule
from duetime.core.schedule import (
    chain,
    describe_instant,
    excluded_between,
    load_zone,
    skipped_gaps,
)
from duetime.core.validation import SpecLimits, parse_preview_request
from duetime.core.workbudget import WorkBudget

__all__ = [
    "MAX_PREVIEW_STEPS",
    "Preview",
    "PreviewAnswer",
    "PreviewJob",
    "PreviewedJob",
    "SchedulePreviewRequest",
    "compute_preview",
    "preview_to_json",
    "resume_from",
    "run_preview",
    "run_schedule_preview",
]

# The search steps one preview may spend (core.workbudget): 100 occurrences of any daily or
# denser cron take a few hundred, 100 occurrences of a cron that fires once in years a few
# thousand; measured on the development machine the whole budget is at most ~35 ms of CPU.
MAX_PREVIEW_STEPS: Final = 5_000
_SECOND: Final = timedelta(seconds=1)


@dataclasses.dataclass(frozen=True, slots=True)
class Preview:
    """What a preview found, before it is written as JSON."""

    schedule: Schedule
    start: datetime
    items: list[datetime]
    has_more: bool
    skipped: list[datetime]  # transition instants whose gap a dst_gap=skip rule drops
    excluded: list[datetime] = dataclasses.field(default_factory=list)  # occurrences on excluded days
    truncated: bool = False  # the work cap stopped the preview before it was complete
    steps: int = 0  # search steps spent: the preview's cost
    spread: timedelta = timedelta(0)  # a job's fixed offset: the walk started this much before


def compute_preview(
    schedule: Schedule,
    start: datetime,
    count: int,
    budget: WorkBudget | None = None,
    offset: timedelta = timedelta(0),
) -> Preview:
    """Up to ``count`` occurrences of a job created at ``start`` with this schedule, and the gaps
    and excluded days within them, within ``budget`` (by default ``MAX_PREVIEW_STEPS``).

    A job's spread (``offset``, its fixed offset) moves the walk's start back by as much, as
    ``core.lifecycle.initial_plan`` does: the first item is the first occurrence whose spread time
    is after ``start``, the one ``next_run_at`` shows.
    """
    budget = WorkBudget(MAX_PREVIEW_STEPS) if budget is None else budget
    walk_from = start - offset
    found = chain(schedule, walk_from, count, budget)
    items, truncated = found.items, found.truncated
    # The window the lists cover: up to the last item while more follow (or the cap stopped
    # the walk), otherwise everything from ``start`` on.
    until = items[-1] if found.has_more and items else None
    skipped: list[datetime] = []
    excluded: list[datetime] = []
    if truncated and not items:
        pass  # no window to speak of
    else:
        if isinstance(schedule, CronSchedule) and schedule.dst_gap == DstGap.SKIP:
            gaps = skipped_gaps(schedule, walk_from, until, count, budget)
            skipped, truncated = gaps.items, truncated or gaps.truncated
        if isinstance(schedule, CronSchedule | IntervalSchedule) and schedule.exclude:
            dropped = excluded_between(schedule, walk_from, until, count, budget)
            excluded, truncated = dropped.items, truncated or dropped.truncated
    return Preview(
        schedule=schedule,
        start=start,
        items=items,
        has_more=found.has_more,
        skipped=skipped,
        excluded=excluded,
        truncated=truncated,
        steps=budget.spent,
        spread=offset,
    )


def _gap_walls(schedule: CronSchedule, transition: datetime) -> tuple[datetime, datetime]:
    """The wall-clock range [from, until) that a spring-forward at ``transition`` removes."""
    zone = load_zone(schedule.timezone)
    before = (transition - _SECOND).astimezone(zone).utcoffset()
    after = transition.astimezone(zone).utcoffset()
    assert before is not None and after is not None
    naive = transition.astimezone(UTC).replace(tzinfo=None)
    return naive + before, naive + after


def _first_wall_match(schedule: CronSchedule, low: datetime) -> datetime | None:
    """The first wall time the cron names at or after ``low`` (naive, on the zone's wall clock)."""
    return parse_cron(schedule.cron).next_wall_match(low, inclusive=True)


def _item_json(schedule: Schedule, instant: datetime) -> dict[str, Any]:
    described = describe_instant(schedule, instant)
    item: dict[str, Any] = {
        "at": format_time(instant),
        "local": described["local"],
        "utc_offset": described["utc_offset"],
        "abbreviation": described["abbreviation"],
        "dst": None,
    }
    if described["shifted_from_gap"]:
        assert isinstance(schedule, CronSchedule)
        gap_from, _ = _gap_walls(schedule, instant)
        nominal = _first_wall_match(schedule, gap_from)
        item["dst"] = "gap_shifted"
        item["shifted_from"] = None if nominal is None else nominal.isoformat()
    elif isinstance(schedule, CronSchedule):
        zone = load_zone(schedule.timezone)
        local = instant.astimezone(zone)
        other = local.replace(fold=1 - local.fold)
        if other.utcoffset() != local.utcoffset():  # this wall time occurs twice that day
            item["dst"] = "overlap_second" if described["second_pass"] else "overlap_first"
    return item


def _skipped_json(schedule: CronSchedule, transition: datetime) -> dict[str, Any]:
    gap_from, gap_until = _gap_walls(schedule, transition)
    nominal = _first_wall_match(schedule, gap_from)
    return {
        "at": format_time(transition),
        "local_from": gap_from.isoformat(),
        "local_until": gap_until.isoformat(),
        "first_skipped": None if nominal is None else nominal.isoformat(),
        "reason": "dst_gap_skip",
    }


def _excluded_json(schedule: Schedule, instant: datetime) -> dict[str, Any]:
    described = describe_instant(schedule, instant)
    return {
        "at": format_time(instant),
        "local": described["local"],
        "utc_offset": described["utc_offset"],
        "reason": "excluded_date",
    }


def resume_from(preview: Preview) -> datetime | None:
    """For a truncated preview: the ``from`` that lists the occurrences after the last item.

    A cron's first occurrence is strictly after ``from``, so that is the last item itself; an
    interval's is at or after the second of ``from``, and intervals are whole seconds, so one
    second on. A job's spread is added back, as the next walk takes it off. None when the
    preview is complete (or found nothing to go on from).
    """
    if not preview.truncated:
        return None
    if not preview.items:
        return None
    last = preview.items[-1] + preview.spread
    return last + _SECOND if isinstance(preview.schedule, IntervalSchedule) else last


@dataclasses.dataclass(frozen=True, slots=True)
class PreviewedJob:
    """The job a preview is of: its id (the spread and jitter hash it) and its spec."""

    job_id: uuid.UUID
    spec: JobSpec


def preview_to_json(preview: Preview, job: PreviewedJob | None = None) -> dict[str, Any]:
    """The answer body; with ``job`` each item also says when it is due (spread and jitter)."""
    schedule = preview.schedule
    items = []
    for instant in preview.items:
        item = _item_json(schedule, instant)
        if job is not None:
            item["due_at"] = format_time(due_at(job.job_id, instant, job.spec))
        items.append(item)
    warnings = cron_notes(schedule.cron) if isinstance(schedule, CronSchedule) else []
    resume = resume_from(preview)
    if preview.truncated:
        warnings = [
            *warnings,
            f"this preview stopped after {MAX_PREVIEW_STEPS} search steps, the server's cap on one "
            f"preview's work: it lists {len(preview.items)} of the occurrences asked for"
            + (
                f"; ask again with from={format_time(resume)} for the ones after"
                if resume is not None
                else ""
            ),
        ]
    return {
        "timezone": "UTC" if isinstance(schedule, OneOffSchedule) else schedule.timezone,
        "from": format_time(preview.start),
        "items": items,
        "has_more": preview.has_more,
        "truncated": preview.truncated,
        "resume_from": None if resume is None else format_time(resume),
        "skipped": [
            _skipped_json(schedule, t) for t in preview.skipped if isinstance(schedule, CronSchedule)
        ],
        "excluded": [_excluded_json(schedule, t) for t in preview.excluded],
        "warnings": warnings,
    }


@dataclasses.dataclass(frozen=True, slots=True)
class PreviewJob:
    """A job's preview to compute, as sent to a worker process (picklable)."""

    schedule: Schedule
    start: datetime
    count: int
    job: PreviewedJob | None = None  # items then carry due_at, and the walk the job's spread


@dataclasses.dataclass(frozen=True, slots=True)
class SchedulePreviewRequest:
    """The decoded body of ``POST /v1/schedules/preview``, as sent to a worker process: judging
    the schedule searches it too (is there a first occurrence?), so that happens there as well."""

    data: object
    now: datetime
    limits: SpecLimits
    max_count: int
    default_count: int


@dataclasses.dataclass(frozen=True, slots=True)
class PreviewAnswer:
    """The answer body, or the error that refused the request, and what either cost in steps."""

    body: dict[str, Any] | None
    steps: int
    error: DuetimeError | None = None


def run_preview(work: PreviewJob) -> PreviewAnswer:
    """Compute and render a job's preview: run by the API's worker processes."""
    offset = timedelta(0) if work.job is None else spread(work.job.job_id, work.job.spec)
    preview = compute_preview(work.schedule, work.start, work.count, offset=offset)
    return PreviewAnswer(preview_to_json(preview, work.job), preview.steps)


def run_schedule_preview(request: SchedulePreviewRequest) -> PreviewAnswer:
    """Judge a preview request's schedule as ``POST /v1/jobs`` would, then compute and render
    the preview: run by the API's worker processes. A refusal comes back as ``error``."""
    checks = WorkBudget()
    try:
        schedule, count, start = parse_preview_request(
            request.data,
            now=request.now,
            limits=request.limits,
            max_count=request.max_count,
            default_count=request.default_count,
            budget=checks,
        )
    except DuetimeError as exc:
        return PreviewAnswer(None, checks.spent, exc)
    preview = compute_preview(schedule, start, count)
    return PreviewAnswer(preview_to_json(preview), checks.spent + preview.steps)
