"""The cron dialect Duetime accepts, parsed once into sets of allowed values per field.

Everything here is about the *wall clock* only: a ``CronExpr`` answers "which naive wall-clock
second matches next?". Time zones, DST gaps and overlaps are ``core.schedule``'s business; keeping
them apart lets this module be tested exhaustively with plain naive datetimes.

The parser is strict on purpose. A cron expression is stored for years and read by people who did
not write it, so anything a reader could misread (tabs, double spaces, ``L``/``W``/``#`` extensions
other crons accept, Unicode digits that ``int()`` would happily take) is refused with a message that
names the field and the allowed range instead of being guessed at.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import date, datetime

from duetime.core.errors import InvalidRequest

__all__ = ["MAX_EXPRESSION_LENGTH", "SEARCH_HORIZON_YEARS", "CronExpr", "cron_notes", "parse_cron"]

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
_ALLOWED_CHARS = re.compile(r"[0-9A-Za-z*,/\- @]*", re.ASCII)


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


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed cron expression: the allowed values of each field and the Vixie day flags.

    ``day_of_month_star``/``day_of_week_star`` record whether the field was written starting with
    ``*``: Vixie cron ANDs the two day fields when either one is a star form (so ``*/2`` in
    day-of-month with ``MON`` means "odd days that are Mondays") and ORs them only when both are
    restricted. Weekdays are 0-6 with 0 = Sunday; a written 7 is stored as 0.
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
    _seconds_sorted: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _minutes_sorted: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _hours_sorted: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _months_sorted: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _every_day: bool = field(init=False, repr=False, compare=False)

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

    # -- matching -----------------------------------------------------------------------------

    def day_matches(self, year: int, month: int, day: int) -> bool:
        """The Vixie day rule: AND when either day field is a star form, OR when both are restricted."""
        if self._every_day:
            return True
        dom_ok = day in self.days_of_month
        dow_ok = (date(year, month, day).weekday() + 1) % 7 in self.days_of_week
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

        Only the day-of-month side can make an expression impossible: every weekday falls on every
        month in some year, and every (month, day) pair that exists in some year (29 February
        included) falls on every weekday within the 400-year Gregorian cycle.
        """
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
        months = ",".join(_MONTH_LABELS[m] for m in sorted(self.months))
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
    for char, meaning in (("?", "'?' (no specific value)"), ("#", "'#' (nth weekday of the month)")):
        if char in expr:
            raise _invalid(f"{meaning} is not supported: this dialect has no Quartz extensions")
    bad = _ALLOWED_CHARS.fullmatch(expr)
    if bad is None:
        offending = next(c for c in expr if not _ALLOWED_CHARS.fullmatch(c))
        raise _invalid(f"character {offending!r} is not allowed: use digits, names, '*', ',', '-' and '/'")
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
    dom_set, dom_star = _parse_field(rest[2], _DAY)
    month_set, _ = _parse_field(rest[3], _MONTH)
    dow_set, dow_star = _parse_field(rest[4], _WEEKDAY)
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


def _parse_field(text: str, spec: _FieldSpec) -> tuple[frozenset[int], bool]:
    """One field's allowed values, and whether it starts with ``*`` (the Vixie "star" flag)."""
    values: set[int] = set()
    for item in text.split(","):
        if item == "":
            raise _invalid(f"{spec.name} field: empty item in {text!r}")
        values.update(_parse_item(item, spec))
    return frozenset(values), text.startswith("*")


def _parse_item(item: str, spec: _FieldSpec) -> range:
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
    if upper == "L" or (upper.endswith("L") and upper[:-1].isdigit()):
        raise _invalid(f"{spec.name} field: 'L' (last) in {item!r} is not supported")
    if upper in ("W", "LW") or (upper.endswith("W") and upper[:-1].isdigit()):
        raise _invalid(f"{spec.name} field: 'W' (nearest weekday) in {item!r} is not supported")
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
