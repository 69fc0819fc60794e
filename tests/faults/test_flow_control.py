"""Flow control across two worker processes (issue 28): all of an owner's jobs with one flow key
share its rate and its parallelism across the cluster, within 10 %; runs over the limits wait,
use no attempt and are not failed; nothing is lost or doubled.

Two nodes serve the shards between them (the dealing), each calling its own shards' runs, so the
key's limits hold only if the workers share them through the database."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

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
from tests.faults.recorder import RecorderProcess

pytestmark = pytest.mark.timeout(240)

RATE = 20.0
RATE_RUNS = 300  # 15 s at the key's rate
PARALLELISM = 4
SLOW_S = 1
PARALLEL_RUNS = 40  # 10 s at 4 at a time


async def _nodes(fault_db: str, tmp_path: Path) -> list[NodeProc]:
    nodes = [
        NodeProc(
            node_env(
                fault_db, DUETIME_ENGINE_ID=f"flow-{i}-{uuid.uuid4().hex[:6]}", DUETIME_SHARD_REPLICAS="1"
            ),
            "engine",
            tmp_path / f"e{i}.log",
        )
        for i in range(2)
    ]
    await asyncio.gather(*(n.ready() for n in nodes))
    return nodes


async def test_a_flow_keys_rate_and_parallelism_hold_across_two_workers(
    fault_db: str, api: NodeProc, recorder: RecorderProcess, tmp_path: Path
) -> None:
    nodes = await _nodes(fault_db, tmp_path)
    try:
        async with owner_on(api.url, fault_db) as owner, owner_on(api.url, fault_db) as other:
            due = whole_second(6)
            rated = one_off(f"{recorder.url}/ok/rated", due)
            rated["target"]["flow"] = {"key": "shared", "rate_per_s": RATE, "parallelism": 1000}
            parallel = one_off(f"{recorder.url}/slow/{SLOW_S}/parallel", due + timedelta(seconds=1))
            parallel["target"]["flow"] = {"key": "narrow", "rate_per_s": 1000, "parallelism": PARALLELISM}
            # another owner's key of the same name: its own limits, not the first owner's
            theirs = one_off(f"{recorder.url}/ok/theirs", due)
            theirs["target"]["flow"] = {"key": "shared", "rate_per_s": 1000, "parallelism": 1000}
            jobs: list[dict[str, Any]] = await owner.create_many([rated] * RATE_RUNS)
            jobs += await owner.create_many([parallel] * PARALLEL_RUNS)
            their_jobs = await other.create_many([theirs] * 50)
            await owner.settle(within=120)
            await other.settle(within=30)
            report = await account(owner, recorder, [e for j in jobs for e in expected_for(j)])
            their_report = await account(other, recorder, [e for j in their_jobs for e in expected_for(j)])
            views = await owner.views(j["id"] for j in jobs)
            calls_by_node = [await metric(n.url, "duetime_calls_total") for n in nodes]
    finally:
        await asyncio.gather(*(n.stop() for n in nodes))
    assert report.ok and not report.duplicates, report.explain()
    assert their_report.ok and not their_report.duplicates, their_report.explain()
    # waiting for the key used no attempt
    assert all([r.attempt for r in v.history] == [1] for v in views.values())
    assert all(n > 0 for n in calls_by_node), calls_by_node  # both workers called: shared limits
    calls = recorder.records()
    rated_at = sorted(c.arrived for c in calls if c.path.startswith("/ok/rated"))
    span = (rated_at[-1] - rated_at[0]).total_seconds()
    # The bucket holds at most a tenth of a second's worth, so the first call is free.
    rate = (len(rated_at) - 1) / span
    their_last = max(c.arrived for c in calls if c.path.startswith("/ok/theirs"))
    starts = sorted(c.arrived for c in calls if c.path.startswith("/slow"))
    most = max(sum(1 for s in starts if t <= s < t + timedelta(seconds=SLOW_S * 0.9)) for t in starts)
    print(json.dumps({"scenario": "flow control", "rate_per_s": rate, "most_at_once": most}))
    assert abs(rate - RATE) <= 0.1 * RATE, f"{rate:.2f} calls/s for a key limited to {RATE}/s"
    assert most <= PARALLELISM, f"{most} calls at once for a key limited to {PARALLELISM}"
    assert most == PARALLELISM  # and the limit is used, not just respected
    # the other owner's key of the same name was not held to the first owner's rate
    assert (their_last - due).total_seconds() < 5
