"""DST as a named table: every gap and overlap rule in four zones, with UTC instants written by hand.

2024 transitions used below (UTC instant, wall clock change):
- Europe/Berlin      03-31 01:00 (02:00 CET -> 03:00 CEST)   10-27 01:00 (03:00 CEST -> 02:00 CET)
- America/New_York   03-10 07:00 (02:00 EST -> 03:00 EDT)    11-03 06:00 (02:00 EDT -> 01:00 EST)
- Australia/Lord_Howe 10-05 15:30 (02:00 +10:30 -> 02:30 +11) 04-06 15:00 (02:00 +11 -> 01:30 +10:30)
- Pacific/Chatham    09-28 14:00 (02:45 +12:45 -> 03:45 +13:45) 04-06 14:00 (03:45 +13:45 -> 02:45 +12:45)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import duetime.core.cron
from duetime.core.model import CronSchedule, DstGap, DstOverlap, OneOffSchedule
from duetime.core.schedule import (
    count_between,
    describe_instant,
    first_occurrence,
    latest_at_or_before,
    load_zone,
    next_occurrence,
    occurrences,
)

SHIFT, SKIP = DstGap.SHIFT, DstGap.SKIP
FIRST, BOTH = DstOverlap.FIRST, DstOverlap.BOTH


def utc(text: str) -> datetime:
    """'2024-03-31 01:00' or '2024-03-31 01:00:30' read as UTC."""
    fmt = "%Y-%m-%d %H:%M:%S" if text.count(":") == 2 else "%Y-%m-%d %H:%M"
    return datetime.strptime(text, fmt).replace(tzinfo=UTC)


@dataclass(frozen=True)
class DstCase:
    zone: str
    cron: str
    gap: DstGap
    overlap: DstOverlap
    after: str
    expected: list[str]


def case(case_id: str, *fields: Any) -> Any:
    return pytest.param(DstCase(*fields), id=case_id)


DST_CASES = [
    # -- Europe/Berlin: spring gap 02:00-02:59 on 03-31 --------------------------------------------
    case("berlin-gap-shift", "Europe/Berlin", "30 2 * * *", SHIFT, FIRST, "2024-03-30 12:00",
         ["2024-03-31 01:00", "2024-04-01 00:30", "2024-04-02 00:30"]),
    case("berlin-gap-skip", "Europe/Berlin", "30 2 * * *", SKIP, FIRST, "2024-03-30 12:00",
         ["2024-04-01 00:30", "2024-04-02 00:30"]),
    case("berlin-gap-shift-collapses", "Europe/Berlin", "*/15 2 * * *", SHIFT, FIRST, "2024-03-30 23:00",
         ["2024-03-31 01:00", "2024-04-01 00:00", "2024-04-01 00:15"]),
    case("berlin-gap-shift-dedupes-with-03:00", "Europe/Berlin", "0,30 2,3 * * *", SHIFT, FIRST,
         "2024-03-30 23:00", ["2024-03-31 01:00", "2024-03-31 01:30", "2024-04-01 00:00"]),
    case("berlin-gap-skip-keeps-03:00", "Europe/Berlin", "0,30 2,3 * * *", SKIP, FIRST,
         "2024-03-30 23:00", ["2024-03-31 01:00", "2024-03-31 01:30", "2024-04-01 00:00"]),
    case("berlin-gap-after-is-transition", "Europe/Berlin", "*/30 2 * * *", SHIFT, FIRST,
         "2024-03-31 01:00", ["2024-04-01 00:00", "2024-04-01 00:30"]),
    # -- Europe/Berlin: autumn overlap 02:00-02:59 on 10-27 ----------------------------------------
    case("berlin-overlap-first", "Europe/Berlin", "30 2 * * *", SHIFT, FIRST, "2024-10-26 12:00",
         ["2024-10-27 00:30", "2024-10-28 01:30"]),
    case("berlin-overlap-both", "Europe/Berlin", "30 2 * * *", SHIFT, BOTH, "2024-10-26 12:00",
         ["2024-10-27 00:30", "2024-10-27 01:30", "2024-10-28 01:30"]),
    case("berlin-overlap-both-order", "Europe/Berlin", "0,45 2 * * *", SHIFT, BOTH, "2024-10-26 12:00",
         ["2024-10-27 00:00", "2024-10-27 00:45", "2024-10-27 01:00", "2024-10-27 01:45",
          "2024-10-28 01:00"]),
    case("berlin-overlap-first-last-minute", "Europe/Berlin", "59 2 * * *", SHIFT, FIRST, "2024-10-26 12:00",
         ["2024-10-27 00:59", "2024-10-28 01:59"]),
    case("berlin-overlap-both-last-minute", "Europe/Berlin", "59 2 * * *", SHIFT, BOTH, "2024-10-26 12:00",
         ["2024-10-27 00:59", "2024-10-27 01:59", "2024-10-28 01:59"]),
    case("berlin-after-in-first-pass-first", "Europe/Berlin", "*/30 * * * *", SHIFT, FIRST,
         "2024-10-27 00:40", ["2024-10-27 02:00", "2024-10-27 02:30"]),
    case("berlin-after-in-first-pass-both", "Europe/Berlin", "*/30 * * * *", SHIFT, BOTH,
         "2024-10-27 00:40", ["2024-10-27 01:00", "2024-10-27 01:30", "2024-10-27 02:00"]),
    case("berlin-after-in-second-pass-first", "Europe/Berlin", "*/30 * * * *", SHIFT, FIRST,
         "2024-10-27 01:10", ["2024-10-27 02:00", "2024-10-27 02:30"]),
    case("berlin-after-in-second-pass-both", "Europe/Berlin", "*/30 * * * *", SHIFT, BOTH,
         "2024-10-27 01:10", ["2024-10-27 01:30", "2024-10-27 02:00"]),
    # -- America/New_York ---------------------------------------------------------------------------
    case("new-york-gap-shift", "America/New_York", "30 2 * * *", SHIFT, FIRST, "2024-03-09 12:00",
         ["2024-03-10 07:00", "2024-03-11 06:30"]),
    case("new-york-gap-skip", "America/New_York", "30 2 * * *", SKIP, FIRST, "2024-03-09 12:00",
         ["2024-03-11 06:30", "2024-03-12 06:30"]),
    case("new-york-weekly-gap-shift", "America/New_York", "0 2 * * SUN", SHIFT, FIRST, "2024-03-03 12:00",
         ["2024-03-10 07:00", "2024-03-17 06:00"]),
    case("new-york-overlap-first", "America/New_York", "30 1 * * *", SHIFT, FIRST, "2024-11-02 12:00",
         ["2024-11-03 05:30", "2024-11-04 06:30"]),
    case("new-york-overlap-both", "America/New_York", "30 1 * * *", SHIFT, BOTH, "2024-11-02 12:00",
         ["2024-11-03 05:30", "2024-11-03 06:30", "2024-11-04 06:30"]),
    case("new-york-seconds-overlap-both", "America/New_York", "59 59 1 * * *", SHIFT, BOTH,
         "2024-11-03 05:00", ["2024-11-03 05:59:59", "2024-11-03 06:59:59", "2024-11-04 06:59:59"]),
    # -- Australia/Lord_Howe: 30-minute shifts ------------------------------------------------------
    case("lord-howe-gap-shift", "Australia/Lord_Howe", "15 2 * * *", SHIFT, FIRST, "2024-10-05 00:00",
         ["2024-10-05 15:30", "2024-10-06 15:15"]),
    case("lord-howe-gap-skip", "Australia/Lord_Howe", "15 2 * * *", SKIP, FIRST, "2024-10-05 00:00",
         ["2024-10-06 15:15", "2024-10-07 15:15"]),
    case("lord-howe-first-wall-after-gap", "Australia/Lord_Howe", "30 2 * * *", SKIP, FIRST,
         "2024-10-05 00:00", ["2024-10-05 15:30", "2024-10-06 15:30"]),
    case("lord-howe-overlap-first", "Australia/Lord_Howe", "45 1 * * *", SHIFT, FIRST, "2024-04-06 00:00",
         ["2024-04-06 14:45", "2024-04-07 15:15"]),
    case("lord-howe-overlap-both", "Australia/Lord_Howe", "45 1 * * *", SHIFT, BOTH, "2024-04-06 00:00",
         ["2024-04-06 14:45", "2024-04-06 15:15", "2024-04-07 15:15"]),
    case("lord-howe-before-overlap-both", "Australia/Lord_Howe", "15 1 * * *", SHIFT, BOTH,
         "2024-04-06 00:00", ["2024-04-06 14:15", "2024-04-07 14:45"]),
    # -- Pacific/Chatham: +12:45/+13:45, transitions at 02:45 local -----------------------------------
    case("chatham-gap-shift", "Pacific/Chatham", "0 3 * * *", SHIFT, FIRST, "2024-09-28 00:00",
         ["2024-09-28 14:00", "2024-09-29 13:15"]),
    case("chatham-gap-skip", "Pacific/Chatham", "0 3 * * *", SKIP, FIRST, "2024-09-28 00:00",
         ["2024-09-29 13:15", "2024-09-30 13:15"]),
    case("chatham-overlap-first", "Pacific/Chatham", "0 3 * * *", SHIFT, FIRST, "2024-04-06 00:00",
         ["2024-04-06 13:15", "2024-04-07 14:15"]),
    case("chatham-overlap-both", "Pacific/Chatham", "0 3 * * *", SHIFT, BOTH, "2024-04-06 00:00",
         ["2024-04-06 13:15", "2024-04-06 14:15", "2024-04-07 14:15"]),
    # -- no DST at all ------------------------------------------------------------------------------
    case("utc-control", "UTC", "30 2 * * *", SKIP, BOTH, "2024-03-31 00:00",
         ["2024-03-31 02:30", "2024-04-01 02:30"]),
    case("kolkata-half-hour-offset", "Asia/Kolkata", "0 9 * * MON-FRI", SHIFT, FIRST, "2024-03-29 00:00",
         ["2024-03-29 03:30", "2024-04-01 03:30"]),
]  # fmt: skip


@pytest.mark.parametrize("dst", DST_CASES)
def test_dst_table(dst: DstCase) -> None:
    schedule = CronSchedule(cron=dst.cron, timezone=dst.zone, dst_gap=dst.gap, dst_overlap=dst.overlap)
    want = [utc(text) for text in dst.expected]
    assert occurrences(schedule, utc(dst.after), len(want)) == want
    # one at a time from each previous scheduled instant gives the same chain
    cursor = utc(dst.after)
    for instant in want:
        cursor_next = next_occurrence(schedule, cursor)
        assert cursor_next == instant
        assert cursor_next is not None
        cursor = cursor_next


def test_shifted_run_reads_as_the_first_wall_time_after_the_gap() -> None:
    schedule = CronSchedule(cron="30 2 * * *", timezone="Europe/Berlin")
    shifted = next_occurrence(schedule, utc("2024-03-30 12:00"))
    assert shifted is not None
    info = describe_instant(schedule, shifted)
    assert info["local"] == "2024-03-31T03:00:00"
    assert info["utc_offset"] == "+02:00"
    assert info["shifted_from_gap"] is True
    normal = describe_instant(schedule, utc("2024-04-01 00:30"))
    assert normal["local"] == "2024-04-01T02:30:00"
    assert normal["shifted_from_gap"] is False


def test_second_pass_of_overlap_is_described() -> None:
    schedule = CronSchedule(cron="30 1 * * *", timezone="America/New_York", dst_overlap=BOTH)
    first, second = occurrences(schedule, utc("2024-11-02 12:00"), 2)
    assert describe_instant(schedule, first)["second_pass"] is False
    assert describe_instant(schedule, second)["second_pass"] is True
    assert describe_instant(schedule, second)["utc_offset"] == "-05:00"


# -- start_at / end_at --------------------------------------------------------------------------------


def test_start_at_excludes_earlier_occurrences() -> None:
    schedule = CronSchedule(cron="0 * * * *", start_at=utc("2024-05-01 10:30"))
    assert first_occurrence(schedule, utc("2024-05-01 09:00")) == utc("2024-05-01 11:00")
    assert next_occurrence(schedule, utc("2024-05-01 09:00")) == utc("2024-05-01 11:00")


def test_start_at_on_an_occurrence_includes_it() -> None:
    schedule = CronSchedule(cron="0 * * * *", start_at=utc("2024-05-01 11:00"))
    assert first_occurrence(schedule, utc("2024-05-01 09:00")) == utc("2024-05-01 11:00")


def test_start_at_on_the_shifted_instant() -> None:
    at_transition = CronSchedule(
        cron="*/15 2 * * *", timezone="Europe/Berlin", start_at=utc("2024-03-31 01:00")
    )
    assert first_occurrence(at_transition, utc("2024-03-30 00:00")) == utc("2024-03-31 01:00")
    a_second_later = CronSchedule(
        cron="*/15 2 * * *", timezone="Europe/Berlin", start_at=utc("2024-03-31 01:00:01")
    )
    assert first_occurrence(a_second_later, utc("2024-03-30 00:00")) == utc("2024-04-01 00:00")


def test_end_at_is_inclusive_and_final() -> None:
    schedule = CronSchedule(cron="0 12 * * *", end_at=utc("2024-05-03 12:00"))
    assert occurrences(schedule, utc("2024-05-01 00:00"), 10) == [
        utc("2024-05-01 12:00"),
        utc("2024-05-02 12:00"),
        utc("2024-05-03 12:00"),
    ]
    assert next_occurrence(schedule, utc("2024-05-03 12:00")) is None


def test_end_at_between_overlap_passes_cuts_the_second() -> None:
    schedule = CronSchedule(
        cron="30 1 * * *", timezone="America/New_York", dst_overlap=BOTH, end_at=utc("2024-11-03 06:00")
    )
    assert occurrences(schedule, utc("2024-11-02 12:00"), 5) == [utc("2024-11-03 05:30")]


def test_sub_second_bounds() -> None:
    schedule = CronSchedule(
        cron="* * * * * *",
        start_at=utc("2024-05-01 10:00:00") + timedelta(microseconds=1),
        end_at=utc("2024-05-01 10:00:03") - timedelta(microseconds=1),
    )
    assert occurrences(schedule, utc("2024-05-01 09:00"), 10) == [
        utc("2024-05-01 10:00:01"),
        utc("2024-05-01 10:00:02"),
    ]
    after = utc("2024-05-01 10:00:01") + timedelta(microseconds=999_999)
    assert next_occurrence(schedule, after) == utc("2024-05-01 10:00:02")


# -- never drifting ---------------------------------------------------------------------------------


def test_next_from_the_previous_scheduled_time_never_drifts() -> None:
    """A year of daily 09:00 in Berlin, chained from scheduled times, stays on 09:00 local through
    both transitions, and a late finish (the run took 47 s) does not move the next occurrence."""
    schedule = CronSchedule(cron="0 9 * * *", timezone="Europe/Berlin")
    zone = load_zone("Europe/Berlin")
    scheduled = utc("2024-01-01 00:00")
    chain: list[datetime] = []
    for _ in range(366):
        following = next_occurrence(schedule, scheduled)
        assert following is not None
        if chain:
            finished = scheduled + timedelta(seconds=47)
            assert next_occurrence(schedule, finished) == following
        local = following.astimezone(zone)
        assert (local.hour, local.minute, local.second) == (9, 0, 0)
        chain.append(following)
        scheduled = following
    days = [instant.astimezone(zone).date() for instant in chain]
    assert days[0].isoformat() == "2024-01-01"
    assert all((b - a).days == 1 for a, b in itertools.pairwise(days))
    assert utc("2024-03-30 08:00") in chain  # CET
    assert utc("2024-03-31 07:00") in chain  # CEST from the first day
    assert utc("2024-10-27 08:00") in chain  # CET again


def test_every_seven_seconds_keeps_its_grid_across_minutes() -> None:
    schedule = CronSchedule(cron="*/7 * * * * *", timezone="Australia/Lord_Howe")
    got = occurrences(schedule, utc("2024-10-05 15:29:50"), 5)
    # 15:29:56Z is 01:59:56 +10:30; at 15:30:00Z the wall clock jumps from 02:00 to 02:30 +11
    assert got == [
        utc("2024-10-05 15:29:56"),
        utc("2024-10-05 15:30:00"),  # 02:30:00 wall, a matching second right after the gap
        utc("2024-10-05 15:30:07"),
        utc("2024-10-05 15:30:14"),
        utc("2024-10-05 15:30:21"),
    ]


# -- misfire helpers -------------------------------------------------------------------------------


class SearchCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = duetime.core.cron.CronExpr.first_match_at_or_after

        def counted(
            expr: duetime.core.cron.CronExpr, wall_s: int, limit_year: int | None = None
        ) -> int | None:
            self.calls += 1
            return original(expr, wall_s, limit_year)

        monkeypatch.setattr(duetime.core.cron.CronExpr, "first_match_at_or_after", counted)


def test_every_second_on_a_transition_day_is_a_few_searches(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = SearchCounter(monkeypatch)
    schedule = CronSchedule(cron="* * * * * *", timezone="Europe/Berlin", dst_overlap=BOTH)
    assert next_occurrence(schedule, utc("2024-10-27 00:59:59")) == utc("2024-10-27 01:00:00")
    assert next_occurrence(schedule, utc("2024-03-31 00:59:59")) == utc("2024-03-31 01:00:00")
    assert counter.calls <= 6


def test_latest_at_or_before_every_second_over_a_week(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = SearchCounter(monkeypatch)
    schedule = CronSchedule(cron="* * * * * *", timezone="Europe/Berlin")
    at = utc("2024-10-27 01:30:00") + timedelta(microseconds=500)
    # 01:00-02:00Z repeats 02:00-02:59 wall under "first": the last occurrence is 00:59:59Z
    assert latest_at_or_before(schedule, at, at - timedelta(days=7)) == utc("2024-10-27 00:59:59")
    assert counter.calls < 200


def test_latest_at_or_before_sparse_and_bounded() -> None:
    leap = CronSchedule(cron="0 0 29 2 *")
    assert latest_at_or_before(leap, utc("2031-01-01 00:00"), utc("2000-01-01 00:00")) == utc(
        "2028-02-29 00:00"
    )
    assert latest_at_or_before(leap, utc("2031-01-01 00:00"), utc("2028-03-01 00:00")) is None
    hourly = CronSchedule(cron="0 * * * *")
    assert latest_at_or_before(hourly, utc("2024-05-01 10:00"), utc("2024-05-01 10:00")) == utc(
        "2024-05-01 10:00"
    )
    assert latest_at_or_before(hourly, utc("2024-05-01 10:59"), utc("2024-05-01 10:01")) is None
    one_off = OneOffSchedule(run_at=utc("2024-05-01 10:00"))
    assert latest_at_or_before(one_off, utc("2024-05-02 00:00"), utc("2024-05-01 00:00")) == utc(
        "2024-05-01 10:00"
    )


def test_count_between_is_half_open_and_capped() -> None:
    schedule = CronSchedule(cron="*/10 * * * *")
    after, until = utc("2024-05-01 10:00"), utc("2024-05-01 11:00")
    assert count_between(schedule, after, until, cap=100) == 6  # 10:10 ... 11:00
    assert count_between(schedule, after, until, cap=4) == 4
    both = CronSchedule(cron="30 1 * * *", timezone="America/New_York", dst_overlap=BOTH)
    assert count_between(both, utc("2024-11-02 12:00"), utc("2024-11-04 12:00"), cap=10) == 3


def test_one_off_semantics() -> None:
    schedule = OneOffSchedule(run_at=utc("2024-05-01 10:00"))
    assert next_occurrence(schedule, utc("2024-05-01 09:59")) == utc("2024-05-01 10:00")
    assert next_occurrence(schedule, utc("2024-05-01 10:00")) is None
    # a past run_at is still the first occurrence: the contract runs it at once
    assert first_occurrence(schedule, utc("2030-01-01 00:00")) == utc("2024-05-01 10:00")
    assert occurrences(schedule, utc("2024-01-01 00:00"), 5) == [utc("2024-05-01 10:00")]
    assert count_between(schedule, utc("2024-05-01 10:00"), utc("2024-06-01 00:00"), cap=5) == 0


def test_naive_instants_are_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        next_occurrence(CronSchedule(cron="* * * * *"), datetime(2024, 1, 1))
