"""Schedule preview: the next occurrences of a schedule (or of a job) before they fire.

The preview exists so an owner can see what a cron expression means on the wall clock of its zone
*before* a DST change surprises them, so it must never disagree with the engine. It therefore
walks the schedule with the engine's own functions (``first_occurrence`` for the first run of a
job created at ``from``, then ``next_occurrence`` from each previous *scheduled* time, exactly as
the engine chains them) and reads each instant with ``describe_instant``. Nothing here computes an
occurrence by itself; the DST labels only explain instants the engine chose.

Occurrences that a ``dst_gap: "skip"`` rule drops leave no instant behind, so they are found by
walking the same schedule with ``dst_gap: "shift"``: every instant that variant marks as shifted
out of a gap, and that the real schedule lacks, is a gap the real schedule skips.

The body is judged by ``core.validation.parse_preview_request``, with the same schedule parser and
field helpers as a job spec, so a preview refuses exactly what ``POST /v1/jobs`` refuses, with the
same codes, messages and field paths.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from aiohttp import web

from duetime.api.body import parse_json, require_json_content_type
from duetime.api.handlers import OWNER, job_id_of
from duetime.api.render import json_response
from duetime.core.codec import format_time
from duetime.core.cron import cron_notes, parse_cron
from duetime.core.errors import InvalidRequest
from duetime.core.jitter import due_at, spread
from duetime.core.model import (
    CronSchedule,
    DstGap,
    IntervalSchedule,
    Job,
    JobSpec,
    JobState,
    OneOffSchedule,
    Schedule,
)
from duetime.core.schedule import describe_instant, first_occurrence, load_zone, next_occurrence
from duetime.core.validation import SpecLimits, parse_preview_request, parse_time
from duetime.storage.base import Registry
from duetime.storage.dbclock import DB_CLOCK

DEFAULT_COUNT: Final = 10
MAX_COUNT: Final = 100
# Only these states can still fire; a cancelled, completed or dead job previews no occurrence.
_LIVE_STATES: Final = frozenset({JobState.SCHEDULED, JobState.PAUSED})
# How far the shift-variant walk may run to find skipped gaps: gaps are rare (two a year in most
# zones), so this bounds the work for a schedule whose matches fall mostly inside gaps.
_SKIP_SCAN_LIMIT: Final = 1000
_SECOND: Final = timedelta(seconds=1)
_MILLISECOND: Final = timedelta(milliseconds=1)
_DIGITS: Final = re.compile(r"[0-9]{1,4}")


@dataclasses.dataclass(frozen=True, slots=True)
class Preview:
    """What a preview found, before it is written as JSON."""

    schedule: Schedule
    start: datetime
    items: list[datetime]
    has_more: bool
    skipped: list[datetime]  # transition instants whose gap a dst_gap=skip rule drops
    excluded: list[datetime] = dataclasses.field(default_factory=list)  # occurrences on excluded days


def compute_preview(
    schedule: Schedule, start: datetime, count: int, spread: timedelta = timedelta(0)
) -> Preview:
    """Up to ``count`` occurrences of a job created at ``start`` with this schedule.

    The chain is the engine's: the first run is ``first_occurrence(schedule, start)`` (a one-off's
    ``run_at`` even when it is already past, because such a job runs at once) and each later one is
    ``next_occurrence`` of the previous scheduled time. A job's ``spread`` (its fixed offset) moves
    the walk's start back by as much, as ``core.lifecycle.initial_plan`` does: the first item is
    the first occurrence whose spread time is after ``start``, the one ``next_run_at`` shows.
    """
    walk_from = start - spread
    items: list[datetime] = []
    current = first_occurrence(schedule, walk_from)
    while current is not None and len(items) < count:
        items.append(current)
        current = next_occurrence(schedule, current)
    has_more = current is not None
    skipped: list[datetime] = []
    if isinstance(schedule, CronSchedule) and schedule.dst_gap == DstGap.SKIP:
        skipped = _skipped_gaps(schedule, walk_from, items[-1] if has_more and items else None, count)
    excluded: list[datetime] = []
    if isinstance(schedule, CronSchedule | IntervalSchedule) and schedule.exclude:
        excluded = _excluded(schedule, walk_from, items[-1] if has_more and items else None, count)
    return Preview(
        schedule=schedule, start=start, items=items, has_more=has_more, skipped=skipped, excluded=excluded
    )


def _excluded(
    schedule: CronSchedule | IntervalSchedule, start: datetime, until: datetime | None, count: int
) -> list[datetime]:
    """Occurrences in the previewed window that ``exclude`` drops: the same schedule walked
    without its exclusions, less the instants the real one has."""
    unexcluded = dataclasses.replace(schedule, exclude=())
    kept = set(occurrences_between(schedule, start, until, _SKIP_SCAN_LIMIT))
    found: list[datetime] = []
    for instant in occurrences_between(unexcluded, start, until, _SKIP_SCAN_LIMIT):
        if instant not in kept:
            found.append(instant)
            if len(found) == count:
                break
    return found


def occurrences_between(
    schedule: Schedule, start: datetime, until: datetime | None, limit: int
) -> list[datetime]:
    """The engine's chain from a job created at ``start``, up to ``until`` (or ``limit`` of them)."""
    found: list[datetime] = []
    current = first_occurrence(schedule, start)
    while current is not None and len(found) < limit and (until is None or current <= until):
        found.append(current)
        current = next_occurrence(schedule, current)
    return found


def _skipped_gaps(
    schedule: CronSchedule, start: datetime, until: datetime | None, count: int
) -> list[datetime]:
    """Gap transitions in (start, until] whose wall times the schedule names but skips."""
    shifted = dataclasses.replace(schedule, dst_gap=DstGap.SHIFT)
    found: list[datetime] = []
    current = next_occurrence(shifted, start)
    scanned = 0
    while current is not None and scanned < _SKIP_SCAN_LIMIT and len(found) < count:
        if until is not None and current > until:
            break
        if describe_instant(shifted, current)["shifted_from_gap"]:
            found.append(current)
        scanned += 1
        current = next_occurrence(shifted, current)
    return found


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
    return {
        "timezone": "UTC" if isinstance(schedule, OneOffSchedule) else schedule.timezone,
        "from": format_time(preview.start),
        "items": items,
        "has_more": preview.has_more,
        "skipped": [
            _skipped_json(schedule, t) for t in preview.skipped if isinstance(schedule, CronSchedule)
        ],
        "excluded": [_excluded_json(schedule, t) for t in preview.excluded],
        "warnings": cron_notes(schedule.cron) if isinstance(schedule, CronSchedule) else [],
    }


def _excluded_json(schedule: Schedule, instant: datetime) -> dict[str, Any]:
    described = describe_instant(schedule, instant)
    return {
        "at": format_time(instant),
        "local": described["local"],
        "utc_offset": described["utc_offset"],
        "reason": "excluded_date",
    }


def _count_query(request: web.Request) -> int:
    text = request.query.get("count") or None
    if text is None:
        return DEFAULT_COUNT
    if _DIGITS.fullmatch(text) is None or not 1 <= int(text) <= MAX_COUNT:
        raise InvalidRequest(
            f"count must be an integer from 1 to {MAX_COUNT}.", code="invalid_count", field="count"
        )
    return int(text)


class PreviewApi:
    """``POST /v1/schedules/preview`` and ``GET /v1/jobs/{id}/preview``."""

    def __init__(self, registry: Registry, *, limits: SpecLimits) -> None:
        self._registry = registry
        self._limits = limits

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/schedules/preview", self.preview_schedule, name="preview_schedule"),
            web.get("/v1/jobs/{job_id}/preview", self.preview_job, name="preview_job", allow_head=False),
        ]

    async def preview_schedule(self, request: web.Request) -> web.Response:
        require_json_content_type(request)
        schedule, count, start = parse_preview_request(
            parse_json(await request.read()),
            now=DB_CLOCK.now(),
            limits=self._limits,
            max_count=MAX_COUNT,
            default_count=DEFAULT_COUNT,
        )
        return json_response(preview_to_json(compute_preview(schedule, start, count)))

    async def preview_job(self, request: web.Request) -> web.Response:
        job_id = job_id_of(request)
        count = _count_query(request)
        raw_from = request.query.get("from") or None
        start = DB_CLOCK.now() if raw_from is None else parse_time(raw_from, "from")
        job = await self._registry.get_job(request[OWNER], job_id)
        return json_response(_job_preview(job, job_id, start, count))


def _job_preview(job: Job, job_id: uuid.UUID, start: datetime, count: int) -> dict[str, Any]:
    schedule = job.spec.schedule
    offset = spread(job_id, job.spec)
    if job.state in _LIVE_STATES:
        preview = compute_preview(schedule, start, count, offset)
    else:
        preview = Preview(schedule=schedule, start=start, items=[], has_more=False, skipped=[], excluded=[])
    body = preview_to_json(preview, PreviewedJob(job_id, job.spec))
    return {"job_id": job.id, "state": job.state.value, "spread_ms": offset // _MILLISECOND, **body}
