"""Interval schedules (``every``) and exclusions: the duration grammar, the validation, the
arithmetic across DST (elapsed time, never the wall clock), and a brute-force reference."""

from __future__ import annotations

import itertools
import zoneinfo
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime.core.codec import schedule_from_json, schedule_to_json
from duetime.core.errors import InvalidRequest, MalformedRequest
from duetime.core.interval import parse_every
from duetime.core.model import DateRange, IntervalSchedule
from duetime.core.schedule import (
    count_between,
    describe_instant,
    first_occurrence,
    latest_at_or_before,
    next_occurrence,
    occurrences,
)
from duetime.core.validation import parse_job_spec

NOW = datetime(2026, 3, 28, 12, 0, 0, 654321, tzinfo=UTC)
TARGET = {"type": "queue", "broker": "redis", "topic": "t"}


def every(schedule: dict[str, Any], now: datetime = NOW) -> IntervalSchedule:
    parsed = parse_job_spec({"target": TARGET, "schedule": schedule}, now=now).schedule
    assert isinstance(parsed, IntervalSchedule)
    return parsed


def refusal(schedule: dict[str, Any]) -> tuple[str, str | None, str]:
    with pytest.raises((InvalidRequest, MalformedRequest)) as caught:
        parse_job_spec({"target": TARGET, "schedule": schedule}, now=NOW)
    return caught.value.code, caught.value.field, caught.value.message


# -- the grammar ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90m", 5400),
        ("1h30m", 5400),
        ("7d", 7 * 86400),
        ("1s", 1),
        ("366d", 366 * 86400),
        ("1d2h3m4s", 86400 + 7200 + 180 + 4),
        ("0h1s", 1),
        ("3600s", 3600),
        ("001m", 60),
    ],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_every(text) == seconds


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "not a duration"),
        ("90", "not a duration"),
        ("1m1h", "not a duration"),  # out of order
        ("1h1h", "not a duration"),  # twice
        ("1h 30m", "not a duration"),
        ("1.5h", "not a duration"),
        ("-1m", "not a duration"),
        ("1w", "not a duration"),
        ("1H", "not a duration"),
        ("m", "not a duration"),
        ("0s", "is 0 s"),
        ("0d0h", "is 0 s"),
        ("366d1s", "366 days"),
        ("367d", "366 days"),
        ("PT1H", "not a duration"),
    ],
)
def test_bad_durations(text: str, fragment: str) -> None:
    code, field, message = refusal({"every": text})
    assert (code, field) == ("invalid_every", "schedule.every")
    assert fragment in message


def test_not_a_string() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_every(90)
    assert caught.value.code == "invalid_every"


# -- validation -------------------------------------------------------------------------------------


def test_defaults() -> None:
    schedule = every({"every": "90m"})
    assert schedule.start_at == NOW.replace(microsecond=0)  # the creation time, to the second
    assert schedule.every_s == 5400 and schedule.end_at is None
    assert schedule.timezone == "UTC" and schedule.exclude == ()
    assert first_occurrence(schedule, NOW) == schedule.start_at  # runs at once, then every 90m
    assert next_occurrence(schedule, schedule.start_at) == schedule.start_at + timedelta(minutes=90)
    assert schedule_from_json(schedule_to_json(schedule)) == schedule
    assert schedule_to_json(schedule) == {
        "every": "90m",
        "start_at": "2026-03-28T12:00:00Z",
        "end_at": None,
        "timezone": "UTC",
        "exclude": [],
    }


@pytest.mark.parametrize(
    ("schedule", "code", "field"),
    [
        ({"every": "1h", "dst_gap": "skip"}, "invalid_schedule", "schedule.dst_gap"),
        ({"every": "1h", "dst_overlap": "both"}, "invalid_schedule", "schedule.dst_overlap"),
        ({"every": "1h", "cron": "* * * * *"}, "invalid_schedule", "schedule"),
        ({"every": "1h", "run_at": "2026-01-01T00:00:00Z"}, "invalid_schedule", "schedule"),
        ({"every": "1h", "timezone": "CET"}, "invalid_timezone", "schedule.timezone"),
        ({"every": "1h", "start_at": "2026-04-01T00:00:00"}, "invalid_time", "schedule.start_at"),
        (
            {"every": "1h", "start_at": "2026-04-01T00:00:00Z", "end_at": "2026-04-01T00:00:00Z"},
            "invalid_schedule",
            "schedule.end_at",
        ),
        (
            {"every": "1d", "start_at": "2026-03-01T00:00:00Z", "end_at": "2026-03-02T00:00:00Z"},
            "invalid_schedule",
            "schedule.end_at",
        ),  # every occurrence is already past
        ({"every": "1h", "exclude": "2026-12-25"}, "wrong_type", "schedule.exclude"),
        ({"every": "1h", "exclude": [20261225]}, "wrong_type", "schedule.exclude[0]"),
        ({"every": "1h", "exclude": ["2026-02-30"]}, "invalid_exclude", "schedule.exclude[0]"),
        ({"every": "1h", "exclude": ["2026-2-3"]}, "invalid_exclude", "schedule.exclude[0]"),
        ({"every": "1h", "exclude": ["2026-12-25T00:00:00Z"]}, "invalid_exclude", "schedule.exclude[0]"),
        (
            {"every": "1h", "exclude": ["2026-12-24", {"from": "2026-12-31"}]},
            "invalid_exclude",
            "schedule.exclude[1].to",
        ),
        (
            {"every": "1h", "exclude": [{"from": "2026-12-31", "to": "2026-12-30"}]},
            "invalid_exclude",
            "schedule.exclude[0].to",
        ),
        (
            {"every": "1h", "exclude": [{"from": "2026-12-31", "to": "2027-01-01", "x": 1}]},
            "unknown_field",
            "schedule.exclude[0].x",
        ),
        ({"every": "1h", "exclude": ["2026-12-25"] * 1001}, "invalid_exclude", "schedule.exclude"),
        (
            {
                "every": "1h",
                "start_at": "2026-04-01T00:00:00Z",
                "end_at": "2026-04-01T05:00:00Z",
                "exclude": ["2026-04-01"],
            },
            "invalid_schedule",
            "schedule.exclude",
        ),
        (
            {"cron": "0 0 25 12 *", "exclude": [{"from": "2026-01-01", "to": "9999-12-31"}]},
            "cron_never_fires",
            "schedule.exclude",
        ),
    ],
)
def test_refusals(schedule: dict[str, Any], code: str, field: str) -> None:
    assert refusal(schedule)[:2] == (code, field)


def test_a_thousand_exclusions_are_accepted() -> None:
    days = [(date(2027, 1, 1) + timedelta(days=2 * i)).isoformat() for i in range(1000)]
    schedule = every({"every": "1d", "exclude": days})
    assert len(schedule.exclude) == 1000
    # every other day is excluded from 2027 on: the daily occurrences alternate
    start = datetime(2027, 1, 1, 12, tzinfo=UTC)
    got = occurrences(schedule, start, 4)
    assert [o.date() for o in got] == [date(2027, 1, 2), date(2027, 1, 4), date(2027, 1, 6), date(2027, 1, 8)]


# -- elapsed time across DST ---------------------------------------------------------------------------


def test_a_day_is_24_hours_across_spring_forward() -> None:
    """Berlin springs forward on 29 March 2026: a "1d" interval stays 24 h apart, so its wall
    time moves from 09:00 CET to 10:00 CEST (a cron '0 9 * * *' would stay at 09:00)."""
    schedule = every({"every": "1d", "start_at": "2026-03-28T08:00:00Z", "timezone": "Europe/Berlin"})
    got = occurrences(schedule, datetime(2026, 3, 28, 7, tzinfo=UTC), 3)
    assert [b - a for a, b in itertools.pairwise(got)] == [timedelta(days=1)] * 2
    assert [describe_instant(schedule, o)["local"] for o in got] == [
        "2026-03-28T09:00:00",
        "2026-03-29T10:00:00",
        "2026-03-30T10:00:00",
    ]


def test_an_hourly_interval_runs_every_hour_through_fall_back() -> None:
    """New York falls back on 1 Nov 2026: 01:00-01:59 happen twice, and an hourly interval runs
    in both (four runs between 00:30 and 02:30 local, as the clock shows 01:30 twice)."""
    schedule = every({"every": "1h", "start_at": "2026-11-01T04:30:00Z", "timezone": "America/New_York"})
    got = occurrences(schedule, datetime(2026, 11, 1, 4, tzinfo=UTC), 4)
    locals_ = [describe_instant(schedule, o)["local"] for o in got]
    assert locals_ == [
        "2026-11-01T00:30:00",
        "2026-11-01T01:30:00",
        "2026-11-01T01:30:00",
        "2026-11-01T02:30:00",
    ]


def test_fractional_start_is_kept() -> None:
    schedule = every({"every": "10s", "start_at": "2026-04-01T00:00:00.250Z"})
    assert next_occurrence(schedule, datetime(2026, 4, 1, 0, 0, 5, tzinfo=UTC)) == datetime(
        2026, 4, 1, 0, 0, 10, 250000, tzinfo=UTC
    )


def test_exclusions_are_read_on_the_zones_wall_clock() -> None:
    """Tokyo's 25 December is 15:00Z on the 24th to 15:00Z on the 25th."""
    tokyo = every(
        {
            "every": "6h",
            "start_at": "2026-12-24T00:00:00Z",
            "timezone": "Asia/Tokyo",
            "exclude": ["2026-12-25"],
        }
    )
    utc = every({"every": "6h", "start_at": "2026-12-24T00:00:00Z", "exclude": ["2026-12-25"]})
    after = datetime(2026, 12, 24, 1, tzinfo=UTC)

    def hours(schedule: IntervalSchedule) -> list[int]:
        return [
            (o - datetime(2026, 12, 24, tzinfo=UTC)) // timedelta(hours=1)
            for o in occurrences(schedule, after, 6)
        ]

    assert hours(tokyo) == [
        6,
        12,
        42,
        48,
        54,
        60,
    ]  # 18:00Z on the 24th .. 12:00Z on the 25th are the 25th in Tokyo
    assert hours(utc) == [6, 12, 18, 48, 54, 60]


def test_an_excluded_dst_day() -> None:
    """A cron on Berlin's 23-hour day, excluded; the days either side still run."""
    cron = parse_job_spec(
        {
            "target": TARGET,
            "schedule": {"cron": "30 * * * *", "timezone": "Europe/Berlin", "exclude": ["2026-03-29"]},
        },
        now=NOW,
    ).schedule
    last_before = latest_at_or_before(cron, datetime(2026, 3, 29, 21, tzinfo=UTC), NOW)
    assert last_before == datetime(2026, 3, 28, 22, 30, tzinfo=UTC)  # 23:30 CET on the 28th
    assert next_occurrence(cron, last_before) == datetime(2026, 3, 29, 22, 30, tzinfo=UTC)  # 00:30 CEST, 30th
    assert count_between(cron, NOW, datetime(2026, 3, 30, 0, tzinfo=UTC), 10_000) == 11 + 2


# -- brute-force reference ---------------------------------------------------------------------------

ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "Pacific/Chatham"]
DST_DAYS = [
    datetime(2026, 3, 29, tzinfo=UTC),
    datetime(2026, 10, 25, tzinfo=UTC),
    datetime(2026, 11, 1, tzinfo=UTC),
    datetime(2026, 4, 5, tzinfo=UTC),
    datetime(2026, 9, 27, tzinfo=UTC),
]


def reference(schedule: IntervalSchedule, low: datetime, high: datetime) -> list[datetime]:
    """Every occurrence in [low, high] by stepping k from 0: no division, no jumps."""
    zone = zoneinfo.ZoneInfo(schedule.timezone)
    step = timedelta(seconds=schedule.every_s)
    found = []
    instant = schedule.start_at
    while instant <= high and (schedule.end_at is None or instant <= schedule.end_at):
        local = instant.astimezone(zone).date()
        if instant >= low and not any(r.first <= local <= r.last for r in schedule.exclude):
            found.append(instant)
        instant += step
    return found


@st.composite
def interval_cases(draw: st.DrawFn) -> tuple[IntervalSchedule, datetime]:
    zone = draw(st.sampled_from(ZONES))
    base = draw(st.sampled_from(DST_DAYS)) + timedelta(minutes=draw(st.integers(-3 * 1440, 1440)))
    every_s = draw(st.sampled_from([1, 7, 60, 59 * 60, 3600, 5400, 4 * 3600 + 7, 86400, 86400 + 3600]))
    if every_s < 60:
        every_s = draw(st.integers(50, 900))  # keep the reference walk short
    start = base - timedelta(
        seconds=draw(st.integers(0, 2 * 86400)), microseconds=draw(st.sampled_from([0, 0, 1, 500_000]))
    )
    end = None
    if draw(st.booleans()):
        end = base + timedelta(seconds=draw(st.integers(1, 3 * 86400)))
        if end <= start:
            end = None
    local = base.astimezone(zoneinfo.ZoneInfo(zone)).date()
    exclude = tuple(
        DateRange(local + timedelta(days=d), local + timedelta(days=d + n))
        for d, n in draw(st.lists(st.tuples(st.integers(-2, 3), st.sampled_from([0, 0, 1])), max_size=3))
    )
    schedule = IntervalSchedule(
        every=f"{every_s}s", every_s=every_s, start_at=start, end_at=end, timezone=zone, exclude=exclude
    )
    after = base + timedelta(
        seconds=draw(st.integers(-86400, 86400)), microseconds=draw(st.sampled_from([0, 1, 999_999]))
    )
    return schedule, after


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=interval_cases(), probe_s=st.integers(0, 3 * 86400))
def test_interval_matches_brute_force_reference(
    case: tuple[IntervalSchedule, datetime], probe_s: int
) -> None:
    schedule, after = case
    horizon = after + timedelta(days=3)
    everything = reference(schedule, schedule.start_at, horizon)
    expected = [i for i in everything if i > after][:20]
    chain: list[datetime] = []
    cursor = after
    while len(chain) < 20:
        following = next_occurrence(schedule, cursor)
        if following is None or following > horizon:
            break
        chain.append(following)
        cursor = following
    assert chain == expected
    assert occurrences(schedule, after, 20)[: len(expected)] == expected
    at = min(after + timedelta(seconds=probe_s), horizon)
    window = [i for i in everything if after <= i <= at]
    assert latest_at_or_before(schedule, at, after) == (window[-1] if window else None)
    assert count_between(schedule, after, at, cap=10**9) == len([i for i in window if i > after])
    floor = after.replace(microsecond=0)
    first = next((i for i in everything if i >= floor), None)
    got = first_occurrence(schedule, after)
    assert (got if got is not None and got <= horizon else None) == first
