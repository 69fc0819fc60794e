"""Excluded dates (``exclude``): local calendar days of a schedule's zone on which nothing is due.

A schedule's ``exclude`` is a list of dates and inclusive date ranges, read on the wall clock of
the schedule's zone (UTC for an interval schedule that names none). Here they are merged once into
sorted, disjoint day-ordinal ranges, so "is this instant's local date excluded, and where does the
exclusion end?" is one bisect. Pure: the zone is passed in.
"""

from __future__ import annotations

from bisect import bisect_right
from datetime import UTC, date, datetime, time, timedelta, tzinfo

from duetime.core.model import DateRange

__all__ = ["Exclusions"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Exclusions:
    """Merged excluded day ranges of one schedule, in one zone.

    Instants in and out are integers in ``unit_us`` microseconds since the Unix epoch: seconds
    for the cron walk, microseconds for interval schedules. Local midnights are whole seconds in
    every zone of the tz database, so both units are exact.
    """

    __slots__ = ("_firsts", "_lasts", "_unit", "_zone")

    def __init__(self, ranges: tuple[DateRange, ...], zone: tzinfo, unit_us: int = 1) -> None:
        merged: list[list[int]] = []
        for r in sorted(ranges, key=lambda r: r.first):
            first, last = r.first.toordinal(), r.last.toordinal()
            if merged and first <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([first, last])
        self._firsts = [m[0] for m in merged]
        self._lasts = [m[1] for m in merged]
        self._zone = zone
        self._unit = timedelta(microseconds=unit_us)

    def __bool__(self) -> bool:
        return bool(self._firsts)

    def local_date(self, instant: int) -> date:
        return (_EPOCH + instant * self._unit).astimezone(self._zone).date()

    def _range_of(self, day: int) -> int | None:
        index = bisect_right(self._firsts, day) - 1
        if index >= 0 and day <= self._lasts[index]:
            return index
        return None

    def excluded(self, instant: int) -> bool:
        return self._range_of(self.local_date(instant).toordinal()) is not None

    def excludes_day(self, ordinal: int) -> bool:
        """Whether the local date with proleptic ordinal ``ordinal`` is excluded (counting a
        stretch of wall-clock days, the days are known without a zone conversion)."""
        return self._range_of(ordinal) is not None

    def _day_start(self, ordinal: int) -> int:
        """The first instant whose local date is the day ``ordinal`` (midnight, or the end of a
        gap when midnight does not exist that day)."""
        if ordinal > date.max.toordinal():
            return 2**62
        local = datetime.combine(date.fromordinal(ordinal), time(0), tzinfo=self._zone)
        return -((_EPOCH - local) // self._unit)  # rounded up: the first whole unit in the day

    def resume_after(self, instant: int) -> int | None:
        """For an excluded instant: the first instant after its excluded days; None if allowed."""
        index = self._range_of(self.local_date(instant).toordinal())
        if index is None:
            return None
        return max(self._day_start(self._lasts[index] + 1), instant + 1)

    def resume_before(self, instant: int) -> int | None:
        """For an excluded instant: the last instant before its excluded days; None if allowed."""
        index = self._range_of(self.local_date(instant).toordinal())
        if index is None:
            return None
        return min(self._day_start(self._firsts[index]) - 1, instant - 1)

    def spans(self, low: int, high: int) -> list[tuple[int, int]]:
        """The excluded stretches ``[from, until)`` of instants that meet [low, high]."""
        first_day = self.local_date(low).toordinal()
        last_day = self.local_date(high).toordinal()
        index = max(bisect_right(self._firsts, first_day) - 1, 0)
        spans: list[tuple[int, int]] = []
        while index < len(self._firsts) and self._firsts[index] <= last_day:
            if self._lasts[index] >= first_day:
                spans.append((self._day_start(self._firsts[index]), self._day_start(self._lasts[index] + 1)))
            index += 1
        return spans
