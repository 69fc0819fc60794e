"""The benchmarks' own arithmetic, on synthetic data: a figure in docs/performance.md is only as
good as the accounting that produced it."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

import pytest

from duetime.storage.bulk import HistoryLeft, OldHistory
from loadtest.burst import (
    BurstArgs,
    MemorySample,
    _memory_row,
    _memory_samples,
    account_starts,
    burst_owners,
    default_lead,
    job_id_of_key,
    old_history_during,
    parse_args,
    redis_entry_ms,
    target_desc,
    wheel_bytes_per_run,
    writes_per_run,
)
from loadtest.plot import cumulative_to_rate, per_second, write_burst_plot
from loadtest.registry_scale import OWNERS, year_of_jobs, year_of_rows

T = 1_800_000_000.0


def test_account_starts_counts_lost_duplicates_and_lateness() -> None:
    expected = {"a", "b", "c", "d"}
    starts = [("a", T + 0.010), ("b", T + 0.500), ("a", T + 0.900), ("c", T + 2.0), ("zz", T + 1.0)]
    acc = account_starts(expected, starts, T)
    assert acc.lost == 1  # d never started
    assert acc.duplicated == 1  # a twice
    assert acc.unexpected == 1  # not one of ours
    assert sorted(round(x) for x in acc.lateness_ms) == [10, 500, 2000]
    assert acc.first_start_s["a"] == pytest.approx(T + 0.010)


def test_account_starts_takes_the_earliest_start_whatever_the_order() -> None:
    acc = account_starts({"a"}, [("a", T + 3.0), ("a", T + 1.0)], T)
    assert acc.lateness_ms == [pytest.approx(1000.0)]
    assert acc.duplicated == 1


def test_keys_and_redis_ids() -> None:
    assert job_id_of_key("0190e0a1-0000-7000-8000-000000000001:2026-12-01T00:00:00Z") == (
        "0190e0a1-0000-7000-8000-000000000001"
    )
    assert redis_entry_ms(b"1764547200123-7") == 1764547200123
    assert redis_entry_ms("1764547200123-0") == 1764547200123


def test_writes_per_run_leaves_out_the_seeded_inserts() -> None:
    before = {"ins": 100, "upd": 50, "hot_upd": 0, "wal_bytes": 1_000}
    # 1000 jobs seeded, then 1000 history rows; 3 updates a run, a third of them HOT
    after = {"ins": 2100, "upd": 3050, "hot_upd": 1000, "wal_bytes": 5_001_000}
    w = writes_per_run(before, after, runs=1000, seeded=1000)
    assert w == {
        "inserts_per_run": 1.0,
        "updates_per_run": 3.0,
        "row_writes_per_run": 4.0,
        "hot_update_share": 0.333,
        "wal_bytes_per_run": 5000,
    }


def test_wheel_bytes_per_run_from_samples() -> None:
    mb = 2**20
    samples = [
        (T - 70, 0, 0.0, 0.0, 80 * mb),
        (T - 60, 0, 0.0, 0.0, 80 * mb),  # before the first claim: the baseline
        (T - 59, 50_000, 50_000.0, 0.0, 90 * mb),
        (T - 58, 100_000, 100_000.0, 0.0, 100 * mb),  # the peak
        (T + 1, 10_000, 100_000.0, 90_000.0, 150 * mb),  # after T: not the wheel's memory
    ]
    assert wheel_bytes_per_run(samples) == pytest.approx(20 * mb / 100_000)
    assert wheel_bytes_per_run([]) is None
    assert wheel_bytes_per_run([(T, 0, 0.0, 0.0, 1.0)]) is None


def test_per_second_series() -> None:
    assert per_second([T - 0.5, T, T + 0.2, T + 1.0, T + 3.9], T) == {-1: 1, 0: 2, 1: 1, 3: 1}
    # a running total sampled over time: the increments, by second
    samples = [(T - 0.1, 0.0), (T + 0.5, 100.0), (T + 0.9, 250.0), (T + 1.5, 250.0), (T + 2.1, 300.0)]
    assert cumulative_to_rate(samples, T) == {0: 250.0, 2: 50.0}


def test_plot_is_written(tmp_path: Path) -> None:
    rng = random.Random(1)
    late = [rng.expovariate(1 / 800.0) for _ in range(2000)]
    path = write_burst_plot(
        tmp_path / "sub" / "burst.png",
        title="synthetic",
        starts_per_s={0: 900, 1: 700, 2: 400},
        completions_per_s={0: 500, 1: 800, 2: 700},
        claims_per_s={-60: 2000},
        lateness_ms=late,
    )
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert 5_000 < len(data) < 200_000  # small enough to commit


def test_arguments_and_default_lead() -> None:
    a = parse_args(["--jobs", "1000", "--target", "webhook", "--seed-mode", "api", "--set", "DUETIME_X=1"])
    assert (a.jobs, a.target, a.seed_mode, a.settings_env) == (1000, "webhook", "api", {"DUETIME_X": "1"})
    bulk = BurstArgs(jobs=1_000_000, target="redis", topology="all-in-one", seed_mode="bulk", processes=2)
    # registration must end before claiming starts, T − lookahead
    assert default_lead(bulk, 60.0) >= 1_000_000 / 40_000 + 60
    with pytest.raises(SystemExit):
        parse_args(["--target", "kafka"])
    assert parse_args([]).workers == 2
    cluster = parse_args(["--topology", "cluster", "--processes", "3", "--workers", "4"])
    assert (cluster.topology, cluster.processes, cluster.workers) == ("cluster", 3, 4)


def test_registry_rows_are_a_year_of_one_offs() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    rows = list(year_of_rows(500, now, random.Random(3)))
    assert {r[2] for r in rows} == set(OWNERS[:100])
    for job_id, shard, _owner, spec, state, next_run_at, scheduled_for, attempt, created, _ in rows:
        assert 0 <= shard < 16 and state == "scheduled" and attempt == 0 and created == now
        assert next_run_at == scheduled_for
        assert 120 <= (next_run_at - now).total_seconds() <= 365 * 86400
        assert f'"run_at":"{next_run_at.strftime("%Y-%m-%dT%H:%M:%SZ")}"' in spec
        assert job_id.version == 7


def test_old_history_during_the_burst_is_read_at_the_samples_nearest_t_and_the_last_start() -> None:
    old = OldHistory(
        first_run_id=1, last_run_id=1000, finished_jobs=10, runs=1000, finished_before=datetime.now(UTC)
    )
    left = [
        (T - 2.0, HistoryLeft(900, 0)),
        (T + 0.1, HistoryLeft(800, 0)),
        (T + 5.2, HistoryLeft(300, 0)),
        (T + 9.0, HistoryLeft(0, 0)),
    ]
    o = old_history_during(old, left, T, drain_s=5.0)
    assert o["left_at_T"]["history_rows"] == 800
    assert o["left_at_last_start"]["history_rows"] == 300
    assert o["left_at_end"]["history_rows"] == 0
    assert o["history_rows_deleted_T_to_last_start"] == 500
    assert o["deleted_rows_per_s"] == 98  # 500 rows in 5.1 s
    assert o["series"][0] == [-2.0, 900, 0]


def test_year_of_jobs_labels_are_the_spec_s() -> None:
    import json

    for row, labels in year_of_jobs(300, datetime.now(UTC), random.Random(5)):
        spec_labels = json.loads(row[3])["labels"]
        assert sorted(labels) == sorted((row[2], k, v, row[0]) for k, v in spec_labels.items())


def test_memory_samples_round_trip_through_the_flat_array() -> None:
    """A node keeps its memory samples as doubles (no Python object per sample to pin pymalloc's
    arenas during the burst) and rebuilds them at the end: every field comes back, None too."""
    import array

    kept = [
        MemorySample(
            T, 64 << 20, None, 41 << 20, 22 << 20, 17 << 20, 1 << 20, None, None, None, 1, 2, 3, 4, 5, 6
        ),
        MemorySample(T + 1.5, 3 << 30, 5, 6, 7, 8, 9, 10, 131 << 20, 30 << 20, 500_000, 0, 0, 0, 0, 0),
    ]
    rows = array.array("d")
    for m in kept:
        rows.extend(_memory_row(m))
    assert _memory_samples(rows) == kept


def test_owners_take_turns_and_need_a_queue_target_in_bulk() -> None:
    assert list(burst_owners(3, 1)) == ["bench"] * 3
    assert list(burst_owners(5, 2)) == ["bench-0", "bench-1", "bench-0", "bench-1", "bench-0"]
    assert parse_args(["--owners", "1000"]).owners == 1000
    assert parse_args([]).owners == 1
    with pytest.raises(SystemExit):
        parse_args(["--owners", "10", "--target", "webhook"])
    with pytest.raises(SystemExit):
        parse_args(["--owners", "10", "--seed-mode", "api"])


def test_hosts_and_target_delay_are_webhook_only_and_default_to_one_host_answering_at_once() -> None:
    default = parse_args([])
    assert (default.hosts, default.target_delay_ms) == (1, 0.0)
    slow = parse_args(["--target", "webhook", "--hosts", "8", "--target-delay-ms", "200"])
    assert (slow.hosts, slow.target_delay_ms) == (8, 200.0)
    assert target_desc("webhook", 8, 200.0) == "webhook (8 hosts, answering in 200 ms)"
    assert target_desc("webhook", 1, 0.0) == "webhook"
    with pytest.raises(SystemExit):
        parse_args(["--hosts", "8"])  # the default target is Redis
    with pytest.raises(SystemExit):
        parse_args(["--target", "webhook", "--hosts", "0"])
