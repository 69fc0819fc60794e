"""``core.schedule`` against a brute-force reference that shares none of its machinery.

The reference walks UTC minute by minute, reads each instant's wall clock from ``zoneinfo``, and
applies the rules as the API contract words them:
- a wall time matching the cron is an occurrence at that instant, unless it was already shown at an
  earlier instant (an overlap's second pass) and the rule is ``first``;
- when the wall clock jumps forward between two consecutive minutes, the wall times it skipped
  are a gap; with ``shift``, if any of them matches, the instant after the jump is an occurrence.
Cron matching is done on value sets generated here alongside the expression text, so the parser is
not trusted either. Start instants cluster around the zones' DST transitions.
"""

from __future__ import annotations

import itertools
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from typing import Protocol

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime.core.model import CronSchedule, DateRange, DstGap, DstOverlap
from duetime.core.schedule import count_between, latest_at_or_before, next_occurrence, previous_occurrence

MINUTE = timedelta(minutes=1)
WINDOW = timedelta(days=2)
PRE_ROLL = timedelta(hours=6)
CHAIN = 20
DST_ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Pacific/Chatham"]
FLAT_ZONES = ["UTC", "Asia/Kolkata"]


class WallRule(Protocol):
    """What the reference needs of an expression: whether a naive wall time matches it (the
    calendar forms' reference, tests/pure/test_calendar_property.py, brings its own)."""

    def matches(self, wall: datetime) -> bool: ...


@dataclass(frozen=True)
class Cron:
    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    dom_star: bool
    dow_star: bool

    def matches(self, wall: datetime) -> bool:
        if wall.minute not in self.minutes or wall.hour not in self.hours or wall.month not in self.months:
            return False
        dom_ok = wall.day in self.days
        dow_ok = wall.isoweekday() % 7 in self.weekdays
        if self.dom_star or self.dow_star:
            return dom_ok and dow_ok
        return dom_ok or dow_ok


def field(
    low: int, high: int, specials: list[tuple[str, frozenset[int]]], star: range | None = None
) -> st.SearchStrategy:
    """Items drawn from low..high; ``star`` is the whole field, which '*' means."""
    every = st.just(("*", frozenset(star if star is not None else range(low, high + 1))))
    listed = st.lists(st.integers(low, high), min_size=1, max_size=4, unique=True).map(
        lambda values: (",".join(map(str, values)), frozenset(values))
    )

    def ranged(bounds: tuple[int, int]) -> tuple[str, frozenset[int]]:
        first, last = sorted(bounds)
        return f"{first}-{last}", frozenset(range(first, last + 1))

    ranges = st.tuples(st.integers(low, high), st.integers(low, high)).map(ranged)
    return st.one_of(every, listed, ranges, st.sampled_from(specials))


def star_step(low: int, high: int, step: int) -> tuple[str, frozenset[int]]:
    return f"*/{step}", frozenset(range(low, high + 1, step))


def past_range(first: int, last: int, step: int) -> tuple[str, frozenset[int]]:
    """A step larger than its range, which Vixie cron accepts: only ``first`` is selected."""
    assert step > last - first
    return f"{first}-{last}/{step}", frozenset({first})


MINUTES = field(
    0,
    59,
    [
        star_step(0, 59, 15),
        star_step(0, 59, 7),
        ("0", frozenset({0})),
        ("30", frozenset({30})),
        past_range(56, 59, 4),
        ("*/60", frozenset({0})),
    ],
)
# hours around 00:00-04:00 make gaps and overlaps likely; a few broader choices keep variety
HOURS = st.one_of(
    field(0, 4, [("2", frozenset({2})), ("1-3", frozenset({1, 2, 3}))], star=range(24)),
    field(0, 23, [star_step(0, 23, 2), star_step(0, 23, 5), past_range(19, 23, 5), past_range(1, 3, 7)]),
)
DAYS = st.one_of(
    st.just(("*", frozenset(range(1, 32)))),
    st.just(("*", frozenset(range(1, 32)))),
    field(1, 31, [star_step(1, 31, 2)]),
)
MONTHS = st.one_of(
    st.just(("*", frozenset(range(1, 13)))),
    field(1, 12, [star_step(1, 12, 3), past_range(9, 12, 5), past_range(2, 3, 12)]),
)


def sunday_is_seven(drawn: tuple[str, frozenset[int]]) -> tuple[str, frozenset[int]]:
    """Weekdays written 0-7: a written 7 is Sunday, the reference's 0."""
    text, values = drawn
    return text, frozenset(0 if v == 7 else v for v in values)


WEEKDAYS = st.one_of(
    st.just(("*", frozenset(range(7)))),
    st.just(("*", frozenset(range(7)))),
    field(
        0,
        7,
        [
            star_step(0, 6, 2),
            ("1-5", frozenset(range(1, 6))),
            ("7", frozenset({7})),
            ("5-7", frozenset({5, 6, 7})),
            past_range(5, 7, 3),
        ],
    ).map(sunday_is_seven),
)


@st.composite
def crons(draw: st.DrawFn) -> Cron:
    minute, hour, dom, month, dow = draw(MINUTES), draw(HOURS), draw(DAYS), draw(MONTHS), draw(WEEKDAYS)
    return Cron(
        text=" ".join((minute[0], hour[0], dom[0], month[0], dow[0])),
        minutes=minute[1],
        hours=hour[1],
        days=dom[1],
        months=month[1],
        weekdays=dow[1],
        dom_star=dom[0].startswith("*"),
        dow_star=dow[0].startswith("*"),
    )


@cache
def transitions(zone_name: str) -> tuple[datetime, ...]:
    """Where the offset changes in 2023-2026, by stepping 15 minutes (all six zones change on
    a quarter hour); only used to pick interesting start instants."""
    zone = zoneinfo.ZoneInfo(zone_name)
    found = []
    cursor = datetime(2023, 1, 1, tzinfo=UTC)
    previous = cursor.astimezone(zone).utcoffset()
    while cursor.year < 2027:
        cursor += timedelta(minutes=15)
        offset = cursor.astimezone(zone).utcoffset()
        if offset != previous:
            found.append(cursor)
            previous = offset
    return tuple(found)


@st.composite
def starts(draw: st.DrawFn, zone_name: str) -> datetime:
    marks = transitions(zone_name)
    if marks and draw(st.integers(0, 9)) < 8:
        base = draw(st.sampled_from(marks))
        moved = base + timedelta(minutes=draw(st.integers(-36 * 60, 6 * 60)))
    else:
        moved = datetime(2023, 1, 1, tzinfo=UTC) + timedelta(minutes=draw(st.integers(0, 4 * 365 * 1440)))
    fraction = draw(st.sampled_from([0, 0, 30, 59]))
    micro = draw(st.sampled_from([0, 0, 1, 999_999]))
    return moved.replace(second=fraction, microsecond=micro)


def reference(cron: WallRule, rules: CronSchedule, low: datetime, high: datetime) -> list[datetime]:
    """Every occurrence in [low, high], walking UTC minutes; takes only the zone and DST rules
    from ``rules`` (start_at/end_at are applied by the caller)."""
    zone = zoneinfo.ZoneInfo(rules.timezone)
    gap, overlap = rules.dst_gap, rules.dst_overlap
    cursor = low.replace(second=0, microsecond=0) - PRE_ROLL
    previous_wall = cursor.astimezone(zone).replace(tzinfo=None)
    latest_wall = previous_wall
    found = []
    while cursor < high:
        cursor += MINUTE
        wall = cursor.astimezone(zone).replace(tzinfo=None)
        occurs = False
        if gap == DstGap.SHIFT and wall - previous_wall > MINUTE:
            skipped = previous_wall + MINUTE
            while skipped < wall:
                if cron.matches(skipped):
                    occurs = True
                    break
                skipped += MINUTE
        shown_before = wall <= latest_wall
        if cron.matches(wall) and (overlap == DstOverlap.BOTH or not shown_before):
            occurs = True
        if occurs and low <= cursor <= high:
            found.append(cursor)
        previous_wall = wall
        latest_wall = max(latest_wall, wall)
    return found


@st.composite
def cases(draw: st.DrawFn) -> tuple[CronSchedule, Cron, datetime]:
    zone_name = draw(st.sampled_from(DST_ZONES + DST_ZONES + FLAT_ZONES))
    cron = draw(crons())
    after = draw(starts(zone_name))
    start_at = end_at = None
    if draw(st.integers(0, 4)) == 0:
        start_at = after + timedelta(
            minutes=draw(st.integers(-60, 24 * 60)), seconds=draw(st.integers(0, 59))
        )
    if draw(st.integers(0, 4)) == 0:
        end_at = after + timedelta(minutes=draw(st.integers(1, 36 * 60)), seconds=draw(st.integers(0, 59)))
        if start_at is not None and start_at >= end_at:
            start_at = None
    schedule = CronSchedule(
        cron=cron.text,
        timezone=zone_name,
        start_at=start_at,
        end_at=end_at,
        dst_gap=draw(st.sampled_from(list(DstGap))),
        dst_overlap=draw(st.sampled_from(list(DstOverlap))),
        exclude=draw(excludes(after, zone_name)),
    )
    return schedule, cron, after


@st.composite
def excludes(draw: st.DrawFn, around: datetime, zone_name: str) -> tuple[DateRange, ...]:
    """Sometimes none; else a few local days and ranges near ``around`` (often a DST day)."""
    if draw(st.integers(0, 2)) == 0:
        return ()
    local = around.astimezone(zoneinfo.ZoneInfo(zone_name)).date()
    ranges = []
    for _ in range(draw(st.integers(1, 4))):
        first = local + timedelta(days=draw(st.integers(-1, 3)))
        ranges.append(DateRange(first, first + timedelta(days=draw(st.sampled_from([0, 0, 1, 2])))))
    return tuple(ranges)


def not_excluded(schedule: CronSchedule, instants: list[datetime]) -> list[datetime]:
    """The reference's reading of exclude: the instant's date on the zone's wall clock."""
    zone = zoneinfo.ZoneInfo(schedule.timezone)
    return [
        instant
        for instant in instants
        if not any(r.first <= instant.astimezone(zone).date() <= r.last for r in schedule.exclude)
    ]


def within_bounds(schedule: CronSchedule, instants: list[datetime]) -> list[datetime]:
    return not_excluded(
        schedule,
        [
            instant
            for instant in instants
            if (schedule.start_at is None or instant >= schedule.start_at)
            and (schedule.end_at is None or instant <= schedule.end_at)
        ],
    )


@settings(
    max_examples=1200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases(), probe=st.integers(0, 2 * 24 * 60))
def test_matches_brute_force_reference(case: tuple[CronSchedule, Cron, datetime], probe: int) -> None:
    schedule, cron, after = case
    horizon = after + WINDOW
    everything = reference(cron, schedule, after, horizon)
    expected = [instant for instant in within_bounds(schedule, everything) if instant > after][:CHAIN]

    chain: list[datetime] = []
    cursor = after
    while len(chain) < CHAIN:
        following = next_occurrence(schedule, cursor)
        if following is None or following > horizon:
            break
        assert following > cursor
        chain.append(following)
        cursor = following
    assert chain == expected, (schedule, after)
    # the run context's "occurrence before" is the walk's step back (core.runpath.RunContext)
    for earlier, later in itertools.pairwise(chain):
        assert previous_occurrence(schedule, later) == earlier, (schedule, later)

    # the misfire helpers must agree with the same reference on a window inside the walk
    at = min(after + timedelta(minutes=probe, seconds=17), horizon)  # the reference ends at horizon
    bounded = [instant for instant in within_bounds(schedule, everything) if after <= instant <= at]
    assert latest_at_or_before(schedule, at, after) == (bounded[-1] if bounded else None)
    assert count_between(schedule, after, at, cap=10_000) == len([i for i in bounded if i > after])


def test_reference_sees_the_gap_and_overlap() -> None:
    """The reference itself, on a hand-checked Berlin day: guards the guard."""
    cron = Cron("30 2 * * *", frozenset({30}), frozenset({2}), frozenset(range(1, 32)),
                frozenset(range(1, 13)), frozenset(range(7)), True, True)  # fmt: skip
    spring = (datetime(2024, 3, 30, 12, tzinfo=UTC), datetime(2024, 4, 1, 12, tzinfo=UTC))

    def berlin(gap: DstGap, overlap: DstOverlap) -> CronSchedule:
        return CronSchedule(cron="30 2 * * *", timezone="Europe/Berlin", dst_gap=gap, dst_overlap=overlap)

    assert reference(cron, berlin(DstGap.SHIFT, DstOverlap.FIRST), *spring) == [
        datetime(2024, 3, 31, 1, 0, tzinfo=UTC),
        datetime(2024, 4, 1, 0, 30, tzinfo=UTC),
    ]
    assert reference(cron, berlin(DstGap.SKIP, DstOverlap.FIRST), *spring) == [
        datetime(2024, 4, 1, 0, 30, tzinfo=UTC)
    ]
    autumn = (datetime(2024, 10, 26, 12, tzinfo=UTC), datetime(2024, 10, 28, 12, tzinfo=UTC))
    assert reference(cron, berlin(DstGap.SHIFT, DstOverlap.BOTH), *autumn) == [
        datetime(2024, 10, 27, 0, 30, tzinfo=UTC),
        datetime(2024, 10, 27, 1, 30, tzinfo=UTC),
        datetime(2024, 10, 28, 1, 30, tzinfo=UTC),
    ]
    assert date(2024, 10, 27).isoweekday() % 7 == 0  # the Vixie weekday numbering used above
