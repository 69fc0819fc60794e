"""When a schedule's occurrences are: pure functions of the schedule and an instant.

The engine asks "what is the next occurrence strictly after the previous *scheduled* one?" and
never passes the time a run finished, so schedules cannot drift. Every public function takes and
returns aware UTC datetimes; time is always an argument.

How a cron instant is found. A zone's UTC offset is piecewise constant: between two transitions the
wall clock is ``utc + offset``, continuous and increasing. Inside such a *segment* the occurrences
are simply the matching wall times of the segment's wall range, so the common case is one
field-wise jump in ``core.cron`` plus one subtraction. Only at a segment's start do DST rules act:

- a forward transition (offset grows) skips the wall times ``[start + old, start + new)``; with
  ``dst_gap="shift"`` any match among them runs once at the transition instant itself, with
  ``"skip"`` they are dropped;
- a backward transition (offset shrinks) shows ``[start + new, start + old)`` a second time; with
  ``dst_overlap="first"`` those repeats are not occurrences, with ``"both"`` they are.

Walking segments in UTC order makes every result strictly increasing with no sorting or dedupe
pass. Transitions are found by probing ``zoneinfo`` (every few hours, then a binary search to the
second) and cached per zone and UTC year, so the arithmetic agrees with ``zoneinfo`` by
construction and works for any zone, including 30- and 45-minute shifts.
"""

from __future__ import annotations

import re
import threading
import zoneinfo
from bisect import bisect_left, bisect_right
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any

from duetime.core.cron import SEARCH_HORIZON_YEARS, CronExpr, parse_cron
from duetime.core.errors import InvalidRequest
from duetime.core.exclusion import Exclusions
from duetime.core.interval import IntervalMath
from duetime.core.model import (
    CronSchedule,
    DateRange,
    DstGap,
    DstOverlap,
    IntervalSchedule,
    OneOffSchedule,
    Schedule,
)

__all__ = [
    "MAX_OCCURRENCES",
    "check_cron_schedule",
    "check_interval_schedule",
    "count_between",
    "describe_instant",
    "epoch_us",
    "first_occurrence",
    "folded_count",
    "from_epoch_us",
    "latest_at_or_before",
    "load_zone",
    "next_occurrence",
    "occurrences",
    "previous_occurrence",
]

MAX_OCCURRENCES = 1000
_TZ_FIELD = "schedule.timezone"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)
_FAR_PAST = -(2**62)
_FAR_FUTURE = 2**62
_PROBE_STEP_S = 86400  # tzdata has no two offset changes closer than 7 days since 1970 (Brazil 2000, Gaza)
_MIN_YEAR = 2
_MAX_YEAR = 9997
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_DAY_S = 86400
# count_between walks this many occurrences one by one, then counts the rest a day at a time
# (``_CronWalk.count_in``): a walk is cheaper for a few, the count for many.
_WALK_BEFORE_COUNTING = 32
_DAYS_PER_SEARCH = 6
_OFFSET_LIKE = re.compile(r"(?:UTC|GMT|Z)?[+\-\u2212][0-9]{1,2}(?::?[0-9]{2}){0,2}", re.ASCII | re.IGNORECASE)
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*", re.ASCII)


# -- zones -----------------------------------------------------------------------------------------

_zones: dict[str, zoneinfo.ZoneInfo] = {}
_zones_lock = threading.Lock()


@lru_cache(maxsize=1)
def _available_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


@lru_cache(maxsize=1)
def _zones_by_folded_name() -> dict[str, str]:
    return {name.casefold(): name for name in _available_zones()}


def _zone_error(message: str) -> InvalidRequest:
    return InvalidRequest(message, code="invalid_timezone", field=_TZ_FIELD)


def load_zone(name: str) -> zoneinfo.ZoneInfo:
    """The zone for an IANA region id (``Europe/Berlin``), ``UTC`` or ``Etc/...``; cached.

    Ids without a ``/`` other than ``UTC`` (``EST``, ``CET``, ``EST5EDT``, ``GB``...) are legacy
    aliases whose meaning surprises people (``EST`` never observes DST), so they are refused with a
    pointer to a region id rather than silently accepted.
    """
    cached = _zones.get(name) if isinstance(name, str) else None
    if cached is not None:
        return cached
    if not isinstance(name, str) or name == "":
        raise _zone_error("timezone must be an IANA zone id such as 'Europe/Berlin' or 'UTC'")
    if _OFFSET_LIKE.fullmatch(name):
        raise _zone_error(
            f"timezone {name!r} is a UTC offset, not a zone: an offset has no DST rules; use a region id "
            f"such as 'Asia/Kolkata', or 'Etc/GMT-5' for a fixed UTC+5 (POSIX sign: Etc/GMT-5 is UTC+5)"
        )
    if len(name) > 64 or not _ZONE_NAME.fullmatch(name):
        raise _zone_error(
            f"timezone {name!r} is not an IANA zone id: use a region id such as 'America/New_York', "
            f"not an offset like '+05:30' or a path"
        )
    if "/" not in name and name != "UTC":
        raise _zone_error(
            f"timezone {name!r} is a legacy abbreviation or alias, not an IANA region id: use a region "
            f"such as 'America/New_York' or 'Europe/Paris', or 'UTC'"
        )
    if name not in _available_zones():
        suggestion = _zones_by_folded_name().get(name.casefold())
        hint = f" (did you mean {suggestion!r}?)" if suggestion else ""
        raise _zone_error(f"timezone {name!r} is not a known IANA zone id{hint}")
    try:
        zone = zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:  # a broken tz database install
        raise _zone_error(f"timezone {name!r} could not be loaded: {exc}") from exc
    with _zones_lock:
        _zones[name] = zone
    return zone


# -- offsets as segments ---------------------------------------------------------------------------


class _Timeline:
    """One zone's UTC offsets as segments ``[start, next start)``, probed lazily per UTC year.

    Each year's table starts with a pseudo-boundary at 1 January 00:00 UTC; where the offset does
    not change there, the walk treats it like any boundary and nothing special happens.
    """

    __slots__ = ("_fixed_offset", "_lock", "_years", "_zone")

    def __init__(self, zone: zoneinfo.ZoneInfo, fixed: bool) -> None:
        self._zone = zone
        self._years: dict[int, tuple[list[int], list[int], int]] = {}
        self._lock = threading.Lock()
        self._fixed_offset = self._offset(0) if fixed else None

    def _offset(self, instant: int) -> int:
        moment = datetime.fromtimestamp(instant, self._zone)
        delta = moment.utcoffset()
        assert delta is not None
        return delta // _SECOND

    def segment(self, instant: int) -> tuple[int, int, int, int]:
        """(start, end, offset, offset before start) of the segment holding ``instant``."""
        if self._fixed_offset is not None:
            return _FAR_PAST, _FAR_FUTURE, self._fixed_offset, self._fixed_offset
        year = (_EPOCH + instant * _SECOND).year
        table = self._years.get(year)
        if table is None:
            table = self._probe_year(year)
        starts, offsets, before_year = table
        index = bisect_right(starts, instant) - 1
        start = starts[index]
        end = starts[index + 1] if index + 1 < len(starts) else _year_start(year + 1)
        previous = offsets[index - 1] if index > 0 else before_year
        return start, end, offsets[index], previous

    def _probe_year(self, year: int) -> tuple[list[int], list[int], int]:
        begin, finish = _year_start(year), _year_start(year + 1)
        starts, offsets = [begin], [self._offset(begin)]
        cursor = begin
        probe = begin
        while probe < finish - 1:
            probe = min(probe + _PROBE_STEP_S, finish - 1)
            while self._offset(probe) != offsets[-1]:
                low, high = cursor, probe  # offset(low) == offsets[-1] != offset(high)
                while high - low > 1:
                    middle = (low + high) // 2
                    if self._offset(middle) == offsets[-1]:
                        low = middle
                    else:
                        high = middle
                starts.append(high)
                offsets.append(self._offset(high))
                cursor = high
            cursor = probe
        table = (starts, offsets, self._offset(begin - 1))
        with self._lock:
            self._years[year] = table
        return table


def _year_start(year: int) -> int:
    return (datetime(year, 1, 1, tzinfo=UTC) - _EPOCH) // _SECOND


_timelines: dict[str, _Timeline] = {}


def _timeline(name: str) -> _Timeline:
    timeline = _timelines.get(name)
    if timeline is None:
        zone = load_zone(name)
        timeline = _Timeline(zone, fixed=name == "UTC" or name.startswith("Etc/"))
        with _zones_lock:
            _timelines[name] = timeline
    return timeline


@lru_cache(maxsize=4096)
def _compiled(expr: str) -> CronExpr:
    return parse_cron(expr)


class _TimesOfDay:
    """A cron's matching times of day (hour, minute, second), counted without listing them: how
    many fall before a second of the day is three bisects."""

    __slots__ = ("_hour_set", "_hours", "_minute_set", "_minutes", "_seconds", "per_day")

    def __init__(self, expr: CronExpr) -> None:
        self._hours = sorted(expr.hours)
        self._minutes = sorted(expr.minutes)
        self._seconds = sorted(expr.seconds)
        self._hour_set = expr.hours
        self._minute_set = expr.minutes
        self.per_day = len(self._hours) * len(self._minutes) * len(self._seconds)

    def before(self, second_of_day: int) -> int:
        """How many matching times of day are earlier than ``second_of_day`` (0 to 86400)."""
        hour, rest = divmod(second_of_day, 3600)
        minute, second = divmod(rest, 60)
        per_minute = len(self._seconds)
        count = bisect_left(self._hours, hour) * len(self._minutes) * per_minute
        if hour in self._hour_set:
            count += bisect_left(self._minutes, minute) * per_minute
            if minute in self._minute_set:
                count += bisect_left(self._seconds, second)
        return count


@lru_cache(maxsize=4096)
def _times_of_day(expr: str) -> _TimesOfDay:
    return _TimesOfDay(_compiled(expr))


@lru_cache(maxsize=1024)
def _exclusions(ranges: tuple[DateRange, ...], zone_name: str, unit_us: int) -> Exclusions:
    """Merged once per schedule: every walk of a job's schedule builds the same table."""
    return Exclusions(ranges, load_zone(zone_name), unit_us)


# -- instants as integers --------------------------------------------------------------------------


def _require_aware(value: datetime, name: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime (UTC), got a naive one")


def _floor_s(value: datetime) -> int:
    return (value - _EPOCH) // _SECOND


def _ceil_s(value: datetime) -> int:
    return -((_EPOCH - value) // _SECOND)


def _to_datetime(instant: int) -> datetime:
    return _EPOCH + instant * _SECOND


def _instant_year(instant: int) -> int:
    return (_EPOCH + instant * _SECOND).year


class _CronWalk:
    """The segment walk for one cron schedule; integer seconds since the Unix epoch throughout."""

    __slots__ = ("_cron", "_excluded", "_expr", "_gap_shift", "_high", "_low", "_overlap_both", "_timeline")

    def __init__(self, schedule: CronSchedule) -> None:
        self._cron = schedule.cron
        self._expr = _compiled(schedule.cron)
        self._timeline = _timeline(schedule.timezone)
        self._gap_shift = schedule.dst_gap == DstGap.SHIFT
        self._overlap_both = schedule.dst_overlap == DstOverlap.BOTH
        self._low = _FAR_PAST if schedule.start_at is None else _ceil_s(schedule.start_at)
        self._high = _FAR_FUTURE if schedule.end_at is None else _floor_s(schedule.end_at)
        self._excluded = (
            Exclusions(schedule.exclude, load_zone(schedule.timezone), 1_000_000)
            if schedule.exclude
            else None
        )

    def first_at_or_after(self, low: int, high: int = _FAR_FUTURE) -> int | None:
        """The smallest occurrence in [low, high] (both already integers) whose local date is not
        excluded, or None. Each excluded stretch met is jumped over whole, so the work grows with
        the number of excluded ranges passed, never with the occurrences inside them."""
        excluded = self._excluded
        while True:
            found = self._first_matching(low, high)
            if found is None or excluded is None:
                return found
            resume = excluded.resume_after(found)
            if resume is None:
                return found
            low = resume

    def _first_matching(self, low: int, high: int) -> int | None:
        low = max(low, self._low)
        high = min(high, self._high)
        if low > high:
            return None
        try:
            low_year = _instant_year(low)
        except OverflowError:  # one second past datetime.max
            return None
        if low_year > _MAX_YEAR:
            return None
        if low_year < _MIN_YEAR:  # keeps every probe and conversion inside datetime's range
            low = max(low, _year_start(_MIN_YEAR))
        expr = self._expr
        limit_year: int | None = None
        if high < _FAR_FUTURE:
            # Offsets stay within a day of UTC, so no wall time past high's year + 1 can be <= high.
            limit_year = min(_instant_year(high) + 1, _MAX_YEAR)
        # Memo of the last wall search: no match in [memo_from, memo_match), memo_match matches.
        memo_from = memo_match = 0
        memo_valid = False

        def match_from(wall: int) -> int | None:
            nonlocal memo_from, memo_match, memo_valid
            if memo_valid and memo_from <= wall <= memo_match:
                return memo_match
            found = expr.first_match_at_or_after(wall, limit_year)
            if found is None:
                return None
            memo_from, memo_match, memo_valid = wall, found, True
            return found

        horizon = low + (SEARCH_HORIZON_YEARS + 1) * 366 * 86400
        start, end, offset, before = self._timeline.segment(low)
        while True:
            if start > high or start > horizon:
                return None
            if start >= low and offset > before and self._gap_shift:
                match = match_from(start + before)
                if match is None:
                    return None
                if match < start + offset:
                    return start
            wall_low = max(low, start) + offset
            if offset < before and not self._overlap_both:
                wall_low = max(wall_low, start + before)
            match = match_from(wall_low)
            if match is None:
                return None
            if match < end + offset:
                instant = match - offset
                return instant if instant <= high else None
            if end >= _FAR_FUTURE or _instant_year(end) > _MAX_YEAR:
                return None
            start, end, offset, before = self._timeline.segment(end)

    def count_in(self, low: int, high: int) -> int:
        """How many occurrences lie in [low, high] (integer seconds): what ``first_at_or_after``
        would list one by one, counted a segment and a wall-clock day at a time instead.

        The same rules as ``_first_matching``, in the same place: inside a segment the occurrences
        are the matching wall times of its wall range (the repeated ones of an overlap left out
        under ``first``); at a forward transition, one run at the transition itself when a skipped
        wall time matched (``shift``). An excluded day is a wall-clock day of the zone, so within
        a segment it is a day of the wall range. A day's matching times are counted by
        ``_TimesOfDay``, so a day costs the same whether the cron runs once or 86,400 times in it:
        a week's backlog of an every-second cron is a few dozen steps, not 600,000 (the misfire
        policy counts what it folds or passes over; tests/pure/test_schedule_property.py holds the
        count to the brute-force reference). Unlike the walk it has no search horizon: two
        occurrences more than 30 years apart are both counted."""
        low = max(low, self._low, _year_start(_MIN_YEAR))
        high = min(high, self._high, _year_start(_MAX_YEAR + 1) - 1)
        if low > high:
            return 0
        count = 0
        start, end, offset, before = self._timeline.segment(low)
        while True:
            segment_low = max(low, start)
            shifted = start >= low and offset > before and self._gap_shift
            if shifted and self._wall_count(start + before, start + offset - 1, exclude=False):
                # One run at the transition, which is also the segment's first instant: the walk
                # finds it once, whether its own wall time matches too or not.
                count += not self._excluded_wall_day(start + offset)
                segment_low = start + 1
            wall_low = segment_low + offset
            if offset < before and not self._overlap_both:
                wall_low = max(wall_low, start + before)
            wall_high = min(high, end - 1) + offset
            if wall_low <= wall_high:
                count += self._wall_count(wall_low, wall_high)
            if end > high or end >= _FAR_FUTURE:
                return count
            start, end, offset, before = self._timeline.segment(end)

    def _excluded_wall_day(self, wall: int) -> bool:
        excluded = self._excluded
        return excluded is not None and excluded.excludes_day(wall // _DAY_S + _EPOCH_ORDINAL)

    def _wall_count(self, wall_low: int, wall_high: int, *, exclude: bool = True) -> int:
        """How many wall-clock seconds in [wall_low, wall_high] (naive seconds since 1970-01-01)
        match the cron, the excluded days left out unless ``exclude`` is False."""
        expr = self._expr
        times = _times_of_day(self._cron)
        excluded = self._excluded if exclude else None
        first_day, first_s = divmod(wall_low, _DAY_S)
        last_day, last_s = divmod(wall_high, _DAY_S)
        count = 0
        for day in range(first_day, last_day + 1):
            ordinal = day + _EPOCH_ORDINAL
            on = date.fromordinal(ordinal)
            if on.month not in expr.months or not expr.day_matches(on.year, on.month, on.day):
                continue
            if excluded is not None and excluded.excludes_day(ordinal):
                continue
            begin = first_s if day == first_day else 0
            until = last_s + 1 if day == last_day else _DAY_S
            if begin == 0 and until == _DAY_S:
                count += times.per_day
            else:
                count += times.before(until) - times.before(begin)
        return count


_US = timedelta(microseconds=1)
_FAR_US = (datetime(9998, 1, 1, tzinfo=UTC) - _EPOCH) // _US


def epoch_us(value: datetime) -> int:
    """An instant as whole microseconds since the epoch, exactly: how the interval math, the
    wheel entry, the run-queue message and the fence's parameters carry an instant."""
    return (value - _EPOCH) // _US


def from_epoch_us(instant: int) -> datetime:
    """The inverse of ``epoch_us`` (UTC)."""
    return _EPOCH + instant * _US


class _IntervalWalk:
    """An interval schedule's occurrences, excluded dates left out; integer microseconds."""

    __slots__ = ("_excluded", "_math")

    def __init__(self, schedule: IntervalSchedule) -> None:
        end = None if schedule.end_at is None else epoch_us(schedule.end_at)
        self._math = IntervalMath(epoch_us(schedule.start_at), schedule.every_s * 1_000_000, end)
        self._excluded = _exclusions(schedule.exclude, schedule.timezone, 1) if schedule.exclude else None

    def first_at_or_after(self, low: int, high: int = _FAR_US) -> int | None:
        excluded = self._excluded
        while True:
            found = self._math.first_at_or_after(low)
            if found is None or found > min(high, _FAR_US):
                return None
            resume = None if excluded is None else excluded.resume_after(found)
            if resume is None:
                return found
            low = resume

    def last_at_or_before(self, high: int, low: int) -> int | None:
        excluded = self._excluded
        while True:
            found = self._math.last_at_or_before(high)
            if found is None or found < low:
                return None
            resume = None if excluded is None else excluded.resume_before(found)
            if resume is None:
                return found
            high = resume

    def count_in(self, low: int, high: int) -> int:
        count = self._math.count_in(low, high)
        if self._excluded is not None and count:
            for start, until in self._excluded.spans(low, high):
                count -= self._math.count_in(max(low, start), min(high, until - 1))
        return count


# -- public API ------------------------------------------------------------------------------------


def next_occurrence(schedule: Schedule, after: datetime) -> datetime | None:
    """The smallest occurrence strictly after ``after``; None when there is none (any more)."""
    _require_aware(after, "after")
    if isinstance(schedule, OneOffSchedule):
        return schedule.run_at if schedule.run_at > after else None
    if isinstance(schedule, IntervalSchedule):
        found_us = _IntervalWalk(schedule).first_at_or_after(epoch_us(after) + 1)
        return None if found_us is None else from_epoch_us(found_us)
    found = _CronWalk(schedule).first_at_or_after(_floor_s(after) + 1)
    return None if found is None else _to_datetime(found)


def first_occurrence(schedule: Schedule, now: datetime) -> datetime | None:
    """The first run of a new (or rescheduled) job.

    A one-off's ``run_at`` is returned even when it is in the past: the contract says it then runs
    at once. A cron's first occurrence is strictly after ``now`` and not before ``start_at``. An
    interval's is its first occurrence in the second of ``now`` or later: with the default
    ``start_at`` (the creation time rounded down to the second) that is ``start_at`` itself, so
    a new "every 90m" job runs at once and then every 90 minutes.
    """
    _require_aware(now, "now")
    if isinstance(schedule, OneOffSchedule):
        return schedule.run_at
    if isinstance(schedule, IntervalSchedule):
        found_us = _IntervalWalk(schedule).first_at_or_after(_floor_s(now) * 1_000_000)
        return None if found_us is None else from_epoch_us(found_us)
    return next_occurrence(schedule, now)


def occurrences(schedule: Schedule, after: datetime, limit: int) -> list[datetime]:
    """Up to ``limit`` successive occurrences strictly after ``after`` (previews, run_all misfires)."""
    _require_aware(after, "after")
    if not 0 <= limit <= MAX_OCCURRENCES:
        raise InvalidRequest(
            f"limit must be between 0 and {MAX_OCCURRENCES}, got {limit}", code="invalid_value", field="limit"
        )
    if isinstance(schedule, OneOffSchedule):
        return [schedule.run_at] if limit and schedule.run_at > after else []
    if isinstance(schedule, IntervalSchedule):
        every = _IntervalWalk(schedule)
        listed: list[datetime] = []
        cursor_us = epoch_us(after) + 1
        while len(listed) < limit and (instant_us := every.first_at_or_after(cursor_us)) is not None:
            listed.append(from_epoch_us(instant_us))
            cursor_us = instant_us + 1
        return listed
    walk = _CronWalk(schedule)
    found: list[datetime] = []
    cursor = _floor_s(after) + 1
    while len(found) < limit:
        instant = walk.first_at_or_after(cursor)
        if instant is None:
            break
        found.append(_to_datetime(instant))
        cursor = instant + 1
    return found


def latest_at_or_before(schedule: Schedule, at: datetime, not_before: datetime) -> datetime | None:
    """The largest occurrence in [not_before, at], for the run_once misfire policy.

    Gallops backwards from ``at`` in growing windows, then bisects, so a week of an every-second
    cron costs a few dozen segment walks rather than 600 000 steps.
    """
    _require_aware(at, "at")
    _require_aware(not_before, "not_before")
    if isinstance(schedule, OneOffSchedule):
        return schedule.run_at if not_before <= schedule.run_at <= at else None
    if isinstance(schedule, IntervalSchedule):
        found_us = _IntervalWalk(schedule).last_at_or_before(epoch_us(at), epoch_us(not_before))
        return None if found_us is None else from_epoch_us(found_us)
    walk = _CronWalk(schedule)
    low, high = _ceil_s(not_before), _floor_s(at)
    if low > high:
        return None
    width = 1
    while True:
        probe = max(high - width + 1, low)
        found = walk.first_at_or_after(probe, high)
        if found is not None:
            break
        if probe == low:
            return None
        width *= 8
    # found is an occurrence <= high; find the last one: no occurrence lies in (ceiling, high].
    best, ceiling = found, high
    while best < ceiling:
        middle = (best + 1 + ceiling + 1) // 2  # in (best, ceiling]
        later = walk.first_at_or_after(middle, ceiling)
        if later is None:
            ceiling = middle - 1
        else:
            best = later
    return _to_datetime(best)


def count_between(schedule: Schedule, after: datetime, until: datetime, cap: int) -> int:
    """How many occurrences lie in (after, until], counting no further than ``cap``."""
    _require_aware(after, "after")
    _require_aware(until, "until")
    if cap <= 0:
        return 0
    if isinstance(schedule, OneOffSchedule):
        return 1 if after < schedule.run_at <= until else 0
    if isinstance(schedule, IntervalSchedule):
        low_us, high_us = epoch_us(after) + 1, epoch_us(until)
        return 0 if low_us > high_us else min(_IntervalWalk(schedule).count_in(low_us, high_us), cap)
    walk = _CronWalk(schedule)
    high = _floor_s(until)
    cursor = _floor_s(after) + 1
    count = 0
    while count < cap:
        # A day of count_in costs about a seventh of a search (0.3-0.5 against 3 µs): count the
        # rest unless the cap stops the walk sooner (a catch-up's cap of 100 over years).
        if count == _WALK_BEFORE_COUNTING and (high - cursor) // _DAY_S < _DAYS_PER_SEARCH * (cap - count):
            return min(count + walk.count_in(cursor, high), cap)
        instant = walk.first_at_or_after(cursor, high)
        if instant is None:
            break
        count += 1
        cursor = instant + 1
    return count


def folded_count(schedule: Schedule, oldest: datetime, into: datetime) -> int:
    """How many occurrences lie in [oldest, into): the missed occurrences a ``run_once`` run at
    ``into`` stands for, when ``oldest`` is the first of them (the run itself not counted). A
    one-off has one occurrence: it never folds any."""
    if isinstance(schedule, OneOffSchedule):
        return 0
    return count_between(schedule, oldest - _US, into - _US, 2**62)


# How far back ``previous_occurrence`` looks: the cron search's own horizon, and a year more.
_PREVIOUS_WITHIN = timedelta(days=366 * (SEARCH_HORIZON_YEARS + 1))
_EARLIEST = datetime(_MIN_YEAR, 1, 1, tzinfo=UTC)


def previous_occurrence(
    schedule: Schedule, occurrence: datetime, created_at: datetime | None = None
) -> datetime | None:
    """The occurrence the schedule defines before ``occurrence`` (the largest one strictly
    earlier), whether or not it ran; None for a one-off.

    ``created_at`` is when the job was made: the job's occurrences start at
    ``first_occurrence(schedule, created_at)``, so for that first one (and anything before it, a
    backfill reaching back further) there is none. Without it, the schedule's own ``start_at``
    is the only bound.

    Every call of a run computes it (``Duetime-Previous-Scheduled-For``), so the search is
    remembered per schedule and occurrence: the many jobs of one cron that run at the same
    instant share one search (40-60 µs for a cron; an interval's is arithmetic).
    """
    _require_aware(occurrence, "occurrence")
    if isinstance(schedule, OneOffSchedule):
        return None
    found = _previous(schedule, occurrence)
    if found is None or created_at is None:
        return found
    if isinstance(schedule, IntervalSchedule):
        # first_occurrence: the first occurrence in the second of created_at or later
        return found if found >= created_at.replace(microsecond=0) else None
    # first_occurrence: the first occurrence strictly after created_at
    return found if found > created_at else None


@lru_cache(maxsize=4096)
def _previous(schedule: CronSchedule | IntervalSchedule, occurrence: datetime) -> datetime | None:
    try:
        floor = max(occurrence - _PREVIOUS_WITHIN, _EARLIEST)
    except OverflowError:
        floor = _EARLIEST
    if isinstance(schedule, IntervalSchedule):
        return latest_at_or_before(schedule, occurrence - _US, floor)
    walk = _CronWalk(schedule)
    high = _ceil_s(occurrence) - 1  # the last whole second before the occurrence
    low = _ceil_s(floor)
    if low > high:
        return None
    # latest_at_or_before's gallop, its first window as wide as the gap to the next occurrence:
    # most crons are regular, so that window holds exactly the previous one. Three searches
    # where the gallop from one second and its bisection took a dozen or more.
    anchor = high + 1
    following = walk.first_at_or_after(anchor + 1)
    width = following - anchor if following is not None else 1
    while True:
        probe = max(high - width + 1, low)
        found = walk.first_at_or_after(probe, high)
        if found is not None:
            break
        if probe == low:
            return None
        width *= 8
    # found is the first occurrence in the window; the last one is usually it or close after it.
    for _ in range(4):
        later = walk.first_at_or_after(found + 1, high)
        if later is None:
            return _to_datetime(found)
        found = later
    return latest_at_or_before(schedule, _to_datetime(high), _to_datetime(found))


def describe_instant(schedule: Schedule, instant: datetime) -> dict[str, Any]:
    """How an occurrence reads on the schedule's wall clock, for previews in the API and CLI."""
    _require_aware(instant, "instant")
    zone_name = "UTC" if isinstance(schedule, OneOffSchedule) else schedule.timezone
    local = instant.astimezone(load_zone(zone_name))
    offset = local.utcoffset()
    assert offset is not None
    wall = local.replace(tzinfo=None)
    shifted = False
    if isinstance(schedule, CronSchedule) and schedule.dst_gap == DstGap.SHIFT:
        # A shifted run sits on a transition instant and its own wall time does not match.
        expr = _compiled(schedule.cron)
        one_before = (instant - _SECOND).astimezone(local.tzinfo)
        shifted = one_before.utcoffset() != offset and not expr.matches(wall)
    return {
        "utc": instant.astimezone(UTC).isoformat(),
        "timezone": zone_name,
        "local": wall.isoformat(),
        "utc_offset": _format_offset(offset),
        "abbreviation": local.tzname(),
        "second_pass": bool(local.fold),
        "shifted_from_gap": shifted,
    }


def _format_offset(offset: timedelta) -> str:
    total = offset // _SECOND
    sign = "+" if total >= 0 else "-"
    hours, rest = divmod(abs(total), 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"{sign}{hours:02d}:{minutes:02d}"
    return text + (f":{seconds:02d}" if seconds else "")


def check_cron_schedule(schedule: CronSchedule, now: datetime) -> None:
    """Refuse a cron schedule that cannot be stored: bad syntax, bad zone, bounds, never fires."""
    _require_aware(now, "now")
    expr = _compiled(schedule.cron)
    load_zone(schedule.timezone)
    for name, value in (("start_at", schedule.start_at), ("end_at", schedule.end_at)):
        if value is not None and (value.tzinfo is None or value.utcoffset() is None):
            raise InvalidRequest(
                f"{name} must carry a UTC offset (RFC 3339)",
                code="invalid_schedule",
                field=f"schedule.{name}",
            )
    if schedule.start_at is not None and schedule.end_at is not None and schedule.start_at >= schedule.end_at:
        raise InvalidRequest(
            "end_at must be later than start_at", code="invalid_schedule", field="schedule.end_at"
        )
    reason = expr.never_fires_reason()
    if reason is not None:
        raise InvalidRequest(
            f"cron {schedule.cron!r} never fires: {reason}", code="cron_never_fires", field="schedule.cron"
        )
    if schedule.end_at is not None and first_occurrence(schedule, now) is None:
        raise InvalidRequest(
            "schedule has no occurrence before end_at", code="cron_never_fires", field="schedule.end_at"
        )
    if schedule.exclude and first_occurrence(schedule, now) is None:
        raise InvalidRequest(
            f"schedule has no occurrence on a day that is not excluded within {SEARCH_HORIZON_YEARS} "
            f"years: remove some dates from exclude",
            code="cron_never_fires",
            field="schedule.exclude",
        )
    if first_occurrence(schedule, now) is None:
        # Possible on the calendar, yet nothing within the search horizon: every wall time named
        # falls in a DST gap that ``skip`` drops (02:30 on the last Sunday of March in Berlin:
        # ``30 2 * 3 0L``), or the day is rare (a fifth Monday of February, ``1#5``, needs
        # 29 February on a Monday, which can be 40 years away across 2100).
        why = "choose days that come round more often"
        if schedule.dst_gap == DstGap.SKIP and first_occurrence(replace(schedule, dst_gap=DstGap.SHIFT), now):
            why = (
                f"every wall time it names falls in a DST gap of {schedule.timezone}, which "
                f"dst_gap 'skip' drops; use dst_gap 'shift' or another time"
            )
        raise InvalidRequest(
            f"cron {schedule.cron!r} has no occurrence within {SEARCH_HORIZON_YEARS} years: {why}",
            code="cron_never_fires",
            field="schedule.cron",
        )


def check_interval_schedule(schedule: IntervalSchedule, now: datetime) -> None:
    """Refuse an interval schedule that cannot be stored: bad zone, bounds, never fires."""
    _require_aware(now, "now")
    load_zone(schedule.timezone)
    if schedule.end_at is not None and schedule.start_at >= schedule.end_at:
        raise InvalidRequest(
            "end_at must be later than start_at", code="invalid_schedule", field="schedule.end_at"
        )
    if first_occurrence(schedule, now) is None:
        field = "schedule.exclude" if schedule.exclude else "schedule.end_at"
        raise InvalidRequest(
            "schedule has no occurrence from now on"
            + (" on a day that is not excluded" if schedule.exclude else " before end_at"),
            code="invalid_schedule",
            field=field,
        )
