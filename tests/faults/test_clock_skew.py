"""A node whose wall clock is off the database's (libfaketime preloaded into a real `duetime run`):
runs still start at their due instant by the database's clock, never before, and the lateness in
the history is the one the target saw.

Before one clock for the cluster, a node 20 s ahead started all 20 runs 20 s before they were due
and recorded a lateness of 8 ms for them.
"""

from __future__ import annotations

import glob
import json
from datetime import timedelta
from pathlib import Path

import pytest

from tests.faults.harness import (
    NodeProc,
    account,
    expected_for,
    metric,
    node_env,
    one_off,
    owner_on,
    whole_second,
)
from tests.faults.recorder import RecorderProcess, parse_time

pytestmark = [pytest.mark.timeout(180), pytest.mark.processes]

FAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))


@pytest.mark.parametrize("skew_s", [20, -20])
async def test_a_node_with_a_skewed_clock_starts_runs_on_time_by_the_database(
    skew_s: int, fault_db: str, recorder: RecorderProcess, tmp_path: Path
) -> None:
    assert FAKETIME, "libfaketime is missing: apt-get install faketime (scripts/services.sh does)"
    env = node_env(
        fault_db,
        DUETIME_DATA_DIR=str(tmp_path / "data"),
        LD_PRELOAD=FAKETIME[0],
        FAKETIME=f"{skew_s:+d}s",
        FAKETIME_DONT_RESET="1",
    )
    node = NodeProc(env, "run", tmp_path / "node.log")
    try:
        url = await node.ready()
        offset = await metric(url, "duetime_clock_offset_seconds")
        async with owner_on(url, fault_db) as owner:
            due = whole_second(6)
            jobs = await owner.create_many(
                [one_off(recorder.url + "/ok", due + timedelta(seconds=i % 4)) for i in range(20)]
            )
            # Retry times are the store's, computed by the database's clock: a failed attempt's
            # retry comes after its backoff (0-2 s), not shifted by the host's skew.
            retried = await owner.create(
                one_off(
                    recorder.url + "/status/503",
                    due,
                    retry={"max_attempts": 2, "backoff_initial_s": 2, "backoff_max_s": 2},
                )
            )
            await owner.settle(within=90)
            report = await account(owner, recorder, [e for job in jobs for e in expected_for(job)])
            history = [(job["id"], run) for job in jobs for run in await owner.runs(job["id"])]
        alive = node.alive()
    finally:
        await node.stop()
    tries = sorted(r.arrived for r in recorder.records() if r.job_id == retried["id"])
    arrivals = {(r.job_id, r.scheduled_for): r for r in recorder.records() if r.job_id != retried["id"]}
    gaps = []
    for job_id, run in history:
        scheduled_for = parse_time(run["scheduled_for"])
        seen_ms = (arrivals[(job_id, scheduled_for)].arrived - scheduled_for).total_seconds() * 1000
        gaps.append(abs(seen_ms - run["lateness_ms"]))
    print(
        json.dumps(
            {
                "scenario": f"clock_skew_{skew_s:+d}s",
                "measured_offset_s": round(offset, 3),
                "max_lateness_gap_ms": round(max(gaps), 1),
                "retry_after_s": round((tries[1] - tries[0]).total_seconds(), 3) if len(tries) == 2 else None,
                "lateness_ms": sorted(r["lateness_ms"] for _, r in history),
                **report.counts(),
            }
        )
    )
    assert alive, node.tail()
    assert abs(offset + skew_s) < 1.0, f"the node measured its clock {-offset:+.3f} s off, not {skew_s:+d} s"
    assert report.ok, report.explain()
    assert not report.early and report.counts()["delivered"] == 20, report.explain()
    assert len(history) == 20 and all(r["lateness_ms"] >= 0 for _, r in history), history
    assert max(gaps) < 1000, "the history's lateness is what the target saw, within a second"
    assert len(tries) == 2, tries
    # Backoff 0-2 s plus a claim and a fire; a retry timed by the host's clock would be 20 s off.
    assert 0 <= (tries[1] - tries[0]).total_seconds() <= 8, f"the retry came {tries[1] - tries[0]} after"
