"""The schedule math of a run's context (issue 30, item 4): the occurrence before this one, how
many occurrences a run_once run folded, and the fast count they rest on.

2024 transitions used below (UTC instant, wall clock change):
- Europe/Berlin      03-31 01:00 (02:00 CET -> 03:00 CEST)   10-27 01:00 (03:00 CEST -> 02:00 CET)
- America/New_York   03-10 07:00 (02:00 EST -> 03:00 EDT)    11-03 06:00 (02:00 EDT -> 01:00 EST)
"""

from __future__ import annotations

import random
import zlib
from datetime import UTC, date, datetime, timedelta

import pytest

from duetime.core import schedule as schedule_module
from duetime.core.model import (
    CronSchedule,
    DateRange,
    DstGap,
    DstOverlap,
    IntervalSchedule,
    OneOffSchedule,
)
from duetime.core.schedule import (
    count_between,
    first_occurrence,
    folded_count,
    next_occurrence,
    previous_occurrence,
)
from tests.pure.test_schedule_dst import SearchCounter

SHIFT, SKIP = DstGap.SHIFT, DstGap.SKIP
FIRST, BOTH = DstOverlap.FIRST, DstOverlap.BOTH
US = timedelta(microseconds=1)


def utc(text: str) -> datetime:
    fmt = "%Y-%m-%d %H:%M:%S" if text.count(":") == 2 else "%Y-%m-%d %H:%M"
    return datetime.strptime(text, fmt).replace(tzinfo=UTC)


def berlin(cron: str, gap: DstGap = SHIFT, overlap: DstOverlap = FIRST, **kw: object) -> CronSchedule:
    return CronSchedule(cron=cron, timezone="Europe/Berlin", dst_gap=gap, dst_overlap=overlap, **kw)  # type: ignore[arg-type]


# -- the occurrence before ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "occurrence", "previous"),
    [
        # 02:30 does not exist on 03-31: shift runs it at the transition (01:00Z), skip drops it
        (berlin("30 2 * * *", SHIFT), "2024-04-01 00:30", "2024-03-31 01:00"),
        (berlin("30 2 * * *", SHIFT), "2024-03-31 01:00", "2024-03-30 01:30"),
        (berlin("30 2 * * *", SKIP), "2024-04-01 00:30", "2024-03-30 01:30"),
        # 02:30 is shown twice on 10-27 (00:30Z and 01:30Z): both passes under "both"
        (berlin("30 2 * * *", SHIFT, BOTH), "2024-10-28 01:30", "2024-10-27 01:30"),
        (berlin("30 2 * * *", SHIFT, BOTH), "2024-10-27 01:30", "2024-10-27 00:30"),
        (berlin("30 2 * * *", SHIFT, FIRST), "2024-10-28 01:30", "2024-10-27 00:30"),
        # hourly across the spring gap: 01:59 CET is followed by 03:00 CEST, one hour on the UTC line
        (berlin("0 * * * *"), "2024-03-31 01:00", "2024-03-31 00:00"),
        # every 15 minutes in New York across the autumn overlap, "first": the repeated hour is left out
        (
            CronSchedule(cron="*/15 * * * *", timezone="America/New_York"),
            "2024-11-03 07:00",
            "2024-11-03 05:45",
        ),
        # excluded days are not occurrences: Friday's run came before the excluded weekend
        (
            CronSchedule(cron="0 9 * * *", exclude=(DateRange(date(2024, 5, 4), date(2024, 5, 5)),)),
            "2024-05-06 09:00",
            "2024-05-03 09:00",
        ),
        # 06:00Z is New York's autumn transition, shown again as 01:00 EST: no occurrence under
        # "first"; the one before it is the last of the first pass
        (
            CronSchedule(cron="*/5 * * * *", timezone="America/New_York"),
            "2024-11-03 06:00",
            "2024-11-03 05:55",
        ),
        # an irregular cron: the previous run is the day before, not one gap back
        (CronSchedule(cron="15,45 1-3 * * *"), "2024-05-02 01:15", "2024-05-01 03:45"),
        (CronSchedule(cron="* 0 * * *"), "2024-05-02 00:00", "2024-05-01 00:59"),
        # a manual run at a time that is no occurrence: the schedule's last one before it
        (CronSchedule(cron="0 * * * *"), "2024-05-01 10:17", "2024-05-01 10:00"),
    ],
)
def test_the_previous_occurrence_is_the_schedules_own(
    schedule: CronSchedule, occurrence: str, previous: str
) -> None:
    assert previous_occurrence(schedule, utc(occurrence)) == utc(previous)
    # the walk forward from it agrees: no occurrence lies between the two
    assert next_occurrence(schedule, utc(previous)) == utc(occurrence) or not _is_occurrence(
        schedule, utc(occurrence)
    )


def _is_occurrence(schedule: CronSchedule, instant: datetime) -> bool:
    return next_occurrence(schedule, instant - US) == instant


def test_a_sub_second_occurrence_has_the_one_before_it() -> None:
    every = IntervalSchedule(every="90m", every_s=5400, start_at=utc("2024-05-01 00:00") + 250_000 * US)
    third = every.start_at + timedelta(minutes=180)
    assert previous_occurrence(every, third) == every.start_at + timedelta(minutes=90)
    hourly = CronSchedule(cron="0 * * * *")
    assert previous_occurrence(hourly, utc("2024-05-01 10:00") + 250_000 * US) == utc("2024-05-01 10:00")


def test_an_interval_counts_back_in_elapsed_time_and_skips_excluded_days() -> None:
    start = utc("2024-03-30 09:00")
    every = IntervalSchedule(every="1d", every_s=86400, start_at=start, timezone="Europe/Berlin")
    # elapsed time: daylight saving never moves an interval's occurrences
    assert previous_occurrence(every, utc("2024-04-01 09:00")) == utc("2024-03-31 09:00")
    assert previous_occurrence(every, start) is None, "start_at is the first"
    excluded = IntervalSchedule(
        every="1d",
        every_s=86400,
        start_at=start,
        timezone="Europe/Berlin",
        exclude=(DateRange(date(2024, 3, 31), date(2024, 4, 1)),),
    )
    assert previous_occurrence(excluded, utc("2024-04-02 09:00")) == utc("2024-03-30 09:00")


def test_the_jobs_first_occurrence_has_none_before_it() -> None:
    """Occurrences before the job was made are not the job's: the first one after its creation
    (``first_occurrence``) has no previous, the second one has the first."""
    cron = CronSchedule(cron="0 * * * *")
    created = utc("2024-05-01 10:05")
    first = first_occurrence(cron, created)
    assert first == utc("2024-05-01 11:00")
    assert previous_occurrence(cron, first, created) is None
    assert previous_occurrence(cron, utc("2024-05-01 12:00"), created) == first
    assert previous_occurrence(cron, utc("2024-05-01 08:00"), created) is None, "a backfill before it"
    # made exactly on an occurrence: a cron's first occurrence is strictly after its creation
    on_the_hour = utc("2024-05-01 10:00")
    assert previous_occurrence(cron, utc("2024-05-01 11:00"), on_the_hour) is None

    # an interval's first occurrence is in the second of its creation or later (start_at defaults to it)
    created = utc("2024-05-01 10:05") + 400_000 * US
    every = IntervalSchedule(every="1m", every_s=60, start_at=utc("2024-05-01 10:05"))
    assert first_occurrence(every, created) == utc("2024-05-01 10:05")
    assert previous_occurrence(every, utc("2024-05-01 10:06"), created) == utc("2024-05-01 10:05")
    assert previous_occurrence(every, utc("2024-05-01 10:05"), created) is None
    # an interval whose start_at is long before the job: the job's first occurrence is the next one
    old_grid = IntervalSchedule(every="1m", every_s=60, start_at=utc("2020-01-01 00:00"))
    created = utc("2024-05-01 10:05:30") + 400_000 * US
    first = first_occurrence(old_grid, created)
    assert first == utc("2024-05-01 10:06")
    assert previous_occurrence(old_grid, first, created) is None
    assert previous_occurrence(old_grid, utc("2024-05-01 10:07"), created) == first


def test_a_one_off_has_no_previous_occurrence() -> None:
    one_off = OneOffSchedule(run_at=utc("2024-05-01 10:00"))
    assert previous_occurrence(one_off, utc("2024-05-01 10:00")) is None
    assert previous_occurrence(one_off, utc("2024-05-02 10:00"), utc("2024-04-01 00:00")) is None


def test_a_cron_that_starts_later_has_none_before_its_start() -> None:
    cron = CronSchedule(cron="0 * * * *", start_at=utc("2024-05-01 10:30"))
    assert previous_occurrence(cron, utc("2024-05-01 11:00")) is None
    assert previous_occurrence(cron, utc("2024-05-01 12:00")) == utc("2024-05-01 11:00")


def test_a_regular_cron_finds_its_previous_occurrence_in_three_searches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Computed for every call of a run: the gap to the next occurrence is the first window, which
    for a regular cron holds exactly the previous one (and the result is remembered)."""
    counter = SearchCounter(monkeypatch)
    schedule = CronSchedule(cron="*/5 * * * *", timezone="America/New_York")
    assert previous_occurrence(schedule, utc("2024-05-01 10:00")) == utc("2024-05-01 09:55")
    assert counter.calls <= 3
    assert previous_occurrence(schedule, utc("2024-05-01 10:00")) == utc("2024-05-01 09:55")
    assert counter.calls <= 3, "remembered"


def test_previous_agrees_with_the_walk_on_random_crons() -> None:
    """``previous_occurrence`` is the inverse of ``next_occurrence`` wherever the walk goes."""
    rng = random.Random(30)
    crons = ["*/5 * * * *", "0 * * * *", "30 2 * * *", "15,45 1-3 * * *", "* 0 * * *", "*/7 3 * * 1"]
    crons += ["0 9 L * *", "30 2 * * 0L", "0 9 15W * *", "0 9 * * 1#3"]  # calendar forms
    zones = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC"]
    for _ in range(300):
        schedule = CronSchedule(
            cron=rng.choice(crons),
            timezone=rng.choice(zones),
            dst_gap=rng.choice(list(DstGap)),
            dst_overlap=rng.choice(list(DstOverlap)),
        )
        cursor = utc("2024-03-01 00:00") + timedelta(days=rng.choice([0, 9, 30, 35, 220, 240, 246]))
        cursor += timedelta(seconds=rng.randrange(86400))
        earlier = next_occurrence(schedule, cursor)
        assert earlier is not None
        later = next_occurrence(schedule, earlier)
        assert later is not None
        assert previous_occurrence(schedule, later) == earlier, schedule


# -- what run_once folded -------------------------------------------------------------------------


def test_folded_counts_the_missed_occurrences_before_the_run() -> None:
    hourly = berlin("0 * * * *")
    # the occurrences 22:00 ... 01:00 (local) were missed and the run is the one of 02:00: 4 folded
    assert folded_count(hourly, utc("2024-05-01 20:00"), utc("2024-05-02 00:00")) == 4
    # across the spring gap the wall clock skips 02:00, the UTC line does not: 00:00Z-03:00Z
    assert folded_count(hourly, utc("2024-03-31 00:00"), utc("2024-03-31 03:00")) == 3
    # nothing between: nothing was folded
    assert folded_count(hourly, utc("2024-05-01 20:00"), utc("2024-05-01 20:00")) == 0
    every = IntervalSchedule(every="90m", every_s=5400, start_at=utc("2024-05-01 00:00"))
    assert folded_count(every, utc("2024-05-01 00:00"), utc("2024-05-01 06:00")) == 4
    weekdays = CronSchedule(cron="0 9 * * *", exclude=(DateRange(date(2024, 5, 4), date(2024, 5, 5)),))
    assert folded_count(weekdays, utc("2024-05-03 09:00"), utc("2024-05-07 09:00")) == 2  # Fri, Mon


def test_a_week_of_an_every_second_cron_is_counted_without_visiting_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run_once run after a week's outage of an every-second job stands for 604,800 occurrences
    (Berlin's spring week: one hour fewer on the wall clock, the UTC line is whole); counted a day
    at a time, not one search per occurrence."""
    counter = SearchCounter(monkeypatch)
    schedule = berlin("* * * * * *", overlap=BOTH)
    start = utc("2024-03-27 00:00")
    assert folded_count(schedule, start, start + timedelta(days=7)) == 7 * 86400
    assert counter.calls < 100
    # under "first" the autumn repeat hour is left out; under "skip" nothing runs for the spring gap
    autumn = utc("2024-10-24 00:00")
    assert folded_count(berlin("* * * * * *"), autumn, autumn + timedelta(days=7)) == 7 * 86400 - 3600
    assert folded_count(berlin("0 2 * * *", SKIP), start, start + timedelta(days=7)) == 6
    assert folded_count(berlin("0 2 * * *", SHIFT), start, start + timedelta(days=7)) == 7


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC"])
@pytest.mark.parametrize("gap", list(DstGap))
@pytest.mark.parametrize("overlap", list(DstOverlap))
def test_the_fast_count_agrees_with_the_walk(zone: str, gap: DstGap, overlap: DstOverlap) -> None:
    """``count_between`` walks the first 32 occurrences and counts the rest a day at a time: both
    ways give the same number, around transitions, bounds and excluded days."""
    rng = random.Random(zlib.crc32(f"{zone} {gap} {overlap}".encode()))
    transitions = [utc(t) for t in ("2024-03-30 12:00", "2024-03-09 12:00", "2024-10-26 12:00",
                                    "2024-11-02 12:00", "2024-04-06 00:00", "2024-10-05 00:00")]  # fmt: skip
    crons = ["* * * * *", "*/7 * * * *", "30 2 * * *", "15,45 1-3 * * *", "*/13 * * * * *", "0 30 2 * * 0"]
    crons += ["*/10 * L * *", "0 * * * 0L", "*/20 2 1W * *", "*/5 1-3 * * 0#1"]  # calendar forms
    for _ in range(25):
        low = rng.choice(transitions) + timedelta(seconds=rng.randrange(-86400, 86400))
        high = low + timedelta(seconds=rng.randrange(0, 3 * 86400))
        exclude: tuple[DateRange, ...] = ()
        if rng.random() < 0.3:
            first = low.date() + timedelta(days=rng.randrange(3))
            exclude = (DateRange(first, first + timedelta(days=rng.randrange(2))),)
        schedule = CronSchedule(
            cron=rng.choice(crons),
            timezone=zone,
            dst_gap=gap,
            dst_overlap=overlap,
            exclude=exclude,
            start_at=low + timedelta(hours=rng.randrange(30)) if rng.random() < 0.2 else None,
        )
        walked = 0
        cursor = low
        while (following := next_occurrence(schedule, cursor)) is not None and following <= high:
            walked += 1
            cursor = following
        assert count_between(schedule, low, high, 2**62) == walked, (schedule, low, high)


def test_the_count_is_capped_and_its_walk_is_short_for_a_small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = SearchCounter(monkeypatch)
    schedule = CronSchedule(cron="* * * * *")
    after = utc("2024-05-01 00:00")
    assert count_between(schedule, after, after + timedelta(days=3), cap=10) == 10
    assert counter.calls <= 10
    assert count_between(schedule, after, after + timedelta(days=3), cap=10_000) == 3 * 1440
    assert schedule_module._WALK_BEFORE_COUNTING < 100
    # a catch-up's cap over a long stretch: the walk to the cap is cheaper than counting years
    daily = CronSchedule(cron="0 9 * * *")
    counter.calls = 0
    assert count_between(daily, after, after + timedelta(days=3650), cap=100) == 100
    assert counter.calls <= 100
    assert count_between(daily, after, after + timedelta(days=3650), cap=10**6) == 3650
