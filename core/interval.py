"""Interval schedules (``{"every": "90m"}``): the duration grammar and the occurrence arithmetic.

An interval schedule's occurrences are ``start_at + k × every`` for k ≥ 0, in exact elapsed time:
no wall clock is involved, so daylight saving never moves them (a "1d" interval started at 09:00
in Berlin runs at 10:00 local after the autumn change). Where a wall-clock meaning is wanted, a
cron schedule is the tool. Everything is integer microseconds since the Unix epoch, so a
``start_at`` with a fraction of a second keeps it exactly on every occurrence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from duetime.core.errors import InvalidRequest

__all__ = ["MAX_EVERY_S", "MIN_EVERY_S", "IntervalMath", "parse_every"]

MIN_EVERY_S = 1
MAX_EVERY_S = 366 * 86400
_FIELD = "schedule.every"
_US = 1_000_000
# one or more integer-unit parts, in the order d, h, m, s, each at most once
_GRAMMAR = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?", re.ASCII)
_UNITS = (86400, 3600, 60, 1)


def parse_every(text: object) -> int:
    """The interval in seconds; ``InvalidRequest(code="invalid_every")`` when it is not one.

    Parts are ``Nd``, ``Nh``, ``Nm``, ``Ns`` in that order, each at most once, integers only
    (``"90m"``, ``"1h30m"``, ``"7d"``), from 1 s to 366 days.
    """
    if not isinstance(text, str):
        raise InvalidRequest(
            f"schedule.every must be a duration string such as '90m' or '1h30m', got {type(text).__name__}",
            code="invalid_every",
            field=_FIELD,
        )
    match = _GRAMMAR.fullmatch(text) if text and len(text) <= 64 else None
    if match is None or not any(match.groups()):
        shown = text[:40]
        raise InvalidRequest(
            f"schedule.every {shown!r} is not a duration: write integer parts Nd, Nh, Nm, Ns in that "
            f"order, each at most once, without spaces, e.g. '90m', '1h30m', '7d'",
            code="invalid_every",
            field=_FIELD,
        )
    total = sum(int(part) * unit for part, unit in zip(match.groups(), _UNITS, strict=True) if part)
    if not MIN_EVERY_S <= total <= MAX_EVERY_S:
        raise InvalidRequest(
            f"schedule.every {text!r} is {total} s; an interval runs from 1 s to 366 days ({MAX_EVERY_S} s)",
            code="invalid_every",
            field=_FIELD,
        )
    return total


@dataclass(frozen=True, slots=True)
class IntervalMath:
    """Occurrences ``start + k × step`` (integer microseconds) within ``[start, end]``."""

    start: int
    step: int
    end: int | None  # inclusive bound, or None

    def first_at_or_after(self, low: int) -> int | None:
        """The smallest occurrence ≥ ``low``, or None past the end."""
        if low <= self.start:
            found = self.start
        else:
            k = -((self.start - low) // self.step)  # ceil((low - start) / step)
            found = self.start + k * self.step
        return found if self.end is None or found <= self.end else None

    def last_at_or_before(self, high: int) -> int | None:
        """The largest occurrence ≤ ``high``, or None before the start."""
        if self.end is not None:
            high = min(high, self.end)
        if high < self.start:
            return None
        return self.start + (high - self.start) // self.step * self.step

    def count_in(self, low: int, high: int) -> int:
        """How many occurrences lie in [low, high]."""
        first = self.first_at_or_after(low)
        last = self.last_at_or_before(high)
        if first is None or last is None or first > last:
            return 0
        return (last - first) // self.step + 1
