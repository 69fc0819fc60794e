"""Poison jobs among thousands of good ones: a target that always answers 4xx (no retry, each
occurrence dead-lettered at once) and one that answers 503 forever (retried to the end). They
dead-letter; every good run is delivered. The good runs' lateness with and without the poison is
printed (a figure, not an assertion: speed is for benchmarks)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from loadtest.common import quantiles
from tests.faults.harness import (
    NodeProc,
    Owner,
    account,
    env_int,
    every_second,
    expected_for,
    node_env,
    one_off,
    owner_on,
    seeded,
    whole_second,
)
from tests.faults.recorder import RecorderProcess

pytestmark = pytest.mark.timeout(200)
GOOD = env_int("DUETIME_FAULT_POISON_GOOD", 800)
WINDOW_S = 4


async def _phase(
    owner: Owner, recorder: RecorderProcess, rng: Any, tag: str, poison: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, float], float]:
    start = whole_second(3 + GOOD / 300)
    end = start + timedelta(seconds=WINDOW_S)
    good_specs = [
        one_off(f"{recorder.url}/ok/{tag}", start + timedelta(seconds=rng.uniform(0, WINDOW_S)))
        for _ in range(GOOD)
    ]
    bad_specs: list[dict[str, Any]] = []
    if poison:
        bad_specs += [every_second(f"{recorder.url}/status/400/{tag}", start, end) for _ in range(10)]
        bad_specs += [
            one_off(
                f"{recorder.url}/status/503/{tag}", start, retry={"max_attempts": 4, "backoff_initial_s": 0.2}
            )
            for _ in range(10)
        ]
    specs = good_specs + bad_specs
    rng.shuffle(specs)
    created = await owner.create_many(specs)
    await owner.settle(within=90)
    good = [j for j in created if "/ok/" in j["target"]["url"]]
    bad = [j for j in created if "/ok/" not in j["target"]["url"]]
    good_ids = {j["id"] for j in good}
    calls = [r for r in recorder.records() if r.job_id in good_ids]
    late_ms = [(r.arrived - r.scheduled_for).total_seconds() * 1000 for r in calls]
    span = (max(r.arrived for r in calls) - min(r.arrived for r in calls)).total_seconds()
    return good, bad, quantiles(late_ms), len(calls) / max(span, 1e-3)


async def test_poison_jobs_dead_letter_and_the_rest_are_delivered(
    fault_db: str, api: NodeProc, recorder: RecorderProcess, tmp_path: Path
) -> None:
    _seed, rng = seeded("poison")
    node = NodeProc(
        node_env(fault_db, DUETIME_ENGINE_ID=f"poison-{uuid.uuid4().hex[:6]}"), "engine", tmp_path / "e.log"
    )
    try:
        await node.ready()
        async with owner_on(api.url, fault_db) as owner:
            _, _, clean_late, clean_rate = await _phase(owner, recorder, rng, "clean", poison=False)
            good, bad, late, rate = await _phase(owner, recorder, rng, "poisoned", poison=True)
            expected = [e for job in good + bad for e in expected_for(job)]
            report = await account(owner, recorder, expected)
            views = await owner.views(j["id"] for j in bad)
    finally:
        await node.stop()
    print(
        json.dumps(
            {
                "scenario": "poison",
                "good_runs": GOOD,
                "lateness_ms_without_poison": {k: round(v, 1) for k, v in clean_late.items()},
                "lateness_ms_with_poison": {k: round(v, 1) for k, v in late.items()},
                "good_calls_per_s_without": round(clean_rate),
                "good_calls_per_s_with": round(rate),
                **report.counts(),
            }
        )
    )
    assert report.ok, report.explain()
    assert len(report.buckets["delivered"]) == GOOD
    poisoned = {j["id"] for j in bad}
    assert {occ[0] for occ in report.buckets["dead_lettered"]} == poisoned
    for job in bad:
        view = views[job["id"]]
        if "/status/400/" in job["target"]["url"]:
            assert view.state == "completed"  # a cron goes on after each dead-lettered occurrence
            assert {(r.attempt, r.outcome, r.status_code) for r in view.history} == {(1, "failed", 400)}
        else:
            assert view.state == "dead"
            assert sorted(r.attempt for r in view.history) == [1, 2, 3, 4]
