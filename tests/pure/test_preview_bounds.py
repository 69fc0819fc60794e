"""The work a schedule computation does for a request is bounded (issue 32, item 3).

Excluded dates are handled by interval arithmetic (one merged table per schedule, searches that
jump whole ranges and stop at the search horizon), a preview spends at most a fixed number of
search steps and says when it stopped early, the zone-year tables a client can make the process
probe are capped, and a backfill whose range a sparse cron crosses only in centuries is refused
rather than searched under the job's row lock.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

import duetime.core.schedule as schedule_module
from duetime.core.backfill import plan_backfill
from duetime.core.errors import InvalidRequest
from duetime.core.exclusion import Exclusions
from duetime.core.model import (
    Broker,
    CronSchedule,
    DateRange,
    DstGap,
    IntervalSchedule,
    JobSpec,
    QueueTarget,
)
from duetime.core.preview import MAX_PREVIEW_STEPS, compute_preview, preview_to_json, resume_from
from duetime.core.schedule import (
    check_cron_schedule,
    describe_instant,
    excluded_between,
    first_occurrence,
    next_occurrence,
    occurrences,
    skipped_gaps,
)
from duetime.core.workbudget import WorkBudget, WorkExhausted

NOW = datetime(2026, 12, 5, tzinfo=UTC)
# The issue's input: 1 February when it is a Sunday (every 5 to 11 years), in a zone whose
# offsets change around Ramadan, with the 1,000 excluded dates the contract allows.
SPARSE = "0 0 */31 2 */7"
CASABLANCA = "Africa/Casablanca"


def every_third_day(n: int = 1000, first: date = date(2026, 1, 1)) -> tuple[DateRange, ...]:
    return tuple(DateRange(first + timedelta(days=3 * i), first + timedelta(days=3 * i)) for i in range(n))


def local_dates(instants: list[datetime], zone: str) -> tuple[DateRange, ...]:
    reader = CronSchedule(cron="* * * * *", timezone=zone)
    days = [describe_instant(reader, i)["local"][:10] for i in instants]
    return tuple(DateRange(date.fromisoformat(d), date.fromisoformat(d)) for d in days)


def test_a_walk_merges_its_excluded_ranges_once_not_once_per_occurrence(monkeypatch: Any) -> None:
    """Every occurrence used to build (sort and merge) the 1,000 ranges again: 100 occurrences
    of a preview were 100 merges, the bulk of its time."""
    built = []
    original = Exclusions.__init__

    def counting(self: Exclusions, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Exclusions, "__init__", counting)
    schedule = CronSchedule(cron="0 9 * * *", timezone=CASABLANCA, exclude=every_third_day())
    current = first_occurrence(schedule, NOW)
    for _ in range(100):
        assert current is not None
        current = next_occurrence(schedule, current)
    assert len(built) <= 1, f"the excluded ranges were merged {len(built)} times for one schedule"


def test_excluded_ranges_are_jumped_only_up_to_the_search_horizon() -> None:
    """A list of excluded dates that covers the next 1,000 occurrences of a sparse cron used to
    send one search across seven millennia (year 9046, 2 s of CPU on a cold process); a search
    now stops at the horizon every search has (30 years), and the schedule is refused as the
    message always said."""
    plain = CronSchedule(cron=SPARSE, timezone=CASABLANCA)
    ahead = occurrences(plain, NOW, 12)
    assert ahead[-1] - NOW > timedelta(days=31 * 366), "12 occurrences span more than the horizon"
    schedule = CronSchedule(cron=SPARSE, timezone=CASABLANCA, exclude=local_dates(ahead, CASABLANCA))
    budget = WorkBudget()
    assert first_occurrence(schedule, NOW, budget) is None
    assert budget.spent < 1000
    with pytest.raises(InvalidRequest) as refused:
        check_cron_schedule(schedule, NOW)
    assert refused.value.code == "cron_never_fires" and refused.value.field == "schedule.exclude"


def test_occurrences_inside_the_horizon_are_still_found_past_excluded_ranges() -> None:
    plain = CronSchedule(cron=SPARSE, timezone=CASABLANCA)
    ahead = occurrences(plain, NOW, 3)
    schedule = CronSchedule(cron=SPARSE, timezone=CASABLANCA, exclude=local_dates(ahead[:2], CASABLANCA))
    assert first_occurrence(schedule, NOW) == ahead[2]


def test_excluded_occurrences_are_found_by_jumping_between_ranges() -> None:
    """Only the excluded stretches are searched: an every-second schedule whose one excluded
    day is three weeks away lists that day's first occurrences for a handful of steps, where a
    scan would have walked 1.8 million allowed seconds (the old scan gave up after 1,000)."""
    day = (NOW + timedelta(days=21)).date()
    schedule = CronSchedule(cron="* * * * * *", timezone="UTC", exclude=(DateRange(day, day),))
    budget = WorkBudget()
    found = excluded_between(schedule, NOW, None, 5, budget)
    midnight = datetime(day.year, day.month, day.day, tzinfo=UTC)
    assert found.items == [midnight + timedelta(seconds=s) for s in range(5)]
    assert not found.truncated
    assert budget.spent < 50


def test_excluded_occurrences_agree_with_a_walk_of_the_schedule_without_exclusions() -> None:
    for schedule in (
        CronSchedule(cron="0 0 * * *", timezone=CASABLANCA, exclude=every_third_day(50, NOW.date())),
        CronSchedule(cron="30 2 * * *", timezone="Europe/Berlin", exclude=every_third_day(80, NOW.date())),
        IntervalSchedule(
            every="7h", every_s=7 * 3600, start_at=NOW, timezone="Asia/Kolkata", exclude=every_third_day(40)
        ),
    ):
        window_end = NOW + timedelta(days=60)
        unexcluded = [o for o in occurrences(_without(schedule), NOW, 1000) if o <= window_end]
        kept = set(o for o in occurrences(schedule, NOW, 1000) if o <= window_end)
        expected = [o for o in unexcluded if o not in kept][:30]
        assert excluded_between(schedule, NOW, window_end, 30).items == expected, schedule


def _without(schedule: CronSchedule | IntervalSchedule) -> CronSchedule | IntervalSchedule:
    return replace(schedule, exclude=())


def test_skipped_gaps_come_from_the_zones_transitions_not_from_every_occurrence() -> None:
    """A cron that fires every minute of 02:00-02:59 with ``dst_gap: skip``, over a year: two
    transitions to look at, not the 22,000 occurrences a scan of them walks (the old one stopped
    after 1,000, in January, and found none)."""
    schedule = CronSchedule(cron="* 2 * * *", timezone="Europe/Berlin", dst_gap=DstGap.SKIP)
    budget = WorkBudget()
    gaps = skipped_gaps(schedule, NOW, NOW + timedelta(days=366), 10, budget)
    assert gaps.items == [datetime(2027, 3, 28, 1, 0, tzinfo=UTC)]
    assert budget.spent < 100


def test_the_issues_preview_is_bounded_and_says_when_it_stopped() -> None:
    schedule = CronSchedule(cron=SPARSE, timezone=CASABLANCA, exclude=every_third_day())
    start = datetime(5000, 1, 1, tzinfo=UTC)  # years nobody asked about: every one a cold probe
    preview = compute_preview(schedule, start, 100)
    assert preview.steps <= MAX_PREVIEW_STEPS + 100  # the last search step, and a year's probe
    body = preview_to_json(preview)
    if preview.truncated:
        assert 0 < len(body["items"]) < 100 and body["has_more"] and body["truncated"]
        assert body["resume_from"] == body["items"][-1]["at"]
        assert any("search steps" in w for w in body["warnings"])
    else:
        assert len(body["items"]) == 100


def test_a_truncated_preview_resumes_exactly_where_it_stopped() -> None:
    schedule = CronSchedule(cron=SPARSE, timezone="America/New_York", dst_gap=DstGap.SKIP)
    start = datetime(7000, 1, 1, tzinfo=UTC)
    first = compute_preview(schedule, start, 40, WorkBudget(400))
    assert first.truncated and first.items
    resume = resume_from(first)
    assert resume is not None
    second = compute_preview(schedule, resume, 40 - len(first.items), WorkBudget(100_000))
    assert not second.truncated
    assert first.items + second.items == occurrences(schedule, start, 40)


def test_a_budget_stops_a_walk_and_counts_what_it_let_through() -> None:
    budget = WorkBudget(10)
    with pytest.raises(WorkExhausted):
        occurrences(CronSchedule(cron=SPARSE, timezone=CASABLANCA), NOW, 50, budget)
    assert budget.spent > 10
    counter = WorkBudget()
    occurrences(CronSchedule(cron="0 0 * * *", timezone="UTC"), NOW, 50, counter)
    assert 50 <= counter.spent < 500 and not counter.exhausted


def test_the_zone_year_tables_are_capped(monkeypatch: Any) -> None:
    """Any of ~600 zones times 10,000 years can be asked about (a preview's ``from``): the cache
    of probed years keeps the newest ``_MAX_CACHED_YEARS`` and probes the others again."""
    monkeypatch.setattr(schedule_module, "_MAX_CACHED_YEARS", 40)
    schedule = CronSchedule(cron="0 0 1 1 *", timezone="America/Santiago")
    first = occurrences(schedule, datetime(6000, 1, 1, tzinfo=UTC), 200)
    held = sum(len(t._years) for t in schedule_module._timelines.values())
    assert held <= 40
    # and a year dropped from the cache is probed again, to the same answer
    assert occurrences(schedule, datetime(6000, 1, 1, tzinfo=UTC), 200) == first


@pytest.mark.parametrize(
    "zone",
    ["Asia/Gaza", "America/Noronha", "America/Argentina/Tucuman", "Africa/Casablanca", "Australia/Lord_Howe"],
)
def test_probing_every_six_days_finds_what_a_daily_probe_finds(zone: str, monkeypatch: Any) -> None:
    """From 1970 on no zone changes its offset twice within 6 days 23 hours (checked for every
    zone to 2300), so a year is probed every 6 days; these zones hold the closest pairs."""
    timeline = schedule_module._Timeline(schedule_module.load_zone(zone), fixed=False)
    fast = {y: timeline._probe_year(y) for y in range(1995, 2080)}
    monkeypatch.setattr(schedule_module, "_PROBE_STEP_S", 86400)
    slow = schedule_module._Timeline(schedule_module.load_zone(zone), fixed=False)
    assert fast == {y: slow._probe_year(y) for y in range(1995, 2080)}


def test_a_backfill_a_sparse_cron_crosses_only_in_centuries_is_refused_not_searched() -> None:
    spec = JobSpec(
        target=QueueTarget(broker=Broker.NATS, topic="t"),
        schedule=CronSchedule(cron=SPARSE, timezone="Asia/Gaza"),
    )
    with pytest.raises(InvalidRequest) as refused:
        plan_backfill(
            spec,
            datetime(1500, 1, 1, tzinfo=UTC),
            NOW,
            NOW,
            max_occurrences=1000,
            pace_per_s=10.0,
            chain_busy=False,
        )
    assert refused.value.code == "backfill_too_large" and refused.value.field == "from"
    # an ordinary range is unaffected
    daily = JobSpec(target=spec.target, schedule=CronSchedule(cron="0 0 * * *", timezone="UTC"))
    runs = plan_backfill(
        daily, NOW - timedelta(days=900), NOW, NOW, max_occurrences=1000, pace_per_s=10.0, chain_busy=False
    )
    assert len(runs) == 900


@pytest.mark.parametrize("year", [9899, 9940, 9975, 9996, 9999])
@pytest.mark.parametrize("gap", [DstGap.SKIP, DstGap.SHIFT])
def test_a_preview_near_the_end_of_the_calendar_ends_quietly(year: int, gap: DstGap) -> None:
    """Excluded ranges made a search's horizon run past year 9999 (OverflowError: a 500)."""
    exclude = (*every_third_day(), DateRange(date(9990, 1, 1), date(9999, 12, 30)))
    for cron, zone in (("0 0 */31 2 */7", "America/New_York"), ("* * * * * *", "Pacific/Apia")):
        schedule = CronSchedule(cron=cron, timezone=zone, dst_gap=gap, exclude=exclude)
        preview = compute_preview(schedule, datetime(year, 6, 1, tzinfo=UTC), 100)
        preview_to_json(preview)
        assert all(i.year <= 9997 for i in preview.items)
