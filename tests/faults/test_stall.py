"""SIGSTOP of a node with calls in flight, past its lease, then SIGCONT.

While the node is frozen its heartbeats stop, its leases lapse, and another engine records the
attempts as ``lease_expired`` and runs them again under larger fencing tokens. When the frozen
node wakes up and reports its (now stale) outcomes, every one must be rejected and counted on
its ``/metrics`` (``duetime_stale_completions_total``), and no run may be finalised twice: each
history holds one success, by the holder of the current lease.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path

import asyncpg
import pytest

from tests.faults.harness import (
    NodeProc,
    account,
    expected_for,
    metric,
    node_env,
    one_off,
    owner_on,
    seeded,
    whole_second,
)
from tests.faults.recorder import RecorderProcess

pytestmark = pytest.mark.timeout(150)
JOBS = 40


async def test_a_stalled_nodes_late_completions_are_rejected_and_counted(
    fault_db: str, api: NodeProc, recorder: RecorderProcess, tmp_path: Path
) -> None:
    _seed, rng = seeded("stall")
    call_s = round(rng.uniform(1.5, 2.5), 2)
    frozen_id = f"frozen-{uuid.uuid4().hex[:6]}"
    frozen = NodeProc(node_env(fault_db, DUETIME_ENGINE_ID=frozen_id), "engine", tmp_path / "frozen.log")
    other: NodeProc | None = None
    try:
        await frozen.ready()
        async with owner_on(api.url, fault_db) as owner:
            due = whole_second(2)
            created = await owner.create_many(
                one_off(recorder.url + f"/slow/{call_s}", due) for _ in range(JOBS)
            )
            await recorder.wait_for(JOBS, within=30)  # every call is in flight on the frozen node
            frozen.signal(signal.SIGSTOP)
            other = NodeProc(
                node_env(fault_db, DUETIME_ENGINE_ID=f"other-{uuid.uuid4().hex[:6]}"),
                "engine",
                tmp_path / "other.log",
            )
            await other.ready()
            await owner.settle(within=60)  # the other engine finished every run
            frozen.signal(signal.SIGCONT)
            stale = 0.0
            for _ in range(100):
                stale = await metric(frozen.url, "duetime_stale_completions_total")
                if stale >= JOBS:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # anything else the woken node might still write
            stale = await metric(frozen.url, "duetime_stale_completions_total")
            applied = await metric(frozen.url, "duetime_completions_total")
            expected = [e for job in created for e in expected_for(job)]
            report = await account(owner, recorder, expected)
            views = await owner.views(j["id"] for j in created)
        conn = await asyncpg.connect(fault_db)
        try:
            tokens = await conn.fetch(
                "SELECT job_id, outcome, fencing_token FROM runs WHERE job_id = ANY($1::uuid[])",
                [uuid.UUID(j["id"]) for j in created],
            )
        finally:
            await conn.close()
    finally:
        await frozen.stop()
        if other is not None:
            await other.stop()
    print(
        json.dumps(
            {"scenario": "stall", "stale_completions": stale, "stale_expected": JOBS, **report.counts()}
        )
    )
    assert report.ok, report.explain()
    assert stale == JOBS, "every late completion of the woken node was rejected and counted"
    assert applied == 0, "the woken node recorded nothing"
    for view in views.values():
        attempts = sorted((run.attempt, run.outcome) for run in view.history)
        assert attempts == [(1, "lease_expired"), (2, "succeeded")], attempts
        assert view.state == "completed"
    by_job: dict[uuid.UUID, dict[str, int]] = {}
    for row in tokens:
        by_job.setdefault(row["job_id"], {})[row["outcome"]] = row["fencing_token"]
    for outcomes in by_job.values():
        assert outcomes["succeeded"] > outcomes["lease_expired"], "the success came under a newer lease"
    assert report.duplicates and not report.unattributed
