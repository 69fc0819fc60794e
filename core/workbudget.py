"""A count (and optionally a cap) of the schedule search work one request does.

Schedule math is cheap per step but its number of steps grows with what a client sends: a sparse
cron walks years per occurrence, every excluded range met is a jump, every year of a zone's
timeline not seen before costs a probe of the tz database. A request that asks for that work
(a preview, a backfill, a job whose spec must be checked) carries a ``WorkBudget``; the schedule
functions charge it as they go, so the API can both cap the work (``WorkExhausted`` stops the
walk) and charge its cost against the owner's rate limit (``spent``). The engine passes none:
what it computes is bounded by the 30-year search horizon and by the job, not by a request.

A step is one bounded piece of search: one segment of a zone's offsets visited, one wall-clock
search of the cron fields, one excluded range jumped, one candidate occurrence tested. A year of a
zone's timeline probed for the first time costs ``YEAR_PROBE_STEPS`` (``EARLY_YEAR_PROBE_STEPS``
before 1970, where it probes every day). Measured on the development machine a step is 3 to 9 µs
(docs/preview.md).
"""

from __future__ import annotations

__all__ = ["EARLY_YEAR_PROBE_STEPS", "YEAR_PROBE_STEPS", "WorkBudget", "WorkExhausted"]

# A year of offsets probed for the first time: about 100 zoneinfo calls from 1970 on (a probe
# every 6 days), about 400 before (a probe a day).
YEAR_PROBE_STEPS = 20
EARLY_YEAR_PROBE_STEPS = 80


class WorkExhausted(Exception):
    """The request's budget of search steps ran out; the walk stops where it stands."""


class WorkBudget:
    """Steps spent so far, and the cap (None: count only, never stop)."""

    __slots__ = ("limit", "spent")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.spent = 0

    def spend(self, steps: int = 1) -> None:
        self.spent += steps
        if self.limit is not None and self.spent > self.limit:
            raise WorkExhausted(f"more than {self.limit} schedule search steps")

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.spent >= self.limit
