"""POST /v1/jobs/{id}/replay with a scheduled_for: one failed occurrence of a recurring job runs
once more, now, under its own Idempotency-Key; anything else is refused."""

from __future__ import annotations

import asyncio

from tests.support.node import Owner
from tests.support.receiver import Receiver


async def test_a_failed_occurrence_runs_once_more(owner: Owner, receiver: Receiver) -> None:
    receiver.behaviour["/flaky"] = lambda n: 404 if n == 1 else 200  # a 404 is not retried
    job = await owner.create(
        {"target": {"type": "webhook", "url": f"{receiver.url}/flaky"}, "schedule": {"every": "1h"}}
    )
    [first] = await receiver.wait_for("/flaky", 1, within=15)
    occurrence = first.headers["Duetime-Scheduled-For"]
    for _ in range(50):
        runs = await owner.runs(job["id"])
        if runs:
            break
        await asyncio.sleep(0.1)
    assert (runs[0]["outcome"], runs[0]["status_code"]) == ("failed", 404)

    path = f"/v1/jobs/{job['id']}/replay"
    status, body = await owner.call("POST", path, {"scheduled_for": "2000-01-01T00:00:00Z"})
    assert (status, body["error"]["code"]) == (409, "occurrence_not_failed"), body
    status, body = await owner.call("POST", path, {"scheduled_for": occurrence})
    assert status == 202, body
    assert body["id"] == job["id"] and body["state"] == "scheduled"
    _, second = await receiver.wait_for("/flaky", 2, within=15)
    assert second.headers["Duetime-Scheduled-For"] == occurrence
    assert (
        second.headers["Idempotency-Key"] == first.headers["Idempotency-Key"] == f"{job['id']}:{occurrence}"
    )
    assert second.headers["Duetime-Job-Id"] == job["id"]
    for _ in range(50):
        runs = await owner.runs(job["id"])
        if len(runs) == 2:
            break
        await asyncio.sleep(0.1)
    assert [(r["scheduled_for"], r["outcome"]) for r in runs] == [
        (occurrence, "succeeded"),
        (occurrence, "failed"),
    ]
    status, body = await owner.call("POST", path, {"scheduled_for": occurrence})
    assert (status, body["error"]["code"]) == (409, "occurrence_not_failed"), body

    # one view of what failed: the owner's runs across jobs, each with its job_id
    status, page = await owner.call("GET", "/v1/runs?outcome=failed&limit=10")
    assert status == 200, page
    assert [(r["job_id"], r["scheduled_for"], r["status_code"]) for r in page["items"]] == [
        (job["id"], occurrence, 404)
    ]
    status, page = await owner.call("GET", "/v1/runs")
    assert status == 200 and [r["outcome"] for r in page["items"]] == ["succeeded", "failed"]
    status, page = await owner.call("GET", "/v1/runs?since=2999-01-01T00:00:00Z")
    assert (status, page["items"], page["next_cursor"]) == (200, [], None)
    for query, field in (("outcome=broken", "outcome"), ("since=yesterday", "since"), ("limit=0", "limit")):
        status, body = await owner.call("GET", f"/v1/runs?{query}")
        assert (status, body["error"]["field"]) == (422, field), body

    status, body = await owner.call("POST", path, {"scheduled_for": "yesterday"})
    assert (status, body["error"]["field"]) == (422, "scheduled_for"), body
    status, body = await owner.call("POST", path, {"when": occurrence})
    assert (status, body["error"]["code"]) == (422, "unknown_field"), body
    status, body = await owner.call("POST", path)  # no body: the dead-job replay, 409 for this one
    assert status == 409, body
    await owner.call("DELETE", f"/v1/jobs/{job['id']}")


async def test_replays_are_capped_per_job(owner: Owner, receiver: Receiver) -> None:
    """Issue 32, item 1: 1,105 replays of one failed occurrence all answered 202 and ran at once.
    At most DUETIME_MAX_PENDING_TRIGGERS (100) replayed runs now wait per job; under
    ``overlap: skip`` they run one after another (tests/contract: one at a time)."""
    receiver.behaviour["/gone"] = lambda n: 404  # never retried: each replay is one call
    job = await owner.create(
        {
            "target": {"type": "webhook", "url": f"{receiver.url}/gone"},
            "schedule": {"every": "1h"},
            "overlap": "skip",
        }
    )
    [first] = await receiver.wait_for("/gone", 1, within=15)
    occurrence = first.headers["Duetime-Scheduled-For"]
    for _ in range(100):
        if await owner.runs(job["id"]):
            break
        await asyncio.sleep(0.1)
    path = f"/v1/jobs/{job['id']}/replay"
    answers = await asyncio.gather(
        *(owner.call("POST", path, {"scheduled_for": occurrence}) for _ in range(130))
    )
    statuses = [status for status, _ in answers]
    refused = [body["error"]["code"] for status, body in answers if status == 409]
    assert statuses.count(202) >= 100 and refused, statuses
    assert set(refused) == {"too_many_replays"}, refused
