"""The claim-time decision for a late row (core/misfire.py), on a fake clock: which occurrences
run, which are skipped, and where the job's own row goes on, so that a catch-up catches up."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from duetime.core.misfire import CatchUp, FireNow, SkipTo, decide
from duetime.core.model import CronSchedule, JobSpec, Misfire, OneOffSchedule, Overlap, QueueTarget
from duetime.core.schedule import next_occurrence

T0 = datetime(2026, 12, 1, 20, 0, 0, tzinfo=UTC)
S = timedelta(seconds=1)
TARGET = QueueTarget(broker="redis", topic="t")  # type: ignore[arg-type]


def spec(
    cron: str = "* * * * * *",
    *,
    misfire: Misfire = Misfire.RUN_ALL,
    grace: int = 60,
    overlap: Overlap = Overlap.ALLOW,
) -> JobSpec:
    return JobSpec(
        target=TARGET,
        schedule=CronSchedule(cron=cron),
        misfire=misfire,
        misfire_grace_s=grace,
        overlap=overlap,
    )


def seconds(first: datetime, count: int) -> tuple[datetime, ...]:
    return tuple(first + i * S for i in range(count))


def test_on_time_row_fires_itself() -> None:
    assert decide(spec(), T0, T0 + 0.4 * S, due_at=T0) == FireNow(T0)


@pytest.mark.parametrize("overlap", list(Overlap))
def test_a_ten_second_outage_under_run_all_runs_the_whole_backlog_at_once(overlap: Overlap) -> None:
    """The issue's case: an every-second job, 10 s down, grace 1 s."""
    now = T0 + 10.14 * S
    decision = decide(spec(grace=1, overlap=overlap), T0, now, due_at=T0)
    assert isinstance(decision, CatchUp)
    assert decision.runs == seconds(T0, 11)  # 20:00:00 .. 20:00:10, every one of them, none twice
    assert decision.next_scheduled_for == T0 + 11 * S  # the first one not due yet: on time again
    assert decision.chained is (overlap is not Overlap.ALLOW)  # together, or back to back
    assert decision.skipped == () and decision.unrecorded == 0


@pytest.mark.parametrize("overlap", [Overlap.SKIP, Overlap.BUFFER_ONE])
def test_the_claim_instant_draws_the_line_between_backlog_and_regular_runs(overlap: Overlap) -> None:
    """Claimed a moment before 20:00:10, the backlog ends at 20:00:09 and 20:00:10 is the job's
    row's own run, on time, beside the backlog (docs/state-machine.md: regular occurrences are not
    held back for it); claimed at 20:00:10, that occurrence is the backlog's newest. So nothing
    outside the engine can tell which it is by a clock read after the restart, only by one read
    before it (tests/processes/test_catch_up.py)."""
    job = spec(grace=1, overlap=overlap)
    early = decide(job, T0, T0 + 10 * S - timedelta(microseconds=1), due_at=T0)
    assert isinstance(early, CatchUp) and early.chained
    assert early.runs == seconds(T0, 10)
    assert early.next_scheduled_for == T0 + 10 * S
    on_the_second = decide(job, T0, T0 + 10 * S, due_at=T0)
    assert isinstance(on_the_second, CatchUp)
    assert on_the_second.runs == seconds(T0, 11)
    assert on_the_second.next_scheduled_for == T0 + 11 * S


@pytest.mark.parametrize("policy", list(Misfire))
def test_late_rows_inside_the_grace_catch_up_under_every_policy(policy: Misfire) -> None:
    """Late by 10 s with the default 60 s grace: not missed, so all of them run, at once."""
    decision = decide(spec(misfire=policy), T0, T0 + 10.5 * S, due_at=T0)
    assert isinstance(decision, CatchUp)
    assert decision.runs == seconds(T0, 11)
    assert decision.next_scheduled_for == T0 + 11 * S


def test_missed_rows_keep_their_policies() -> None:
    now = T0 + 10.5 * S
    assert decide(spec(misfire=Misfire.RUN_ONCE, grace=1), T0, now, due_at=T0) == FireNow(T0 + 10 * S)
    skipped = decide(spec(misfire=Misfire.SKIP, grace=1), T0, now, due_at=T0)
    assert isinstance(skipped, SkipTo)
    assert skipped.skipped == seconds(T0, 10)  # 20:00:00 .. 20:00:09 are more than 1 s late
    assert skipped.next_scheduled_for == T0 + 10 * S


def test_the_cap_keeps_the_latest_and_records_the_older_ones_skipped() -> None:
    now = T0 + 299.5 * S  # 300 occurrences due: 20:00:00 .. 20:04:59
    decision = decide(spec(grace=1), T0, now, due_at=T0, run_all_cap=100, record_cap=50)
    assert isinstance(decision, CatchUp)
    assert decision.runs == seconds(T0 + 200 * S, 100)
    assert decision.skipped == seconds(T0, 50)
    assert decision.unrecorded == 150  # 20:00:50 .. 20:03:19 counted, not written
    assert decision.next_scheduled_for == T0 + 300 * S


def test_a_slow_schedule_after_a_pause() -> None:
    """A resumed job is judged the same way: an hourly job paused for a morning."""
    hourly = spec("0 * * * *", grace=60)
    now = T0 + timedelta(hours=4, minutes=12)
    decision = decide(hourly, T0, now, due_at=T0)
    assert isinstance(decision, CatchUp)
    assert decision.runs == tuple(T0 + timedelta(hours=h) for h in range(5))
    assert decision.next_scheduled_for == T0 + timedelta(hours=5)


def test_a_schedule_that_ends_inside_the_backlog_has_no_next() -> None:
    bounded = JobSpec(
        target=TARGET,
        schedule=CronSchedule(cron="* * * * * *", end_at=T0 + 4 * S),
        misfire=Misfire.RUN_ALL,
        misfire_grace_s=1,
    )
    decision = decide(bounded, T0, T0 + 10 * S, due_at=T0)
    assert isinstance(decision, CatchUp)
    assert decision.runs == seconds(T0, 5)
    assert decision.next_scheduled_for is None


def test_jitter_counts_for_missed_but_not_for_the_backlog() -> None:
    """A row due (with its jitter) inside the grace is late, not missed, even when its nominal
    occurrence is older than the grace; its backlog is every nominal occurrence up to now."""
    decision = decide(spec(misfire=Misfire.SKIP, grace=5), T0, T0 + 8 * S, due_at=T0 + 4 * S)
    assert isinstance(decision, CatchUp)
    assert decision.runs == seconds(T0, 9)


def test_one_offs_are_never_a_catch_up() -> None:
    one_off = JobSpec(
        target=TARGET, schedule=OneOffSchedule(run_at=T0), misfire=Misfire.SKIP, misfire_grace_s=1
    )
    assert decide(one_off, T0, T0 + 0.5 * S, due_at=T0) == FireNow(T0)
    assert decide(one_off, T0, T0 + 5 * S, due_at=T0) == SkipTo((T0,), None)


def test_the_plan_is_a_fixed_point_afterwards() -> None:
    """After a catch-up, the row's next occurrence claimed on time fires by itself."""
    job = spec(grace=1)
    decision = decide(job, T0, T0 + 10.14 * S, due_at=T0)
    assert isinstance(decision, CatchUp) and decision.next_scheduled_for is not None
    following = decision.next_scheduled_for
    assert decide(job, following, following + 0.2 * S, due_at=following) == FireNow(following)
    assert next_occurrence(job.schedule, decision.runs[-1]) == following


@pytest.mark.parametrize("misfire", list(Misfire))
def test_a_deferred_row_is_not_a_backlog(misfire: Misfire) -> None:
    """buffer_one's buffered run (made due after a long run ended, the occurrences between it and
    now already passed over by the overlap policy) runs alone, whatever its age."""
    job = spec(misfire=misfire, grace=60, overlap=Overlap.BUFFER_ONE)
    assert decide(job, T0, T0 + 5 * S, due_at=T0 + 4.9 * S, deferred=True) == FireNow(T0)
    past_grace = decide(job, T0, T0 + 100 * S, due_at=T0 + 30 * S, deferred=True)
    if misfire is Misfire.RUN_ALL:
        assert past_grace == FireNow(T0)
    else:
        assert not isinstance(past_grace, CatchUp)
