"""The cron dialect: what parses to what, what is refused and why, and the wall-clock search."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime.core.cron import CronExpr, cron_notes, parse_cron
from duetime.core.errors import InvalidRequest
from duetime.core.model import CronSchedule, DstGap
from duetime.core.schedule import check_cron_schedule, load_zone

ALL_MINUTES = frozenset(range(60))
ALL_HOURS = frozenset(range(24))
ALL_DAYS = frozenset(range(1, 32))
ALL_MONTHS = frozenset(range(1, 13))
ALL_WEEKDAYS = frozenset(range(7))


def chain(expr: CronExpr, start: datetime, count: int) -> list[datetime]:
    found: list[datetime] = []
    cursor = start
    for _ in range(count):
        nxt = expr.next_wall_match(cursor, inclusive=False)
        assert nxt is not None
        found.append(nxt)
        cursor = nxt
    return found


# -- parsing: what valid expressions mean -------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "field", "expected"),
    [
        pytest.param("* * * * *", "minutes", ALL_MINUTES, id="star-minute"),
        pytest.param("*/15 * * * *", "minutes", {0, 15, 30, 45}, id="star-step"),
        pytest.param("5-20/5 * * * *", "minutes", {5, 10, 15, 20}, id="range-step"),
        pytest.param("50/3 * * * *", "minutes", {50, 53, 56, 59}, id="start-step-to-max"),
        pytest.param("1,2,3-5,59 * * * *", "minutes", {1, 2, 3, 4, 5, 59}, id="list-with-range"),
        pytest.param("0 9-17 * * *", "hours", set(range(9, 18)), id="hour-range"),
        pytest.param("0 0 1,15 * *", "days_of_month", {1, 15}, id="dom-list"),
        pytest.param("0 0 * JAN,jul,Dec *", "months", {1, 7, 12}, id="month-names-any-case"),
        pytest.param("0 0 * mar-MAY *", "months", {3, 4, 5}, id="month-name-range"),
        pytest.param("0 0 * */6 *", "months", {1, 7}, id="month-star-step"),
        pytest.param("0 0 * * MON-FRI", "days_of_week", {1, 2, 3, 4, 5}, id="weekday-name-range"),
        pytest.param("0 0 * * sun,sat", "days_of_week", {0, 6}, id="weekday-names-lower"),
        pytest.param("0 0 * * 7", "days_of_week", {0}, id="seven-is-sunday"),
        pytest.param("0 0 * * 5-7", "days_of_week", {5, 6, 0}, id="range-to-seven"),
        pytest.param("0 0 * * 0-7", "days_of_week", ALL_WEEKDAYS, id="zero-to-seven"),
        pytest.param("0 0 * * */2", "days_of_week", {0, 2, 4, 6}, id="weekday-star-step"),
        pytest.param("0 0 * * MON/2", "days_of_week", {1, 3, 5}, id="weekday-name-start-step"),
        pytest.param("*/10 0 0 * * *", "seconds", {0, 10, 20, 30, 40, 50}, id="six-field-seconds"),
        pytest.param("0 0 * * *", "seconds", {0}, id="five-field-second-zero"),
        pytest.param("007 * * * *", "minutes", {7}, id="leading-zeros"),
        pytest.param("5-5 * * * *", "minutes", {5}, id="one-value-range"),
        # Vixie cron accepts a step larger than its range: only the range's first value is left
        pytest.param("0 0 1 9-12/5 *", "months", {9}, id="step-past-month-range"),
        pytest.param("0 19-23/5 * * *", "hours", {19}, id="step-past-hour-range"),
        pytest.param("56-59/4 * * * *", "minutes", {56}, id="step-past-minute-range"),
        pytest.param("*/60 * * * *", "minutes", {0}, id="star-step-60"),
        pytest.param("0-10/11 * * * *", "minutes", {0}, id="range-step-11"),
        pytest.param("59/5 * * * *", "minutes", {59}, id="start-step-past-end"),
        pytest.param("0 0 * * 5-7/3", "days_of_week", {5}, id="weekday-step-past-range"),
        pytest.param("0 0 * * 6-7", "days_of_week", {6, 0}, id="weekday-range-to-seven"),
        pytest.param("0 0 * * 7/3", "days_of_week", {0}, id="seven-step-is-sunday"),
        pytest.param("0 0 * * 1,7", "days_of_week", {1, 0}, id="list-with-seven"),
        pytest.param("0 0 * * 0-7/7", "days_of_week", {0}, id="zero-to-seven-step-seven"),
        pytest.param("*/90 * * * * *", "seconds", {0}, id="second-step-90"),
    ],
)
def test_valid_fields(expr: str, field: str, expected: set[int]) -> None:
    assert getattr(parse_cron(expr), field) == frozenset(expected)


@pytest.mark.parametrize(
    ("macro", "equivalent"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@Daily", "0 0 * * *"),
        ("@HOURLY", "0 * * * *"),
    ],
)
def test_macros_expand(macro: str, equivalent: str) -> None:
    ours, theirs = parse_cron(macro), parse_cron(equivalent)
    start = datetime(2023, 12, 30, 17, 3)
    assert chain(ours, start, 4) == chain(theirs, start, 4)
    assert ours.source == macro
    assert not ours.has_seconds


def test_six_fields_fire_on_seconds() -> None:
    expr = parse_cron("*/20 30 9 * * *")
    assert expr.has_seconds
    assert chain(expr, datetime(2024, 5, 1, 9, 30, 5), 4) == [
        datetime(2024, 5, 1, 9, 30, 20),
        datetime(2024, 5, 1, 9, 30, 40),
        datetime(2024, 5, 2, 9, 30, 0),
        datetime(2024, 5, 2, 9, 30, 20),
    ]


# -- parsing: what is refused ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        pytest.param("", "empty", id="empty"),
        pytest.param("* * * *", "got 4", id="four-fields"),
        pytest.param("* * * * * * *", "got 7", id="seven-fields-year"),
        pytest.param("60 * * * *", "minute field: 60 is out of range 0-59", id="minute-60"),
        pytest.param("61 * * * *", "minute field: 61 is out of range 0-59", id="minute-61"),
        pytest.param("0 24 * * *", "hour field: 24 is out of range 0-23", id="hour-24"),
        pytest.param("0 0 0 * *", "day-of-month field: 0 is out of range 1-31", id="dom-0"),
        pytest.param("0 0 32 * *", "day-of-month field: 32 is out of range 1-31", id="dom-32"),
        pytest.param("0 0 * 13 *", "month field: 13 is out of range 1-12", id="month-13"),
        pytest.param("0 0 * 0 *", "month field: 0 is out of range 1-12", id="month-0"),
        pytest.param("0 0 * * 8", "day-of-week field: 8 is out of range 0-7", id="dow-8"),
        pytest.param("60 * * * * *", "second field: 60 is out of range 0-59", id="second-60"),
        pytest.param("5-1 * * * *", "reversed", id="reversed-range"),
        pytest.param("0 0 * * FRI-MON", "reversed", id="reversed-name-range"),
        pytest.param("*/0 * * * *", "step 0", id="step-zero"),
        pytest.param("*/ * * * *", "step '' ", id="empty-step"),
        pytest.param("*/-1 * * * *", "not a positive number", id="negative-step"),
        pytest.param("1,,2 * * * *", "empty item", id="empty-item"),
        pytest.param("1, * * * *", "empty item", id="trailing-comma"),
        pytest.param("1- * * * *", "empty range bound", id="open-range"),
        pytest.param("1-2-3 * * * *", "not a number", id="double-range"),
        pytest.param("0 0 * FOO *", "unknown name 'FOO'", id="unknown-month-name"),
        pytest.param("0 0 * * MONDAY", "unknown name 'MONDAY'", id="unknown-weekday-name"),
        pytest.param("0 0 * * JAN", "unknown name 'JAN'", id="month-name-in-weekday"),
        pytest.param("MON 0 * * *", "not a number", id="name-in-minute"),
        pytest.param(
            "0 L * * *", "hour field: 'L' (last) in 'L' is only allowed in the day-of-month", id="L-hour"
        ),
        pytest.param("L * * * *", "minute field: 'L' (last)", id="L-minute"),
        pytest.param("0 0 * L *", "month field: 'L' (last)", id="L-month"),
        pytest.param("0 0 * 5W *", "month field: 'W' (nearest weekday)", id="W-month"),
        pytest.param("0 # * * *", "hour field: '#' (nth weekday)", id="hash-hour"),
        pytest.param("0 0 1#3 * *", "belongs in the day-of-week field", id="hash-dom"),
        pytest.param("0 0 1-15W * *", "takes a single day, as in 15W", id="W-range"),
        pytest.param("0 0 15W/2 * *", "takes a single day", id="W-step"),
        pytest.param("0 0 *W * *", "takes a single day", id="W-star"),
        pytest.param("0 0 W * *", "takes a single day", id="W-alone"),
        pytest.param("0 0 0W * *", "0 in '0W' is out of range 1-31", id="W-zero"),
        pytest.param("0 0 32W * *", "32 in '32W' is out of range 1-31", id="W-32"),
        pytest.param("0 0 L-3 * *", "write L for the last day", id="L-minus"),
        pytest.param("0 0 L/2 * *", "'L' (last day) in 'L/2' stands alone", id="L-step"),
        pytest.param("0 0 5L * *", "belongs in the day-of-week field, as in 5L", id="nL-dom"),
        pytest.param("0 0 * * 1#6", "'#6' in '1#6' is out of range: a month has at most five", id="hash-6"),
        pytest.param("0 0 * * 1#0", "'#0' in '1#0' is out of range", id="hash-0"),
        pytest.param("0 0 * * #3", "needs a weekday before '#'", id="hash-no-weekday"),
        pytest.param("0 0 * * 1#", "needs a number 1-5 after '#'", id="hash-no-count"),
        pytest.param("0 0 * * 1-5#2", "takes one weekday and one number", id="hash-range"),
        pytest.param("0 0 * * 1#2#3", "takes one weekday and one number", id="hash-twice"),
        pytest.param("0 0 * * 8#2", "day-of-week field: 8 is out of range 0-7", id="hash-weekday-8"),
        pytest.param("0 0 * * FOO#2", "unknown name 'FOO'", id="hash-unknown-name"),
        pytest.param("0 0 * * L", "'L' alone is ambiguous", id="L-dow-alone"),
        pytest.param("0 0 * * 1-5L", "'L' (last) in '1-5L' takes one weekday", id="L-dow-range"),
        pytest.param("0 0 * * *L", "takes one weekday", id="L-dow-star"),
        pytest.param("0 0 * * 5L/2", "takes one weekday", id="L-dow-step"),
        pytest.param("0 0 * * L5", "write the weekday before 'L', as in 5L", id="L-dow-reversed"),
        pytest.param("0 0 * * 8L", "8 is out of range 0-7", id="L-dow-8"),
        pytest.param("0 0 * * 15W", "belongs in the day-of-month field", id="W-dow"),
        pytest.param("0 0 * * LW", "belongs in the day-of-month field", id="LW-dow"),
        pytest.param("0 0 * * JUL", "unknown name 'JUL'", id="month-name-ending-L-in-weekday"),
        pytest.param(
            "0 0 ? * 1", "'?' (Quartz's 'no specific value') is not accepted: write '*'", id="question-mark"
        ),
        pytest.param("@reboot", "@reboot is not a schedule", id="reboot"),
        pytest.param("@every 5m", "two spaces|unknown macro", id="every"),
        pytest.param("@fortnightly", "unknown macro", id="unknown-macro"),
        pytest.param("0 0 * * * @", "'@'", id="at-sign-inside"),
        pytest.param(" 0 0 * * *", "leading or trailing", id="leading-space"),
        pytest.param("0 0 * * * ", "leading or trailing", id="trailing-space"),
        pytest.param("0  0 * * *", "two spaces", id="double-space"),
        pytest.param("0\t0 * * * *", "whitespace", id="tab"),
        pytest.param("0 0 * * *\n", "whitespace", id="newline"),
        pytest.param("0\u00a00 * * *", "not allowed|whitespace", id="nbsp"),
        pytest.param("0 0\x00 * * *", "not allowed", id="nul"),
        pytest.param("\u0663 * * * *", "not an ASCII digit", id="arabic-indic-digit"),
        pytest.param("\uff11 * * * *", "not an ASCII digit", id="fullwidth-digit"),
        pytest.param("0 0 * * 1;2", "not allowed", id="semicolon"),
        pytest.param("0 " * 200 + "0", "longer than", id="too-long"),
    ],
)
def test_invalid_expressions(expr: str, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_cron(expr)
    assert caught.value.code == "invalid_cron"
    assert caught.value.field == "schedule.cron"
    assert any(part in caught.value.message for part in fragment.split("|")), caught.value.message


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("0 0 1 9-12/5 *", "month field: step 5 in '9-12/5' is larger than its range, so it selects only 9"),
        ("56-59/4 * * * *", "minute field: step 4 in '56-59/4'"),
        ("0 0 * * 5-7/3", "selects only 5"),
        ("0 0 * * 7/2", "selects only Sunday"),
    ],
)
def test_steps_past_their_range_are_noted(expr: str, fragment: str) -> None:
    notes = cron_notes(expr)
    assert len(notes) == 1 and fragment in notes[0], notes


@pytest.mark.parametrize("expr", ["*/15 * * * *", "0 9 * * MON-FRI", "@daily", "5-20/5 * * * *", "0 0 * * 7"])
def test_ordinary_steps_are_not_noted(expr: str) -> None:
    assert cron_notes(expr) == []


def test_step_past_range_fires_on_its_first_value() -> None:
    assert chain(parse_cron("0 19-23/5 * 9-12/5 *"), datetime(2024, 1, 1), 3) == [
        datetime(2024, 9, 1, 19),
        datetime(2024, 9, 2, 19),
        datetime(2024, 9, 3, 19),
    ]


def test_seven_is_sunday_when_searching() -> None:
    got = chain(parse_cron("0 12 * * 7"), datetime(2024, 6, 1), 3)
    assert got == [datetime(2024, 6, 2, 12), datetime(2024, 6, 9, 12), datetime(2024, 6, 16, 12)]
    assert all(d.isoweekday() == 7 for d in got)


def test_not_a_string_is_refused() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_cron(5)  # type: ignore[arg-type]
    assert caught.value.code == "invalid_cron"


# -- the Vixie day rule ---------------------------------------------------------------------------


def test_both_days_restricted_means_either() -> None:
    # the 13th of any month OR any Friday
    got = chain(parse_cron("0 0 13 * 5"), datetime(2024, 9, 1), 6)
    assert got == [
        datetime(2024, 9, 6),  # Friday
        datetime(2024, 9, 13),  # Friday the 13th, once
        datetime(2024, 9, 20),
        datetime(2024, 9, 27),
        datetime(2024, 10, 4),
        datetime(2024, 10, 11),
    ]
    got = chain(parse_cron("0 0 13 * 5"), datetime(2024, 10, 11), 2)
    assert got == [datetime(2024, 10, 13), datetime(2024, 10, 18)]  # Sunday the 13th counts too


def test_star_step_day_of_month_is_a_star_so_days_and() -> None:
    # '*/2' starts with '*': Vixie ANDs, so odd days that are also Mondays
    got = chain(parse_cron("0 0 */2 * MON"), datetime(2024, 1, 1), 4)
    assert got == [datetime(2024, 1, 15), datetime(2024, 1, 29), datetime(2024, 2, 5), datetime(2024, 2, 19)]
    assert all(d.day % 2 == 1 and d.weekday() == 0 for d in got)


def test_star_step_day_of_week_is_a_star_so_days_and() -> None:
    got = chain(parse_cron("0 0 1-7 * */6"), datetime(2024, 1, 1), 4)  # first week, Sunday or Saturday
    assert got == [datetime(2024, 1, 6), datetime(2024, 1, 7), datetime(2024, 2, 3), datetime(2024, 2, 4)]


def test_plain_star_day_of_week_leaves_day_of_month_alone() -> None:
    assert chain(parse_cron("0 0 31 * *"), datetime(2024, 1, 31), 3) == [
        datetime(2024, 3, 31),
        datetime(2024, 5, 31),
        datetime(2024, 7, 31),
    ]


# -- never firing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    ["0 0 30 2 *", "0 0 31 2 *", "0 0 31 4 *", "0 0 31 4,6,9,11 *", "0 0 30,31 FEB *", "0 0 30 2 */2"],
)
def test_never_fires(expr: str) -> None:
    parsed = parse_cron(expr)
    assert parsed.never_fires_reason() is not None
    assert parsed.next_wall_match(datetime(2024, 1, 1), inclusive=True) is None


@pytest.mark.parametrize("expr", ["0 0 29 2 *", "0 0 30 2 MON", "0 0 31 * *", "0 0 31 4,5 *", "0 0 * 2 *"])
def test_can_fire(expr: str) -> None:
    parsed = parse_cron(expr)
    assert parsed.never_fires_reason() is None
    assert parsed.next_wall_match(datetime(2024, 1, 1), inclusive=True) is not None


def test_leap_day_is_found_years_ahead() -> None:
    expr = parse_cron("0 12 29 2 *")
    assert chain(expr, datetime(2096, 3, 1), 2) == [datetime(2104, 2, 29, 12), datetime(2108, 2, 29, 12)]


# -- the search itself ----------------------------------------------------------------------------------


def test_inclusive_and_exclusive() -> None:
    expr = parse_cron("30 9 * * *")
    at = datetime(2024, 3, 5, 9, 30)
    assert expr.next_wall_match(at, inclusive=True) == at
    assert expr.next_wall_match(at, inclusive=False) == datetime(2024, 3, 6, 9, 30)
    # a fraction of a second past the match means the match is already behind
    assert expr.next_wall_match(at + timedelta(microseconds=1), inclusive=True) == datetime(2024, 3, 6, 9, 30)


def test_carries_across_year_end() -> None:
    expr = parse_cron("59 23 31 12 *")
    assert expr.next_wall_match(datetime(2024, 12, 31, 23, 59, 1), False) == datetime(2025, 12, 31, 23, 59)


def test_aware_input_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="naive"):
        parse_cron("* * * * *").next_wall_match(datetime(2024, 1, 1, tzinfo=UTC), inclusive=False)


def test_search_stops_at_the_last_representable_year() -> None:
    assert parse_cron("0 0 1 1 *").next_wall_match(datetime(9999, 6, 1), inclusive=False) is None


def brute_next(expr: CronExpr, after: datetime) -> datetime:
    cursor = after.replace(second=0) + timedelta(minutes=1)
    for _ in range(60 * 24 * 800):
        if expr.matches(cursor):
            return cursor
        cursor += timedelta(minutes=1)
    raise AssertionError("no match within 800 days")


@pytest.mark.parametrize(
    "expr",
    ["*/7 3-5 * * *", "0 0 1,15 * 1", "59 23 * * SUN", "0 */5 */3 * *", "30 2 29 * *", "1-3 4 5 6 0"],
)
def test_search_agrees_with_minute_walk(expr: str) -> None:
    parsed = parse_cron(expr)
    cursor = datetime(2023, 12, 30, 22, 17)
    for _ in range(10):
        expected = brute_next(parsed, cursor)
        assert parsed.next_wall_match(cursor, inclusive=False) == expected
        cursor = expected


# -- agreement with croniter on plain expressions -------------------------------------------------------


def field_strategy(low: int, high: int) -> st.SearchStrategy[str]:
    values = st.integers(low, high)
    # strictly increasing bounds: croniter expands a one-value range such as '3-3' to '*'
    pairs = st.tuples(values, values).filter(lambda p: p[0] != p[1]).map(sorted)

    def stepped_star(step: int) -> str:
        return f"*/{step}"

    # steps run past the range on purpose (``9-12/5``): Vixie cron reads them as the first value
    item = st.one_of(
        values.map(str),
        pairs.map(lambda p: f"{p[0]}-{p[1]}"),
        pairs.flatmap(lambda p: st.integers(1, p[1] - p[0] + 8).map(lambda s: f"{p[0]}-{p[1]}/{s}")),
    )
    listed = st.lists(item, min_size=1, max_size=3).map(",".join)
    return st.one_of(st.just("*"), st.integers(1, high - low + 8).map(stepped_star), listed)


expressions = st.tuples(
    field_strategy(0, 59),
    field_strategy(0, 23),
    field_strategy(1, 31),
    field_strategy(1, 12),
    field_strategy(0, 7),  # 7 is Sunday, as 0
)


def croniter_disagrees_by_design(dom: str, dow: str) -> bool:
    """croniter ORs the day fields whenever neither is exactly '*', so '*/2' with 'MON' means
    "odd days or Mondays" there; Vixie cron (and we) AND them because '*/2' starts with '*'."""
    star_form = (dom.startswith("*") and dom != "*") or (dow.startswith("*") and dow != "*")
    return star_form and dom != "*" and dow != "*"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fields=expressions,
    start=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2035, 12, 31)),
)
def test_agrees_with_croniter_in_utc(fields: tuple[str, str, str, str, str], start: datetime) -> None:
    expr_text = " ".join(fields)
    ours = parse_cron(expr_text)
    if ours.never_fires_reason() is not None or croniter_disagrees_by_design(fields[2], fields[4]):
        return
    start = start.replace(microsecond=0)
    theirs = croniter(expr_text, start)
    expected = [theirs.get_next(datetime) for _ in range(5)]
    assert chain(ours, start, 5) == expected


# -- schedule validation: zones and whole cron schedules ------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["Europe/Berlin", "UTC", "Etc/UTC", "Etc/GMT+5", "America/Argentina/Buenos_Aires", "US/Eastern"],
)
def test_zone_accepted(name: str) -> None:
    zone = load_zone(name)
    assert zone.key == name
    assert load_zone(name) is zone


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        pytest.param("Mars/Olympus", "not a known IANA zone id", id="unknown"),
        pytest.param("+05:30", "is a UTC offset", id="offset"),
        pytest.param("-0800", "is a UTC offset", id="offset-compact"),
        pytest.param("UTC+1", "is a UTC offset", id="utc-plus"),
        pytest.param("GMT-03:00", "is a UTC offset", id="gmt-minus"),
        pytest.param("EST", "legacy", id="EST"),
        pytest.param("MST", "legacy", id="MST"),
        pytest.param("EST5EDT", "legacy", id="EST5EDT"),
        pytest.param("CET", "legacy", id="CET"),
        pytest.param("GMT", "legacy", id="GMT"),
        pytest.param("Zulu", "legacy", id="Zulu"),
        pytest.param("", "must be an IANA zone id", id="empty"),
        pytest.param("../etc/passwd", "not an IANA zone id", id="dot-dot"),
        pytest.param("/etc/localtime", "not an IANA zone id", id="absolute-path"),
        pytest.param("Europe/../Europe/Berlin", "not an IANA zone id", id="dot-dot-inside"),
        pytest.param("posix/Europe/Berlin", "not a known", id="posix-dir"),
        pytest.param("right/Europe/Berlin", "not a known", id="right-dir"),
        pytest.param("Europe/Berlin\x00", "not an IANA zone id", id="nul"),
        pytest.param("Europe/Berlin ", "not an IANA zone id", id="trailing-space"),
        pytest.param("europe/berlin", "did you mean 'Europe/Berlin'", id="wrong-case"),
        pytest.param("A/" + "b" * 80, "not an IANA zone id", id="too-long"),
    ],
)
def test_zone_refused(name: str, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        load_zone(name)
    assert caught.value.code == "invalid_timezone"
    assert caught.value.field == "schedule.timezone"
    assert fragment in caught.value.message


NOW = datetime(2024, 2, 1, 12, tzinfo=UTC)


def refusal(schedule: CronSchedule) -> tuple[str, str | None]:
    with pytest.raises(InvalidRequest) as caught:
        check_cron_schedule(schedule, NOW)
    return caught.value.code, caught.value.field


def test_valid_schedule_passes() -> None:
    check_cron_schedule(
        CronSchedule(
            cron="0 9 * * MON-FRI",
            timezone="Europe/Berlin",
            start_at=NOW,
            end_at=NOW + timedelta(days=30),
        ),
        NOW,
    )


def test_schedule_refusals() -> None:
    assert refusal(CronSchedule(cron="61 * * * *")) == ("invalid_cron", "schedule.cron")
    assert refusal(CronSchedule(cron="* * * * *", timezone="EST")) == (
        "invalid_timezone",
        "schedule.timezone",
    )
    assert refusal(
        CronSchedule(cron="* * * * *", start_at=NOW + timedelta(hours=1), end_at=NOW + timedelta(hours=1))
    ) == ("invalid_schedule", "schedule.end_at")
    assert refusal(CronSchedule(cron="0 0 30 2 *")) == ("cron_never_fires", "schedule.cron")
    assert refusal(CronSchedule(cron="0 0 31 4 *", timezone="Asia/Kolkata")) == (
        "cron_never_fires",
        "schedule.cron",
    )


def test_no_occurrence_before_end_at() -> None:
    yearly = CronSchedule(cron="0 0 1 1 *", end_at=NOW + timedelta(days=30))
    assert refusal(yearly) == ("cron_never_fires", "schedule.end_at")
    already_over = CronSchedule(cron="* * * * *", end_at=NOW - timedelta(days=1))
    assert refusal(already_over) == ("cron_never_fires", "schedule.end_at")
    between_runs = CronSchedule(
        cron="0 12 * * *",
        start_at=datetime(2024, 6, 1, 13, tzinfo=UTC),
        end_at=datetime(2024, 6, 2, 11, tzinfo=UTC),
    )
    assert refusal(between_runs) == ("cron_never_fires", "schedule.end_at")
    on_the_bound = CronSchedule(
        cron="0 12 * * *",
        start_at=datetime(2024, 6, 1, 13, tzinfo=UTC),
        end_at=datetime(2024, 6, 2, 12, tzinfo=UTC),
    )
    check_cron_schedule(on_the_bound, NOW)


def test_the_only_candidate_in_a_gap_depends_on_the_rule() -> None:
    """Berlin's 02:30 does not exist on 2024-03-31: shifted it runs, skipped there is nothing."""
    start, end = datetime(2024, 3, 31, 0, tzinfo=UTC), datetime(2024, 3, 31, 23, tzinfo=UTC)
    shifted = CronSchedule(cron="30 2 * * *", timezone="Europe/Berlin", start_at=start, end_at=end)
    check_cron_schedule(shifted, NOW)
    skipped = CronSchedule(
        cron="30 2 * * *", timezone="Europe/Berlin", dst_gap=DstGap.SKIP, start_at=start, end_at=end
    )
    assert refusal(skipped) == ("cron_never_fires", "schedule.end_at")
