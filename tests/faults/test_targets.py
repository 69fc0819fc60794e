"""Targets that misbehave: hang, reset the connection, answer 503 forever, or answer 2xx only
after the job's timeout. Each is retried exactly as its policy says, then dead-lettered, and the
checker accounts for every call: the late 2xx counts as delivered (the target did the work) and
its repeats as duplicates attributed to the timeouts the scheduler saw."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import (
    NodeProc,
    account,
    expected_for,
    node_env,
    one_off,
    owner_on,
    seeded,
    whole_second,
)
from tests.faults.recorder import RecorderProcess

pytestmark = pytest.mark.timeout(150)
ATTEMPTS = 3

# path, timeout_s, the outcome every attempt must have, the bucket the checker must choose
BEHAVIOURS: dict[str, tuple[str, int, str, str]] = {
    "hang": ("/hang", 1, "timed_out", "dead_lettered"),
    "reset": ("/reset", 5, "failed", "dead_lettered"),
    "503 forever": ("/status/503", 5, "failed", "dead_lettered"),
    "2xx after the timeout": ("/slow/1.6", 1, "timed_out", "delivered"),
}


async def test_misbehaving_targets_are_retried_then_dead_lettered(
    fault_db: str, api: NodeProc, recorder: RecorderProcess, tmp_path: Path
) -> None:
    _seed, rng = seeded("targets")
    # Every behaviour is a path of one recorder, so one host: its health would back the host
    # off after a few timeouts and hold the rest (tests/processes/test_noisy_hosts.py tests that).
    # Here each behaviour's retries are the point, so the host is never backed off.
    env = node_env(
        fault_db, DUETIME_ENGINE_ID=f"targets-{uuid.uuid4().hex[:6]}", DUETIME_TARGET_BACKOFF_AFTER="1000000"
    )
    node = NodeProc(env, "engine", tmp_path / "e.log")
    try:
        await node.ready()
        async with owner_on(api.url, fault_db) as owner:
            due = whole_second(2)
            jobs: dict[str, list[dict[str, Any]]] = {}
            for name, (path, timeout_s, _, _) in BEHAVIOURS.items():
                spec = one_off(
                    f"{recorder.url}{path}/{name.replace(' ', '-')}",
                    due,
                    retry={"max_attempts": ATTEMPTS, "backoff_initial_s": 0.1, "backoff_max_s": 0.3},
                )
                spec["target"]["timeout_s"] = timeout_s
                jobs[name] = await owner.create_many([spec] * rng.randint(3, 6))
            good = await owner.create_many([one_off(recorder.url + "/ok", due)] * 20)
            await owner.settle(within=60)
            created = [job for group in jobs.values() for job in group] + good
            expected = [e for job in created for e in expected_for(job)]
            report = await account(owner, recorder, expected)
            views = await owner.views(job["id"] for job in created)
    finally:
        await node.stop()
    print(json.dumps({"scenario": "targets", **report.counts(), **report.attribution()}))
    assert report.ok, report.explain()
    for name, (_, _, outcome, bucket) in BEHAVIOURS.items():
        for job in jobs[name]:
            view = views[job["id"]]
            assert view.state == "dead", (name, view.state)
            assert [(r.attempt, r.outcome) for r in sorted(view.history, key=lambda r: r.attempt)] == [
                (n, outcome) for n in range(1, ATTEMPTS + 1)
            ], name
            assert (job["id"], expected_for(job)[0].scheduled_for) in report.buckets[bucket], name
            calls = [r for r in recorder.records() if r.job_id == job["id"]]
            assert sorted(r.attempt for r in calls) == list(range(1, ATTEMPTS + 1)), name
    assert {views[j["id"]].state for j in good} == {"completed"}
    late = len(jobs["2xx after the timeout"])
    assert len(report.duplicates) == late * (ATTEMPTS - 1)
    assert report.attribution() == {"outcome unknown": late * (ATTEMPTS - 1)}
