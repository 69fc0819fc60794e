"""The noisy-neighbours benchmark's accounting, on synthetic calls: its verdict on issue 28 is only
as good as the counting of late, lost and doubled runs behind it."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.common import InflightSample, ReceivedCall
from loadtest.noisy_neighbours import (
    HANGING,
    NoisyArgs,
    Planned,
    account_calls,
    bar_failures,
    inflight_figures,
    merged,
    parse_args,
    plan_runs,
)
from loadtest.plot import write_noisy_plot

T = 1_800_000_000.0


def _call(job: str, at_s: float, port: int, attempt: int = 1) -> ReceivedCall:
    return ReceivedCall(f"{job}:2027-01-15T08:00:00Z", attempt, 1, round(at_s * 1e9), port)


def test_lateness_is_the_earliest_call_and_lost_duplicated_are_per_group() -> None:
    planned = {
        "h1": Planned(HANGING, 9000, 0, T),
        "a1": Planned("A", 9100, 0, T),
        "a2": Planned("A", 9100, 1, T + 5),
        "b1": Planned("B", 9200, 0, T),
        "b2": Planned("B", 9200, 1, T + 5),
    }
    calls = [
        _call("a1", T + 2.0, 9100),
        _call("a1", T + 0.5, 9100),  # the same attempt twice, the later first: a duplicate
        _call("a2", T + 5.25, 9100),
        _call("h1", T + 30.0, 9000),
        _call("h1", T + 60.0, 9000, attempt=2),  # a retry is not a duplicate, nor later
        _call("b1", T + 0.1, 9100),  # to another host's port
        _call("zz", T, 9200),  # no such run
    ]
    acc = account_calls(planned, calls)
    assert acc.lateness_ms[("A", 9100, 0)] == [pytest.approx(500.0)]
    assert acc.lateness_ms[("A", 9100, 1)] == [pytest.approx(250.0)]
    assert acc.lateness_ms[(HANGING, 9000, 0)] == [pytest.approx(30_000.0)]
    assert acc.planned == {"A": 2, "B": 2, HANGING: 1}
    assert acc.called == {"A": 2, "B": 1, HANGING: 1}
    assert acc.lost == {"A": 0, "B": 1, HANGING: 0}
    assert acc.duplicated == {"A": 1, "B": 0, HANGING: 0}
    assert (acc.unexpected, acc.wrong_host) == (1, 1)
    assert merged(acc.lateness_ms, "B", 0) == [pytest.approx(100.0)]
    assert merged(acc.lateness_ms, "B", 1) == []


def test_in_flight_peak_and_mean_over_the_busy_period_after_t() -> None:
    def at(s: float, a: int, b: int) -> InflightSample:
        return InflightSample(round((T + s) * 1e9), {9000: a, 9001: b, 9100: 7})

    samples = [at(-1, 0, 0), at(0, 2, 2), at(1, 4, 0), at(2, 0, 2), at(3, 0, 0), at(4, 0, 0)]
    fig = inflight_figures(samples, [9000, 9001], T)  # the healthy port 9100 is not counted
    assert fig.peak == 4
    assert fig.peak_by_port == {9000: 4, 9001: 2}
    assert fig.mean == pytest.approx((4 + 4 + 2) / 3)  # from T to the last sample with any open
    assert fig.busy_s == pytest.approx(2.0)
    assert fig.series[0][0] == pytest.approx(-1.0)
    assert fig.series[0][1] == 0
    empty = inflight_figures([], [], T)
    assert (empty.peak, empty.mean, empty.series) == (0, 0.0, [])


def test_the_bar_names_each_late_wave_and_owner_and_any_lost_or_doubled_run() -> None:
    lateness = {
        ("A", 9100, 0): [100.0] * 99 + [5000.0, 6000.0],
        ("A", 9100, 1): [200.0] * 100,
        ("B", 9200, 0): [300.0] * 100,
        (HANGING, 9000, 0): [20_000.0],
    }
    failures = bar_failures(lateness, healthy_groups=["A", "B"], waves=2, lost=0, duplicated=0)
    assert failures == ["owner A wave 1: p99 5.0 s", "owner B wave 2: no call"]
    assert bar_failures(lateness, healthy_groups=["A"], waves=2, lost=0, duplicated=0) == [
        "owner A wave 1: p99 5.0 s"
    ]
    ok = {("A", 9100, 0): [10.0], ("A", 9100, 1): [20.0]}
    assert bar_failures(ok, healthy_groups=["A"], waves=2, lost=0, duplicated=0) == []
    assert bar_failures(ok, healthy_groups=["A"], waves=2, lost=3, duplicated=1) == ["3 lost", "1 duplicated"]


def test_the_plan_writes_hanging_runs_first_due_with_the_first_wave() -> None:
    a = NoisyArgs(hanging=2, runs_per_hanging=3, healthy=1, healthy_owner="both", waves=2, wave_runs=2)
    plan = plan_runs(a, T, [9000, 9001], {"A": [9100], "B": [9200]})
    assert len(plan) == a.total_runs == 2 * 3 + 2 * 2 * 2
    assert [p.group for p in plan[:6]] == [HANGING] * 6
    assert {p.due_s for p in plan[:6]} == {T}
    second = [p for p in plan if p.wave == 1]
    assert {(p.group, p.port, p.due_s) for p in second} == {("A", 9100, T + 5), ("B", 9200, T + 5)}
    assert len(second) == 4


def test_arguments_default_to_the_issue_scenario() -> None:
    a = parse_args([])
    assert (a.hanging, a.runs_per_hanging, a.hang_s) == (5, 1000, 20.0)
    assert (a.waves, a.wave_gap_s, a.wave_runs, a.processes) == (2, 5.0, 500, 1)
    assert parse_args(["--healthy-owner", "same"]).healthy_groups == ["A"]
    assert parse_args(["--set", "DUETIME_TARGET_CONCURRENCY=8"]).settings_env == {
        "DUETIME_TARGET_CONCURRENCY": "8"
    }
    with pytest.raises(SystemExit):
        parse_args(["--healthy", "0"])


def test_noisy_plot_is_written(tmp_path: Path) -> None:
    path = write_noisy_plot(
        tmp_path / "noisy.png",
        title="test",
        lateness_s={"w1 A": [0.01, 0.2, 3.0], "w2 A": []},
        bar_s=1.0,
        inflight=[(-3.0, 0), (0.0, 5), (1.0, 3)],
        healthy_arrivals_s={"healthy A": [0.1, 0.2, 7.5]},
    )
    assert path.stat().st_size > 1000
