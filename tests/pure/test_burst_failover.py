"""``loadtest.burst``'s failover figures (``--kill-engine-at``): from the starts the target saw."""

from __future__ import annotations

from duetime.core.ids import new_job_id
from loadtest.burst import failover, parse_args


def test_failover_counts_only_the_killed_engines_shards_after_the_kill() -> None:
    t = 1000.0
    a3, b3, c5, d7 = (str(new_job_id(s)) for s in (3, 3, 5, 7))
    starts = [
        (a3, t + 1.0),  # shard 3, before the kill at T+2: not waiting there
        (b3, t + 9.0),  # shard 3, 7 s after the kill
        (c5, t + 2.5),  # shard 5, 0.5 s after the kill
        (d7, t + 3.0),  # shard 7: not the killed engine's
    ]
    f = failover([a3, b3, c5, d7], starts, t, t + 2.0, frozenset({3, 5}))
    assert f["kill_to_first_start_s"] == {"3": 7.0, "5": 0.5}
    assert f["kill_to_first_start_max_s"] == 7.0
    assert f["runs_waiting_on_its_shards"] == 2
    assert f["their_lateness_ms"]["max"] == 9000.0


def test_kill_engine_at_needs_the_cluster_topology() -> None:
    a = parse_args(["--topology", "cluster", "--kill-engine-at", "2", "--processes", "3"])
    assert a.kill_engine_at_s == 2.0 and not a.split_shards
    assert parse_args(["--topology", "cluster", "--split-shards"]).split_shards
    try:
        parse_args(["--kill-engine-at", "2"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("--kill-engine-at without --topology cluster was accepted")
