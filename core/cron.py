"""The cron dialect Duetime accepts, parsed once into sets of allowed values per field.

Everything here is about the *wall clock* only: a ``CronExpr`` answers "which naive wall-clock
second matches next?". Time zones, DST gaps and overlaps are ``core.schedule``'s business; keeping
them apart lets this module be tested exhaustively with plain naive datetimes.

The parser is strict on purpose. A cron expression is stored for years and read by people who did
not write it, so anything a reader could misread (tabs, double spaces, ``?``, a bare ``L`` in the
day-of-week field, Unicode digits that ``int()`` would happily take) is refused with a message that
names the field and the allowed range instead of being guessed at.

Besides Vixie cron, the calendar forms of Quartz and EventBridge are read (docs/scheduling.md):
``L``, ``LW`` and ``nW`` in the day-of-month field, ``nL`` and ``n#k`` in the day-of-week field, with
Vixie's weekday numbers (``5L`` is the last Friday). They are rules about a day, not sets of values,
so they live beside the sets (``DayRules``) and are asked only of a day the sets did not already
match; each depends on nothing but the day, its weekday and the month's length, which is also what
lets ``never_fires_reason`` decide exactly from the 13 x 7 shapes a month can have (a length,
February's two included, and the weekday of its 1st).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import NamedTuple

from duetime.core.errors import InvalidRequest

__all__ = [
    "MAX_EXPRESSION_LENGTH",
    "SEARCH_HORIZON_YEARS",
    "CronExpr",
    "DayRules",
    "NthWeekday",
    "cron_notes",
    "parse_cron",
]

MAX_EXPRESSION_LENGTH = 256
# 29 February can be 8 years away (2096 -> 2104); 30 years leaves room and still bounds the work.
SEARCH_HORIZON_YEARS = 30
_MAX_YEAR = 9999
_CRON_FIELD = "schedule.cron"
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()

_MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"), start=1
    )
}
_WEEKDAY_NAMES = {
    name: number for number, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))
}
_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_MONTH_LABELS = ("", "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

# (year, month, day, hour, minute, second) of a naive wall-clock time
_Parts = tuple[int, int, int, int, int, int]

_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_LETTERS = re.compile(r"[A-Za-z]+", re.ASCII)
_ALLOWED_CHARS = re.compile(r"[0-9A-Za-z*,/\-# @]*", re.ASCII)
# The calendar forms, matched case-insensitively on a whole item.
_DOM_RULE = re.compile(r"(L)|(LW)|([0-9]+)W", re.ASCII | re.IGNORECASE)
_DOW_LAST = re.compile(r"([0-9]+|[A-Z]+)L", re.ASCII | re.IGNORECASE)
_DOW_NTH = re.compile(r"([0-9]+|[A-Z]+)#([0-9]+)", re.ASCII | re.IGNORECASE)
_CALENDAR_HINT = "the day-of-month field (L, LW, 15W) and the day-of-week field (5L, 1#3)"


@dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    low: int
    high: int  # highest value a user may write (7 for day-of-week)
    star_high: int  # highest value ``*`` and ``a/n`` reach (6 for day-of-week: 7 is Sunday again)
    names: dict[str, int] | None


_SECOND = _FieldSpec("second", 0, 59, 59, None)
_MINUTE = _FieldSpec("minute", 0, 59, 59, None)
_HOUR = _FieldSpec("hour", 0, 23, 23, None)
_DAY = _FieldSpec("day-of-month", 1, 31, 31, None)
_MONTH = _FieldSpec("month", 1, 12, 12, _MONTH_NAMES)
_WEEKDAY = _FieldSpec("day-of-week", 0, 7, 6, _WEEKDAY_NAMES)


def _is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _days_in_month(year: int, month: int) -> int:
    if month == 2 and _is_leap(year):
        return 29
    return _DAYS_IN_MONTH[month]


def _invalid(message: str) -> InvalidRequest:
    return InvalidRequest(message, code="invalid_cron", field=_CRON_FIELD)


class NthWeekday(NamedTuple):
    """``weekday#nth`` in the day-of-week field: the nth such weekday of the month (1#3: the
    third Monday)."""

    weekday: int  # 0-6, 0 = Sunday
    nth: int  # 1-5


def _weekday_of(target: int, day: int, weekday: int) -> int:
    """The weekday (0 = Sunday) of day ``target`` of the month in which ``day`` is a ``weekday``."""
    return (weekday + target - day) % 7


def _nearest_weekday(target: int, target_weekday: int, last_day: int) -> int | None:
    """The day ``nW`` names in a month of ``last_day`` days whose day ``target`` is a
    ``target_weekday``: that day if it is Monday-Friday, else the nearest weekday without leaving
    the month (Saturday the 1st: Monday the 3rd; Sunday the last: Friday two days before).
    None when the month has no day ``target`` (``31W`` in April), as ``31`` alone has no run
    there: the month's end is ``LW``."""
    if target > last_day:
        return None
    if target_weekday == 6:
        return target - 1 if target > 1 else target + 2
    if target_weekday == 0:
        return target + 1 if target < last_day else target - 2
    return target


@dataclass(frozen=True, slots=True)
class DayRules:
    """The calendar forms of the two day fields, each a rule about one day of one month.

    Day of month: ``last_day`` (``L``), ``last_weekday`` (``LW``, the last Monday-Friday),
    ``nearest_weekday_to`` (``15W``: the weekday nearest the 15th, within the month). Day of week:
    ``last_of`` (``5L``: the last Friday), ``nth_of`` (``1#3``: the third Monday). Every rule needs
    only the day, its weekday and the month's length, so a month's *shape* decides it.
    """

    last_day: bool = False
    last_weekday: bool = False
    nearest_weekday_to: frozenset[int] = frozenset()
    last_of: frozenset[int] = frozenset()
    nth_of: frozenset[NthWeekday] = frozenset()

    @property
    def day_of_month(self) -> bool:
        return self.last_day or self.last_weekday or bool(self.nearest_weekday_to)

    @property
    def day_of_week(self) -> bool:
        return bool(self.last_of or self.nth_of)

    def month_day_matches(self, day: int, weekday: int, last_day: int) -> bool:
        """Whether a day-of-month rule names ``day``, a ``weekday`` of a ``last_day``-day month."""
        if self.last_day and day == last_day:
            return True
        if self.last_weekday:
            last = _weekday_of(last_day, day, weekday)
            if day == (last_day if 1 <= last <= 5 else last_day - 1 if last == 6 else last_day - 2):
                return True
        for target in self.nearest_weekday_to:
            if day == _nearest_weekday(target, _weekday_of(target, day, weekday), last_day):
                return True
        return False

    def week_day_matches(self, day: int, weekday: int, last_day: int) -> bool:
        """Whether a day-of-week rule names ``day``, a ``weekday`` of a ``last_day``-day month."""
        if weekday in self.last_of and day + 7 > last_day:
            return True
        return NthWeekday(weekday, (day - 1) // 7 + 1) in self.nth_of


_NO_RULES = DayRules()


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed cron expression: the allowed values of each field and the Vixie day flags.

    ``day_of_month_star``/``day_of_week_star`` record whether the field was written starting with
    ``*``: Vixie cron ANDs the two day fields when either one is a star form (so ``*/2`` in
    day-of-month with ``MON`` means "odd days that are Mondays") and ORs them only when both are
    restricted. Weekdays are 0-6 with 0 = Sunday; a written 7 is stored as 0. ``rules`` holds the
    calendar forms (``L``, ``W``, ``#``); a field's side matches when its set *or* its rules do.
    """

    source: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days_of_month: frozenset[int]
    months: frozenset[int]
    days_of_week: frozenset[int]
    day_of_month_star: bool
    day_of_week_star: bool
    has_seconds: bool
    rules: DayRules = _NO_RULES
    _seconds_sorted: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _minutes_sorted: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _hours_sorted: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _months_sorted: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _every_day: bool = field(init=False, repr=False, compare=False)
    _month_rules: bool = field(init=False, repr=False, compare=False)
    _week_rules: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Sorted tuples let the search jump with bisect instead of stepping value by value.
        object.__setattr__(self, "_seconds_sorted", tuple(sorted(self.seconds)))
        object.__setattr__(self, "_minutes_sorted", tuple(sorted(self.minutes)))
        object.__setattr__(self, "_hours_sorted", tuple(sorted(self.hours)))
        object.__setattr__(self, "_months_sorted", tuple(sorted(self.months)))
        every_day = (
            self.day_of_month_star
            and self.day_of_week_star
            and len(self.days_of_month) == 31
            and len(self.days_of_week) == 7
        )
        object.__setattr__(self, "_every_day", every_day)
        object.__setattr__(self, "_month_rules", self.rules.day_of_month)
        object.__setattr__(self, "_week_rules", self.rules.day_of_week)

    # -- matching -----------------------------------------------------------------------------

    def day_matches(self, year: int, month: int, day: int) -> bool:
        """The Vixie day rule: AND when either day field is a star form, OR when both are restricted."""
        if self._every_day:
            return True
        weekday = (date(year, month, day).weekday() + 1) % 7
        if not (self._month_rules or self._week_rules):
            dom_ok = day in self.days_of_month
            dow_ok = weekday in self.days_of_week
            if self.day_of_month_star or self.day_of_week_star:
                return dom_ok and dow_ok
            return dom_ok or dow_ok
        return self._day_shape_matches(day, weekday, _days_in_month(year, month))

    def _day_shape_matches(self, day: int, weekday: int, last_day: int) -> bool:
        """``day_matches`` for day ``day``, a ``weekday``, of a month of ``last_day`` days."""
        dom_ok = day in self.days_of_month or (
            self._month_rules and self.rules.month_day_matches(day, weekday, last_day)
        )
        dow_ok = weekday in self.days_of_week or (
            self._week_rules and self.rules.week_day_matches(day, weekday, last_day)
        )
        if self.day_of_month_star or self.day_of_week_star:
            return dom_ok and dow_ok
        return dom_ok or dow_ok

    def matches(self, wall: datetime) -> bool:
        """Whether a naive wall-clock time (to the second, microseconds ignored) matches."""
        return (
            wall.second in self.seconds
            and wall.minute in self.minutes
            and wall.hour in self.hours
            and wall.month in self.months
            and self.day_matches(wall.year, wall.month, wall.day)
        )

    def never_fires_reason(self) -> str | None:
        """Why no calendar day can ever match, or None when some day can.

        Without calendar forms only the day-of-month side can make an expression impossible: every
        weekday falls on every month in some year, and every (month, day) pair that exists in some
        year (29 February included) falls on every weekday within the 400-year Gregorian cycle.

        With them the answer depends on a month's *shape*: its length and the weekday of its 1st.
        Within the 400-year cycle every month starts on every weekday, and February does so both
        in common and in leap years, so trying the (at most) 13 x 7 shapes of the chosen months is
        exact.
        """
        months = ",".join(_MONTH_LABELS[m] for m in sorted(self.months))
        if self._month_rules or self._week_rules:
            for month in self.months:
                for last_day in (28, 29) if month == 2 else (_DAYS_IN_MONTH[month],):
                    for first_weekday in range(7):
                        for day in range(1, last_day + 1):
                            if self._day_shape_matches(day, (first_weekday + day - 1) % 7, last_day):
                                return None
            dom_text, dow_text = self.source.split(" ")[-3], self.source.split(" ")[-1]
            if self.day_of_week_star and len(self.days_of_week) == 7 and not self._week_rules:
                return f"day-of-month {dom_text} does not exist in {months}"
            return (
                f"no day in {months} is both day-of-month {dom_text} and day-of-week {dow_text} "
                f"(a day field written with '*' combines with the other by AND)"
            )
        if not (self.day_of_month_star or self.day_of_week_star):
            return None  # OR rule: the weekday side alone fires every week of the chosen months
        possible = any(
            day <= (29 if month == 2 else _DAYS_IN_MONTH[month])
            for month in self.months
            for day in self.days_of_month
        )
        if possible:
            return None
        days = ",".join(str(d) for d in sorted(self.days_of_month))
        return f"day-of-month {days} does not exist in {months}"

    # -- searching ----------------------------------------------------------------------------

    def next_wall_match(self, after: datetime, inclusive: bool) -> datetime | None:
        """The first matching naive wall time at or after (``inclusive``) or strictly after ``after``.

        Returns None when nothing matches within ``SEARCH_HORIZON_YEARS`` (or before year 9999).
        """
        if after.tzinfo is not None:
            raise ValueError("next_wall_match takes a naive wall-clock datetime")
        start_s = _wall_seconds((after.year, after.month, after.day, after.hour, after.minute, after.second))
        if not inclusive or after.microsecond:
            start_s += 1
        found = self.first_match_at_or_after(start_s)
        if found is None:
            return None
        return _wall_datetime(found)

    def first_match_at_or_after(self, wall_s: int, limit_year: int | None = None) -> int | None:
        """Like ``next_wall_match`` on integer wall seconds since 1970-01-01 (naive), inclusive.

        ``limit_year`` lets a caller that only cares about a bounded window stop early.
        """
        days, rest = divmod(wall_s, 86400)
        ordinal = days + _EPOCH_ORDINAL
        if ordinal < 1 or ordinal > date.max.toordinal():
            return None
        start_day = date.fromordinal(ordinal)
        hour, rest = divmod(rest, 3600)
        minute, second = divmod(rest, 60)
        horizon = start_day.year + SEARCH_HORIZON_YEARS
        if limit_year is not None:
            horizon = min(horizon, limit_year)
        found = self._search(
            (start_day.year, start_day.month, start_day.day, hour, minute, second), min(horizon, _MAX_YEAR)
        )
        if found is None:
            return None
        return _wall_seconds(found)

    def _search(self, start: _Parts, last_year: int) -> _Parts | None:
        """Field-wise jump: fix the month, then the day, hour, minute, second; carry on overflow."""
        year, month, day, hour, minute, second = start
        months, hours = self._months_sorted, self._hours_sorted
        minutes, seconds = self._minutes_sorted, self._seconds_sorted
        month_set, hour_set = self.months, self.hours
        minute_set, second_set = self.minutes, self.seconds
        while True:
            if year > last_year:
                return None
            if month not in month_set:
                index = bisect_left(months, month)
                if index == len(months):
                    year += 1
                    month = months[0]
                else:
                    month = months[index]
                day, hour, minute, second = 1, 0, 0, 0
                continue
            last_day = _days_in_month(year, month)
            if day > last_day:
                month += 1
                if month > 12:
                    year += 1
                    month = 1
                day, hour, minute, second = 1, 0, 0, 0
                continue
            if not self.day_matches(year, month, day):
                day += 1
                while day <= last_day and not self.day_matches(year, month, day):
                    day += 1
                hour, minute, second = 0, 0, 0
                continue  # re-checks the month overflow when no day was left
            if hour not in hour_set:
                index = bisect_left(hours, hour)
                if index == len(hours):
                    day += 1
                    hour, minute, second = 0, 0, 0
                    continue
                hour, minute, second = hours[index], 0, 0
            if minute not in minute_set:
                index = bisect_left(minutes, minute)
                if index == len(minutes):
                    hour += 1
                    minute, second = 0, 0
                    continue
                minute, second = minutes[index], 0
            if second not in second_set:
                index = bisect_left(seconds, second)
                if index == len(seconds):
                    minute += 1
                    second = 0
                    continue
                second = seconds[index]
            return year, month, day, hour, minute, second


def _wall_seconds(parts: _Parts) -> int:
    year, month, day, hour, minute, second = parts
    return (date(year, month, day).toordinal() - _EPOCH_ORDINAL) * 86400 + hour * 3600 + minute * 60 + second


def _wall_datetime(wall_s: int) -> datetime:
    days, rest = divmod(wall_s, 86400)
    day = date.fromordinal(days + _EPOCH_ORDINAL)
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    return datetime(day.year, day.month, day.day, hour, minute, second)


# -- parsing ---------------------------------------------------------------------------------------


def parse_cron(expr: str) -> CronExpr:
    """Parse a 5- or 6-field expression or a macro; raise ``InvalidRequest(code="invalid_cron")``."""
    if not isinstance(expr, str):
        raise _invalid("cron expression must be a string")
    if expr == "":
        raise _invalid("cron expression is empty: write 5 fields, e.g. '0 9 * * MON-FRI', or a macro")
    if len(expr) > MAX_EXPRESSION_LENGTH:
        raise _invalid(f"cron expression is longer than {MAX_EXPRESSION_LENGTH} characters")
    for position, char in enumerate(expr):
        if not (" " <= char <= "~"):
            if char.isdigit():
                raise _invalid(f"character {char!r} at position {position} is not an ASCII digit: use 0-9")
            if char.isspace():
                raise _invalid(
                    f"whitespace {char!r} at position {position}: separate fields with single spaces only"
                )
            raise _invalid(f"character {char!r} at position {position} is not allowed in a cron expression")
    if expr != expr.strip(" "):
        raise _invalid("cron expression has leading or trailing spaces")
    if "  " in expr:
        raise _invalid("cron expression has two spaces in a row: separate fields with single spaces")
    if expr.startswith("@"):
        return _parse_macro(expr)
    if "@" in expr:
        raise _invalid("'@' may only start a macro such as @daily")
    if "?" in expr:
        raise _invalid(
            "'?' (Quartz's 'no specific value') is not accepted: write '*' in its place; a day field "
            "written '*' leaves the other day field in charge, as in Vixie cron"
        )
    bad = _ALLOWED_CHARS.fullmatch(expr)
    if bad is None:
        offending = next(c for c in expr if not _ALLOWED_CHARS.fullmatch(c))
        raise _invalid(
            f"character {offending!r} is not allowed: use digits, names, '*', ',', '-', '/', and "
            f"'L', 'W', '#' in the day fields"
        )
    fields = expr.split(" ")
    if len(fields) == 5:
        has_seconds = False
        second_set = frozenset({0})
        rest = fields
    elif len(fields) == 6:
        has_seconds = True
        second_set, _ = _parse_field(fields[0], _SECOND)
        rest = fields[1:]
    else:
        raise _invalid(
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading "
            f"seconds field, got {len(fields)}"
        )
    minute_set, _ = _parse_field(rest[0], _MINUTE)
    hour_set, _ = _parse_field(rest[1], _HOUR)
    rules = _RuleCollector()
    dom_set, dom_star = _parse_field(rest[2], _DAY, rules)
    month_set, _ = _parse_field(rest[3], _MONTH)
    dow_set, dow_star = _parse_field(rest[4], _WEEKDAY, rules)
    return CronExpr(
        source=expr,
        seconds=second_set,
        minutes=minute_set,
        hours=hour_set,
        days_of_month=dom_set,
        months=month_set,
        days_of_week=frozenset(0 if d == 7 else d for d in dow_set),
        day_of_month_star=dom_star,
        day_of_week_star=dow_star,
        has_seconds=has_seconds,
        rules=rules.frozen(),
    )


def _parse_macro(expr: str) -> CronExpr:
    lowered = expr.lower()
    if lowered == "@reboot":
        raise _invalid("@reboot is not a schedule: a job runs on its schedule, not when a process starts")
    expansion = _MACROS.get(lowered)
    if expansion is None:
        raise _invalid(f"unknown macro {expr!r}: use one of {', '.join(_MACROS)}")
    parsed = parse_cron(expansion)
    return CronExpr(
        source=expr,
        seconds=parsed.seconds,
        minutes=parsed.minutes,
        hours=parsed.hours,
        days_of_month=parsed.days_of_month,
        months=parsed.months,
        days_of_week=parsed.days_of_week,
        day_of_month_star=parsed.day_of_month_star,
        day_of_week_star=parsed.day_of_week_star,
        has_seconds=False,
    )


@dataclass(slots=True)
class _RuleCollector:
    """The calendar forms met while parsing the two day fields, frozen into ``DayRules`` after."""

    last_day: bool = False
    last_weekday: bool = False
    nearest_weekday_to: set[int] = field(default_factory=set)
    last_of: set[int] = field(default_factory=set)
    nth_of: set[NthWeekday] = field(default_factory=set)

    def frozen(self) -> DayRules:
        if not (self.last_day or self.last_weekday or self.nearest_weekday_to or self.last_of or self.nth_of):
            return _NO_RULES
        return DayRules(
            last_day=self.last_day,
            last_weekday=self.last_weekday,
            nearest_weekday_to=frozenset(self.nearest_weekday_to),
            last_of=frozenset(self.last_of),
            nth_of=frozenset(self.nth_of),
        )


def _parse_field(
    text: str, spec: _FieldSpec, rules: _RuleCollector | None = None
) -> tuple[frozenset[int], bool]:
    """One field's allowed values, and whether it starts with ``*`` (the Vixie "star" flag).

    The day fields pass ``rules``: their calendar items (``L``, ``15W``, ``5L``, ``1#3``) go there
    instead of into the set."""
    values: set[int] = set()
    for item in text.split(","):
        if item == "":
            raise _invalid(f"{spec.name} field: empty item in {text!r}")
        if rules is not None and _calendar_item(item, spec, rules):
            continue
        values.update(_parse_item(item, spec))
    return frozenset(values), text.startswith("*")


def _calendar_item(item: str, spec: _FieldSpec, rules: _RuleCollector) -> bool:
    """Record ``item`` in ``rules`` if it is a calendar form of its day field; False when it is an
    ordinary item. A calendar letter used wrongly is refused here, saying how to write it."""
    if spec is _DAY:
        found = _DOM_RULE.fullmatch(item)
        if found is None:
            _refuse_day_of_month_misuse(item)
            return False
        if found.group(1):
            rules.last_day = True
        elif found.group(2):
            rules.last_weekday = True
        else:
            target = int(found.group(3))
            if not 1 <= target <= 31:
                raise _invalid(
                    f"day-of-month field: {target} in {item!r} is out of range 1-31: 'nW' names the "
                    f"weekday nearest day n of the month"
                )
            rules.nearest_weekday_to.add(target)
        return True
    last = _DOW_LAST.fullmatch(item)
    if last is not None and (last.group(1).isdigit() or last.group(1).upper() in _WEEKDAY_NAMES):
        rules.last_of.add(_parse_value(last.group(1), item, spec) % 7)
        return True
    nth = _DOW_NTH.fullmatch(item)
    if nth is not None:
        weekday = _parse_value(nth.group(1), item, spec) % 7
        count = int(nth.group(2))
        if not 1 <= count <= 5:
            raise _invalid(
                f"day-of-week field: '#{count}' in {item!r} is out of range: a month has at most five "
                f"of each weekday, so write 1#1 to 1#5 (1#3 is the third Monday)"
            )
        rules.nth_of.add(NthWeekday(weekday, count))
        return True
    _refuse_day_of_week_misuse(item)
    return False


def _refuse_day_of_month_misuse(item: str) -> None:
    """A day-of-month item holding a calendar letter that is not one of its forms."""
    upper = item.upper()
    if "#" in upper:
        raise _invalid(
            f"day-of-month field: '#' (nth weekday) in {item!r} belongs in the day-of-week field, as "
            f"in 1#3 (the third Monday)"
        )
    if upper.startswith("L-"):
        raise _invalid(
            f"day-of-month field: {item!r} (days before the last) is not supported: write L for the "
            f"last day of the month or LW for its last weekday"
        )
    if "W" in upper:
        raise _invalid(
            f"day-of-month field: 'W' (nearest weekday) in {item!r} takes a single day, as in 15W "
            f"(the weekday nearest the 15th) or LW (the last weekday); it does not combine with a "
            f"range, a step, a list inside the item or '*'"
        )
    if "L" in upper:
        if re.fullmatch(r"[0-9]+L", upper, re.ASCII):
            raise _invalid(
                f"day-of-month field: {item!r}: 'nL' (the last given weekday) belongs in the "
                f"day-of-week field, as in 5L (the last Friday); here write L for the last day"
            )
        raise _invalid(
            f"day-of-month field: 'L' (last day) in {item!r} stands alone, as L or LW; it does not "
            f"combine with a range or a step (list other days beside it: 1,L)"
        )


def _refuse_day_of_week_misuse(item: str) -> None:
    """A day-of-week item holding a calendar letter that is not one of its forms."""
    upper = item.upper()
    if upper == "L":
        raise _invalid(
            "day-of-week field: 'L' alone is ambiguous (Quartz reads it as Saturday): write 6 or SAT "
            "for Saturdays, or a weekday before it for the last one of the month, as in 5L (the last "
            "Friday)"
        )
    if "#" in upper:
        before, _, after = upper.partition("#")
        if before == "":
            raise _invalid(
                f"day-of-week field: {item!r} needs a weekday before '#', as in 1#3 (the third Monday)"
            )
        if after == "":
            raise _invalid(
                f"day-of-week field: {item!r} needs a number 1-5 after '#', as in 1#3 (the third Monday)"
            )
        raise _invalid(
            f"day-of-week field: '#' in {item!r} takes one weekday and one number 1-5, as in 1#3 or "
            f"MON#3 (the third Monday); it does not combine with a range, a step or '*'"
        )
    if upper in ("W", "LW") or re.fullmatch(r"[0-9]+W", upper, re.ASCII):
        raise _invalid(
            f"day-of-week field: 'W' (nearest weekday) in {item!r} belongs in the day-of-month "
            f"field, as in 15W (the weekday nearest the 15th)"
        )
    if upper.startswith("L") and upper[1:].isdigit():
        raise _invalid(
            f"day-of-week field: {item!r}: write the weekday before 'L', as in {upper[1:]}L (the last "
            f"one of the month)"
        )
    if re.search(r"L(?:/|$)", upper) and not upper.isalpha():  # letters alone: a name, or not
        raise _invalid(
            f"day-of-week field: 'L' (last) in {item!r} takes one weekday, as in 5L or FRIL (the last "
            f"Friday of the month); it does not combine with a range, a step or '*'"
        )


def _parse_item(item: str, spec: _FieldSpec) -> range:
    if "#" in item:
        raise _invalid(
            f"{spec.name} field: '#' (nth weekday) in {item!r} is only allowed in the day-of-week "
            f"field, as in 1#3 (the third Monday)"
        )
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not _DIGITS.fullmatch(step_text):
            raise _invalid(f"{spec.name} field: step {step_text!r} in {item!r} is not a positive number")
        step = int(step_text)
        if step == 0:
            raise _invalid(f"{spec.name} field: step 0 in {item!r} never advances: use a step of 1 or more")
    if base == "*":
        low, high = spec.low, spec.star_high
    elif "-" in base:
        first_text, _, last_text = base.partition("-")
        low = _parse_value(first_text, item, spec)
        high = _parse_value(last_text, item, spec)
        if low > high:
            raise _invalid(
                f"{spec.name} field: range {item!r} is reversed ({low} > {high}); ranges do not wrap "
                f"around, write two ranges separated by ','"
            )
    else:
        low = _parse_value(base, item, spec)
        # ``a/n`` runs to the field's last value; a written day-of-week 7 (Sunday) is its own end.
        high = max(spec.star_high, low) if slash else low
    # A step larger than its range (``9-12/5``, ``*/60``) selects the range's first value only.
    # Vixie cron, cronie and croniter accept it, so it is accepted here too; ``cron_notes`` lets
    # the preview point it out, since the writer may have meant something else.
    return range(low, high + 1, step)


def _parse_value(token: str, item: str, spec: _FieldSpec) -> int:
    if token == "":
        raise _invalid(f"{spec.name} field: {item!r} has an empty range bound")
    if _DIGITS.fullmatch(token):
        value = int(token)
        if not spec.low <= value <= spec.high:
            raise _invalid(f"{spec.name} field: {value} is out of range {spec.low}-{spec.high}")
        return value
    upper = token.upper()
    if spec.names is not None and upper in spec.names:
        return spec.names[upper]
    if spec is not _DAY and spec is not _WEEKDAY and re.fullmatch(r"[0-9]*L?W?", upper, re.ASCII):
        letter = "'L' (last)" if "L" in upper else "'W' (nearest weekday)"
        raise _invalid(f"{spec.name} field: {letter} in {item!r} is only allowed in {_CALENDAR_HINT}")
    if spec.names is not None and _LETTERS.fullmatch(token):
        choices = "JAN-DEC" if spec.names is _MONTH_NAMES else "SUN-SAT"
        raise _invalid(f"{spec.name} field: unknown name {token!r} (use {choices} or numbers)")
    raise _invalid(
        f"{spec.name} field: {token!r} is not a number in range {spec.low}-{spec.high}"
        + (" or a name" if spec.names is not None else "")
    )


def cron_notes(expr: str) -> list[str]:
    """Remarks on a *valid* expression that may not mean what its writer thought, for previews.

    Today: a step larger than its range, which Vixie cron accepts and reads as the range's first
    value alone (``56-59/4`` is minute 56). The expression still runs as written.
    """
    text = _MACROS.get(expr.lower(), expr) if expr.startswith("@") else expr
    fields = text.split(" ")
    if len(fields) not in (5, 6):
        return []
    specs = (_SECOND, _MINUTE, _HOUR, _DAY, _MONTH, _WEEKDAY)[6 - len(fields) :]
    notes: list[str] = []
    for field_text, spec in zip(fields, specs, strict=False):
        for item in field_text.split(","):
            _, slash, step_text = item.partition("/")
            if not slash or not _DIGITS.fullmatch(step_text):
                continue
            selected = list(_parse_item(item, spec))
            if len(selected) == 1 and int(step_text) > 1:
                value = selected[0]
                shown = "Sunday" if spec is _WEEKDAY and value in (0, 7) else str(value)
                notes.append(
                    f"{spec.name} field: step {int(step_text)} in {item!r} is larger than its range, "
                    f"so it selects only {shown} (as in Vixie cron); list the values with ',' if you "
                    f"meant more than one"
                )
    return notes
