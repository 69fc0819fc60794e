"""``loadtest.burst --topology cluster`` end to end on a small burst: separate ``duetime engine``
and ``duetime worker`` processes over the NATS run queue (the shared NATS the benchmark uses),
bulk-seeded jobs due at one instant, runs landing in a Redis stream. Correctness only: every run
started exactly once, the JSON says what ran, and the run queue's stream is gone afterwards."""

from __future__ import annotations

import json

import nats
import pytest
from nats.js.errors import NotFoundError

from duetime.runqueue.natsqueue import stream_name
from loadtest.burst import NATS_URL, BurstArgs, report, run_burst

JOBS = 400


@pytest.mark.timeout(180)
async def test_a_small_cluster_burst_starts_every_run_exactly_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    a = BurstArgs(
        jobs=JOBS,
        target="redis",
        topology="cluster",
        seed_mode="bulk",
        processes=2,
        workers=1,
        lead_s=8.0,
        timeout_s=60.0,
        settings_env={"DUETIME_LOOKAHEAD_S": "3", "DUETIME_POLL_INTERVAL_S": "0.5"},
        plot=False,
    )
    result = await run_burst(a)
    json.dumps(result)  # the JSON line can be written

    assert (result["topology"], result["processes"], result["workers"]) == ("cluster", 2, 1)
    assert (result["started"], result["lost"], result["duplicated"]) == (JOBS, 0, 0)
    assert result["outcomes"] == {"succeeded": JOBS}, result["errors"]
    assert result["claimed_before_T"] == JOBS  # claims read from the engines' /metrics
    # what only an in-process node can say is absent, not made up
    for key in ("fire_lateness_ms", "wheel_rss_bytes_per_run", "fence_statements", "gc_seconds_per_node"):
        assert result[key] is None, key
    assert {"engine-0", "engine-1", "worker-0", "benchmark"} <= result["peak_rss_mb"].keys()
    report(result)
    table = capsys.readouterr().out
    rows = {line.split("  ")[0]: line.rsplit("  ", 1)[-1].strip() for line in table.splitlines()}
    assert "P=2 engines, W=1 workers" in rows["runs due at T"]
    assert rows["fence statements"] == rows["engine RSS per waiting run"] == "n/a"

    nc = await nats.connect(NATS_URL)
    try:
        with pytest.raises(NotFoundError):
            await nc.jetstream().stream_info(stream_name(result["run_queue_prefix"]))
    finally:
        await nc.close()
