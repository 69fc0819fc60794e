"""Retries bounded by time and by the target's Retry-After, end to end on a real node."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from tests.support.node import Owner, at
from tests.support.receiver import Receiver


async def test_retry_after_on_a_503_spaces_the_next_attempt(owner: Owner, receiver: Receiver) -> None:
    receiver.behaviour["/busy"] = lambda n: 503 if n == 1 else 200
    receiver.headers["/busy"] = {"Retry-After": "3"}
    job = await owner.create(
        {
            "target": {"type": "webhook", "url": f"{receiver.url}/busy"},
            "schedule": {"run_at": at(1)},
            # without the header the retry would come within 0.2 s
            "retry": {"max_attempts": 3, "backoff_initial_s": 0.2, "backoff_max_s": 10},
        }
    )
    first, second = await receiver.wait_for("/busy", 2, within=20)
    gap = second.arrived - first.arrived
    assert gap >= timedelta(seconds=3), gap
    assert gap < timedelta(seconds=5), gap  # the floor, not the backoff's ceiling of 10 s
    for _ in range(50):
        runs = await owner.runs(job["id"])
        if len(runs) == 2:
            break
        await asyncio.sleep(0.1)
    assert [(r["attempt"], r["outcome"], r["status_code"]) for r in reversed(runs)] == [
        (1, "failed", 503),
        (2, "succeeded", 200),
    ]


async def test_a_retry_after_past_backoff_max_is_capped(owner: Owner, receiver: Receiver) -> None:
    receiver.behaviour["/capped"] = lambda n: 429 if n == 1 else 200
    receiver.headers["/capped"] = {"Retry-After": "3600"}
    await owner.create(
        {
            "target": {"type": "webhook", "url": f"{receiver.url}/capped"},
            "schedule": {"run_at": at(1)},
            "retry": {"max_attempts": 3, "backoff_initial_s": 0.1, "backoff_max_s": 2},
        }
    )
    first, second = await receiver.wait_for("/capped", 2, within=20)
    assert timedelta(seconds=2) <= second.arrived - first.arrived < timedelta(seconds=4)


async def test_max_duration_dead_letters_the_occurrence(owner: Owner, receiver: Receiver) -> None:
    receiver.behaviour["/down"] = lambda n: 500
    job = await owner.create(
        {
            "target": {"type": "webhook", "url": f"{receiver.url}/down"},
            "schedule": {"run_at": at(1)},
            "retry": {
                "max_attempts": 100,
                "backoff_initial_s": 0.5,
                "backoff_max_s": 0.5,
                "max_duration_s": 3,
            },
        }
    )
    assert job["retry"]["max_duration_s"] == 3
    await receiver.wait_for("/down", 2, within=20)
    for _ in range(100):
        _, got = await owner.call("GET", f"/v1/jobs/{job['id']}")
        if got["state"] == "dead":
            break
        await asyncio.sleep(0.2)
    assert got["state"] == "dead", got
    calls = receiver.on("/down")
    first_due = calls[0].arrived
    # no attempt started later than 3 s after the occurrence was due (plus the run path's slack)
    assert all(c.arrived - first_due < timedelta(seconds=3.5) for c in calls), [c.arrived for c in calls]
    assert 2 <= len(calls) < 100
    runs = await owner.runs(job["id"])
    assert runs[0]["error"] == "retry window exceeded" and runs[0]["status_code"] == 500
    assert all(r["error"] == "HTTP 500" for r in runs[1:])
