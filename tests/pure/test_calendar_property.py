"""Cron's calendar forms (``L``, ``LW``, ``nW``, ``nL``, ``n#k``) against a reference that shares
none of the parser's code.

Each form is read here as its definition says it, on ``datetime.date`` alone: the last day is the
day whose next day is in another month; the last weekday is the last Monday-Friday of the month's
list of days; ``nW`` is the Monday-Friday of the same month nearest to day n (no such run when the
month has no day n); ``nL`` is weekday n with no same weekday a week later in the month; ``n#k`` is
weekday n counted k-th among the month's days. The expression text and these predicates are drawn
together, so the parser is not trusted to say what the text means.

Three checks:
- the day rule over every day of 2023-2031 (leap Februaries, every month shape many times);
- the full occurrence walk of ``core.schedule`` against ``test_schedule_property.reference`` (UTC
  minute by minute, DST gap and overlap rules as the contract words them), from instants near the
  zones' transitions, which fall on exactly the days these forms name (the last Sunday of March and
  October in Berlin, the second and first Sundays in New York), and near month ends;
- ``never_fires_reason`` against a day walk over 2000-2040, in which every month shape occurs.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime.core.cron import parse_cron
from duetime.core.errors import InvalidRequest
from duetime.core.model import CronSchedule, DstGap, DstOverlap
from duetime.core.schedule import check_cron_schedule, next_occurrence
from tests.pure.test_schedule_property import (
    DST_ZONES,
    FLAT_ZONES,
    HOURS,
    MINUTES,
    MONTHS,
    WINDOW,
    reference,
    transitions,
    within_bounds,
)

DayRule = Callable[[date], bool]
_DAY = timedelta(days=1)
_WEEK = timedelta(days=7)
NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


def month_days(day: date) -> list[date]:
    first = day.replace(day=1)
    found = []
    cursor = first
    while cursor.month == first.month:
        found.append(cursor)
        cursor += _DAY
    return found


def weekday(day: date) -> int:
    """0 = Sunday, as cron numbers them."""
    return day.isoweekday() % 7


def is_monday_to_friday(day: date) -> bool:
    return day.isoweekday() <= 5


def last_day(day: date) -> bool:
    return (day + _DAY).month != day.month


def last_weekday(day: date) -> bool:
    return day == [d for d in month_days(day) if is_monday_to_friday(d)][-1]


def nearest_weekday(target: int) -> DayRule:
    def rule(day: date) -> bool:
        if target > len(month_days(day)):
            return False
        candidates = [d for d in month_days(day) if is_monday_to_friday(d)]
        return day == min(candidates, key=lambda d: abs(d.day - target))

    return rule


def last_of(wanted: int) -> DayRule:
    return lambda day: weekday(day) == wanted and (day + _WEEK).month != day.month


def nth_of(wanted: int, nth: int) -> DayRule:
    def rule(day: date) -> bool:
        same = [d for d in month_days(day) if weekday(d) == wanted]
        return weekday(day) == wanted and same.index(day) + 1 == nth

    return rule


def plain_day(value: int) -> DayRule:
    return lambda day: day.day == value


def plain_weekday(value: int) -> DayRule:
    return lambda day: weekday(day) == value % 7


@dataclass(frozen=True)
class CalendarCron:
    """An expression's text and its meaning, day fields as lists of predicates."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    months: frozenset[int]
    dom: tuple[DayRule, ...] | None  # None: '*'
    dow: tuple[DayRule, ...] | None
    # The day of month is written as a star form ('*/10'): restricted, yet ANDed (Vixie).
    dom_star_form: bool = False
    _days: dict[date, bool] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def day_ok(self, day: date) -> bool:
        known = self._days.get(day)
        if known is None:
            dom_ok = self.dom is None or any(rule(day) for rule in self.dom)
            dow_ok = self.dow is None or any(rule(day) for rule in self.dow)
            # Vixie: OR only when both day fields are restricted and neither starts with '*'.
            either = self.dom is not None and self.dow is not None and not self.dom_star_form
            known = (dom_ok or dow_ok) if either else dom_ok and dow_ok
            self._days[day] = known
        return known

    def matches(self, wall: datetime) -> bool:
        return (
            wall.minute in self.minutes
            and wall.hour in self.hours
            and wall.month in self.months
            and self.day_ok(wall.date())
        )


Item = tuple[str, DayRule]

# Days near the transitions of the zones used (last week of the month in Europe and Chatham, the
# first two weeks in New York and Lord Howe) and the month edges, where W turns round.
W_TARGETS = st.one_of(
    st.sampled_from([1, 2, 3, 7, 8, 10, 13, 14, 24, 25, 27, 28, 29, 30, 31]), st.integers(1, 31)
)


def written_weekday(value: int, style: int) -> str:
    """0-7 as a number, or (0-6) as a name in some letter case."""
    if style == 0 or value == 7:
        return str(value)
    name = NAMES[value]
    return name if style == 1 else name.lower()


DOM_ITEMS: st.SearchStrategy[Item] = st.one_of(
    st.just(("L", last_day)),
    st.just(("l", last_day)),
    st.just(("LW", last_weekday)),
    W_TARGETS.map(lambda n: (f"{n}W", nearest_weekday(n))),
    st.integers(1, 31).map(lambda n: (str(n), plain_day(n))),
)


@st.composite
def dow_items(draw: st.DrawFn) -> Item:
    # Sundays most often: every zone here changes its clocks on a Sunday.
    value = draw(st.one_of(st.just(0), st.just(7), st.integers(0, 7)))
    text = written_weekday(value, draw(st.integers(0, 2)))
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return text, plain_weekday(value)
    if kind == 1:
        return f"{text}L", last_of(value % 7)
    nth = draw(st.sampled_from([1, 2, 5]) if kind == 2 else st.integers(1, 5))
    return f"{text}#{nth}", nth_of(value % 7, nth)


def listed(items: st.SearchStrategy[Item]) -> st.SearchStrategy[tuple[str, tuple[DayRule, ...]]]:
    return st.lists(items, min_size=1, max_size=3).map(
        lambda chosen: (",".join(t for t, _ in chosen), tuple(r for _, r in chosen))
    )


STAR = ("*", None)
DOM = st.one_of(st.just(STAR), listed(DOM_ITEMS))
DOW = st.one_of(st.just(STAR), listed(dow_items()))


@st.composite
def calendar_crons(draw: st.DrawFn) -> CalendarCron:
    dom_text, dom = draw(DOM)
    dow_text, dow = draw(DOW)
    if dom is None and dow is None:  # at least one calendar form, or this file tests nothing new
        if draw(st.booleans()):
            dom_text, dom = draw(listed(DOM_ITEMS))
        else:
            dow_text, dow = draw(listed(dow_items()))
    minute, hour, month = draw(MINUTES), draw(HOURS), draw(MONTHS)
    return CalendarCron(
        text=" ".join((minute[0], hour[0], dom_text, month[0], dow_text)),
        minutes=minute[1],
        hours=hour[1],
        months=month[1],
        dom=dom,
        dow=dow,
    )


def has_calendar_form(text: str) -> bool:
    days = " ".join(text.split(" ")[2::2]).upper()
    return any(mark in days for mark in ("L", "W", "#"))


# -- the day rule, every day of nine years ------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cron=calendar_crons())
def test_day_rule_matches_the_reference(cron: CalendarCron) -> None:
    parsed = parse_cron(cron.text)
    day = date(2023, 1, 1)
    while day.year < 2032:
        assert parsed.day_matches(day.year, day.month, day.day) == cron.day_ok(day), (cron.text, day)
        day += _DAY


# -- occurrences with DST rules, minute by minute -----------------------------------------------------


@st.composite
def starts(draw: st.DrawFn, zone_name: str) -> datetime:
    marks = transitions(zone_name)
    choice = draw(st.integers(0, 9))
    if marks and choice < 6:
        moved = draw(st.sampled_from(marks)) + timedelta(minutes=draw(st.integers(-36 * 60, 6 * 60)))
    elif choice < 9:
        # around a month's end on the zone's wall clock: L, LW and 31W turn round there
        year, month = draw(st.integers(2023, 2026)), draw(st.integers(1, 12))
        first_next = date(year + month // 12, month % 12 + 1, 1)
        local = datetime.combine(first_next, datetime.min.time(), zoneinfo.ZoneInfo(zone_name))
        moved = local.astimezone(UTC) + timedelta(minutes=draw(st.integers(-3 * 1440, 1440)))
    else:
        moved = datetime(2023, 1, 1, tzinfo=UTC) + timedelta(minutes=draw(st.integers(0, 4 * 365 * 1440)))
    return moved.replace(second=draw(st.sampled_from([0, 0, 30, 59])), microsecond=0)


DOM_FORMS: list[Item] = [("L", last_day), ("LW", last_weekday)] + [
    (f"{n}W", nearest_weekday(n)) for n in range(1, 32)
]
DOW_FORMS: list[Item] = [(f"{w}L", last_of(w % 7)) for w in range(8)] + [
    (f"{NAMES[w]}#{k}", nth_of(w, k)) for w in range(7) for k in range(1, 6)
]


@st.composite
def aimed(draw: st.DrawFn, cron: CalendarCron, day: date) -> CalendarCron:
    """``cron`` with a day field replaced by calendar forms of which one names ``day`` (the
    reference's predicates choose it), so that occurrences fall in the walked window, often on a
    transition day. The other day field stays as drawn, or becomes '*'."""
    side = draw(st.integers(0, 2))
    dom_hits = [item for item in DOM_FORMS if item[1](day)]
    if not dom_hits:  # a weekend day that is not the last: no day-of-month form names it
        side = max(side, 1)
    dom: tuple[DayRule, ...] | None
    dow: tuple[DayRule, ...] | None
    if side == 0:
        hit = draw(st.sampled_from(dom_hits))
        more = draw(st.lists(DOM_ITEMS, max_size=1))
        dom_text, dom = ",".join(t for t, _ in [hit, *more]), tuple(r for _, r in [hit, *more])
        dow_text, dow = ("*", None) if draw(st.booleans()) else (cron.text.split(" ")[4], cron.dow)
    else:
        hit = draw(st.sampled_from([item for item in DOW_FORMS if item[1](day)]))
        more = draw(st.lists(dow_items(), max_size=1))
        dow_text, dow = ",".join(t for t, _ in [hit, *more]), tuple(r for _, r in [hit, *more])
        dom_text, dom = ("*", None) if side == 1 else (cron.text.split(" ")[2], cron.dom)
    minute, hour, _, month, _ = cron.text.split(" ")
    months = cron.months
    if day.month not in months:
        month, months = "*", frozenset(range(1, 13))
    return CalendarCron(
        text=" ".join((minute, hour, dom_text, month, dow_text)),
        minutes=cron.minutes,
        hours=cron.hours,
        months=months,
        dom=dom,
        dow=dow,
    )


@st.composite
def cases(draw: st.DrawFn) -> tuple[CronSchedule, CalendarCron, datetime]:
    zone_name = draw(st.sampled_from(DST_ZONES + DST_ZONES + FLAT_ZONES))
    cron = draw(calendar_crons())
    after = draw(starts(zone_name))
    if draw(st.integers(0, 2)) > 0:
        within = after + timedelta(minutes=draw(st.integers(0, 40 * 60)))
        coming = [mark for mark in transitions(zone_name) if after < mark < after + WINDOW]
        on_the_day = draw(st.booleans())
        if coming and on_the_day:  # the day of the clock change itself
            within = coming[0] + timedelta(minutes=draw(st.integers(-60, 60)))
        cron = draw(aimed(cron, within.astimezone(zoneinfo.ZoneInfo(zone_name)).date()))
    schedule = CronSchedule(
        cron=cron.text,
        timezone=zone_name,
        dst_gap=draw(st.sampled_from(list(DstGap))),
        dst_overlap=draw(st.sampled_from(list(DstOverlap))),
    )
    return schedule, cron, after


@settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases())
def test_occurrences_match_the_minute_walk(case: tuple[CronSchedule, CalendarCron, datetime]) -> None:
    schedule, cron, after = case
    horizon = after + WINDOW
    expected = [i for i in within_bounds(schedule, reference(cron, schedule, after, horizon)) if i > after]
    chain: list[datetime] = []
    cursor = after
    while True:
        following = next_occurrence(schedule, cursor)
        if following is None or following > horizon:
            break
        chain.append(following)
        cursor = following
    assert chain == expected, (schedule, after)


# -- a longer chain, day by day, in UTC ---------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cron=calendar_crons(), start=st.integers(0, 3 * 365))
def test_daily_chain_over_years(cron: CalendarCron, start: int) -> None:
    """The same expression at 12:00 UTC only: each occurrence is one matching day, so a chain of
    up to 40 covers months and years (the minute walk above covers two days)."""
    text = " ".join(["0", "12", *cron.text.split(" ")[2:]])
    schedule = CronSchedule(cron=text, timezone="UTC")
    day = date(2023, 1, 1) + timedelta(days=start)
    expected: list[datetime] = []
    while len(expected) < 40 and day.year < 2033:
        if day.month in cron.months and cron.day_ok(day):
            expected.append(datetime(day.year, day.month, day.day, 12, tzinfo=UTC))
        day += _DAY
    cursor = datetime.combine(date(2023, 1, 1) + timedelta(days=start), datetime.min.time(), UTC)
    chain: list[datetime] = []
    while len(chain) < len(expected):
        following = next_occurrence(schedule, cursor)
        assert following is not None, (text, cursor)
        chain.append(following)
        cursor = following
    assert chain == expected, text


# -- never firing ------------------------------------------------------------------------------------

# Expressions that often cannot fire: few months, a star-form day of month that ANDs with a
# day-of-week rule, W targets past short months' ends.
FEW_MONTHS = st.sampled_from(
    [
        ("2", frozenset({2})),
        ("4,6,9,11", frozenset({4, 6, 9, 11})),
        ("2,4", frozenset({2, 4})),
        ("*", frozenset(range(1, 13))),
    ]
)
STAR_DAYS = st.sampled_from(
    [("*/10", (1, 11, 21, 31)), ("*/20", (1, 21)), ("*/15", (1, 16, 31)), ("*/2", tuple(range(1, 32, 2)))]
)


@st.composite
def rare_crons(draw: st.DrawFn) -> CalendarCron:
    month_text, months = draw(FEW_MONTHS)
    if draw(st.booleans()):
        star_text, star_days = draw(STAR_DAYS)
        dow_text, dow = draw(listed(dow_items()))
        return CalendarCron(
            text=f"0 0 {star_text} {month_text} {dow_text}",
            minutes=frozenset({0}),
            hours=frozenset({0}),
            months=months,
            dom=(lambda day: day.day in star_days,),
            dow=dow,
            dom_star_form=True,
        )
    near_the_end = W_TARGETS.filter(lambda n: n >= 28).map(lambda n: (f"{n}W", nearest_weekday(n)))
    dom_text, dom = draw(listed(st.one_of(near_the_end, DOM_ITEMS)))
    return CalendarCron(
        text=f"0 0 {dom_text} {month_text} *",
        minutes=frozenset({0}),
        hours=frozenset({0}),
        months=months,
        dom=dom,
        dow=None,
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cron=rare_crons())
def test_never_fires_is_exact(cron: CalendarCron) -> None:
    """2000-2040 holds every month shape: each month starts on every weekday, and 29 February
    falls on every weekday (2000 to 2024)."""
    day = date(2000, 1, 1)
    fires = False
    while day.year <= 2040 and not fires:
        fires = day.month in cron.months and cron.day_ok(day)
        day += _DAY
    assert (parse_cron(cron.text).never_fires_reason() is None) == fires, cron.text


# -- hand-checked cases --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "first", "expected"),
    [
        # 2024: June 15 is a Saturday, September 1 a Sunday, June 30 a Sunday, March 31 a Sunday
        ("0 0 15W 6 *", date(2024, 1, 1), date(2024, 6, 14)),
        ("0 0 1W 6 *", date(2024, 1, 1), date(2024, 6, 3)),  # Saturday the 1st: Monday the 3rd
        ("0 0 1W 9 *", date(2024, 1, 1), date(2024, 9, 2)),  # Sunday the 1st: Monday the 2nd
        ("0 0 30W 6 *", date(2024, 1, 1), date(2024, 6, 28)),  # Sunday the last: Friday
        ("0 0 31W 4,5 *", date(2024, 1, 1), date(2024, 5, 31)),  # no 31 April: no run in April
        ("0 0 LW 3 *", date(2024, 1, 1), date(2024, 3, 29)),  # Sunday the 31st: Friday the 29th
        ("0 0 L 2 *", date(2023, 3, 1), date(2024, 2, 29)),
        ("0 0 * * 5L", date(2024, 5, 1), date(2024, 5, 31)),  # the last Friday
        ("0 0 * * FRIL", date(2024, 6, 1), date(2024, 6, 28)),
        ("0 0 * * 1#3", date(2024, 1, 1), date(2024, 1, 15)),  # the third Monday
        ("0 0 * * MON#5", date(2024, 2, 1), date(2024, 4, 29)),  # the next month with a fifth Monday
        ("0 0 * * 7#1", date(2024, 9, 2), date(2024, 10, 6)),  # 7 is Sunday
        ("0 0 13 * 5L", date(2024, 1, 1), date(2024, 1, 13)),  # both restricted: either matches
        ("0 0 */2 * 1#2", date(2024, 1, 1), date(2024, 3, 11)),  # '*/2': odd days AND second Mondays
    ],
)
def test_hand_checked(expr: str, first: date, expected: date) -> None:
    found = parse_cron(expr).next_wall_match(datetime.combine(first, datetime.min.time()), inclusive=True)
    assert found == datetime.combine(expected, datetime.min.time())


def test_last_sunday_is_berlins_transition_day() -> None:
    """Europe changes its clocks on the last Sunday of March: ``30 2 * 3 0L`` names a wall time
    that never exists, so ``shift`` runs it at the transition each year and ``skip`` never runs
    it, which the schedule check refuses with the reason."""
    shift = CronSchedule(cron="30 2 * 3 0L", timezone="Europe/Berlin")
    assert next_occurrence(shift, datetime(2024, 3, 1, tzinfo=UTC)) == datetime(2024, 3, 31, 1, 0, tzinfo=UTC)
    assert next_occurrence(shift, datetime(2024, 4, 1, tzinfo=UTC)) == datetime(2025, 3, 30, 1, 0, tzinfo=UTC)
    skip = CronSchedule(cron="30 2 * 3 0L", timezone="Europe/Berlin", dst_gap=DstGap.SKIP)
    assert next_occurrence(skip, datetime(2024, 3, 1, tzinfo=UTC)) is None
    with pytest.raises(InvalidRequest) as caught:
        check_cron_schedule(skip, datetime(2024, 3, 1, tzinfo=UTC))
    assert caught.value.code == "cron_never_fires"
    assert "DST gap" in caught.value.message and "dst_gap 'shift'" in caught.value.message


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        ("0 0 30W 2 *", "day-of-month 30W does not exist in Feb"),
        (
            "0 0 */20 * 1#2",
            "no day in Jan,Feb,Mar,Apr,May,Jun,Jul,Aug,Sep,Oct,Nov,Dec is both day-of-month */20",
        ),
    ],
)
def test_never_fires_says_why(expr: str, reason: str) -> None:
    found = parse_cron(expr).never_fires_reason()
    assert found is not None and reason in found, found
    with pytest.raises(InvalidRequest) as caught:
        check_cron_schedule(CronSchedule(cron=expr), datetime(2024, 1, 1, tzinfo=UTC))
    assert caught.value.code == "cron_never_fires"


def test_a_day_beyond_the_search_horizon_is_refused() -> None:
    """A fifth Monday of February needs 29 February on a Monday: 2016, 2044, 2072, then 2112 (2100
    is no leap year). From 2073 that is beyond the 30-year search, so the schedule is refused."""
    schedule = CronSchedule(cron="0 0 * 2 1#5")
    check_cron_schedule(schedule, datetime(2026, 1, 1, tzinfo=UTC))  # 2044 is within reach
    with pytest.raises(InvalidRequest) as caught:
        check_cron_schedule(schedule, datetime(2073, 1, 1, tzinfo=UTC))
    assert caught.value.code == "cron_never_fires" and "within 30 years" in caught.value.message
