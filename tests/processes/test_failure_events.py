"""Failure handling end to end on a running node: a target that fails three occurrences in a row
(retries off, an every-second schedule) makes the job send exactly one ``job.failing``, then
pause itself at ``pause_after_failures: 3`` with ``job.paused``; after a resume and a success it
sends ``job.recovered``. Each event is signed with the owner's secret, carries
``Duetime-Event``, and keeps its ``webhook-id`` over the retries of its delivery."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from duetime.core.signing import verify_signature
from tests.support.node import Owner
from tests.support.receiver import Call, Receiver


def _checked(owner: Owner, job_id: str, call: Call) -> dict[str, object]:
    """The event a call delivered, after checking its signature and headers against its body."""
    body = json.loads(call.body)
    h = call.headers
    assert verify_signature(owner.secret, h, call.body), h
    assert h["Duetime-Event"] == body["type"]
    assert h["webhook-id"] == f"{job_id}:{body['scheduled_for']}:{body['type']}"
    assert h["Idempotency-Key"] == h["webhook-id"]
    assert h["Duetime-Job-Id"] == job_id and h["Duetime-Scheduled-For"] == body["scheduled_for"]
    assert h["X-Ops"] == "pager"
    return body  # type: ignore[no-any-return]


async def test_failing_paused_recovered_each_signed_once(owner: Owner, receiver: Receiver) -> None:
    # The run target fails its first three calls, then succeeds; the event target refuses the
    # first delivery (503: retried by the default policy), then takes every event.
    receiver.behaviour["/run"] = lambda n: 500 if n <= 3 else 200
    receiver.behaviour["/events"] = lambda n: 503 if n == 1 else 200
    job = await owner.create(
        {
            "name": "failing-" + owner.name,
            "labels": {"team": "ops"},
            "target": {"type": "webhook", "url": receiver.url + "/run"},
            "schedule": {"every": "1s"},
            "retry": {"max_attempts": 1},
            "overlap": "skip",
            "on_failure": {
                "target": {"type": "webhook", "url": receiver.url + "/events", "headers": {"X-Ops": "pager"}}
            },
            "pause_after_failures": 3,
        }
    )
    jid = job["id"]
    assert job["on_failure"]["after"] == 1 and job["pause_after_failures"] == 3
    assert job["on_failure"]["target"]["headers"] == {"X-Ops": "<redacted>"}

    calls = await receiver.wait_for("/events", 3, within=30)  # 503 + job.failing, job.paused
    first = calls[0]  # job.failing, refused: the only event there is until the third failure
    assert first.status == 503
    # The retry of job.failing and job.paused come in either order (ordering is not promised).
    by_type = {json.loads(c.body)["type"]: c for c in calls[1:3]}
    retried, paused_call = by_type["job.failing"], by_type["job.paused"]
    assert retried.status == 200 and paused_call.status == 200
    assert first.headers["webhook-id"] == retried.headers["webhook-id"]  # stable over retries
    assert first.body == retried.body
    assert (first.headers["Duetime-Attempt"], retried.headers["Duetime-Attempt"]) == ("1", "2")
    failing = _checked(owner, jid, retried)
    paused = _checked(owner, jid, paused_call)
    assert failing["type"] == "job.failing" and failing["consecutive_failures"] == 1
    assert failing["name"] == "failing-" + owner.name and failing["labels"] == {"team": "ops"}
    assert failing["outcome"] == "failed" and failing["status_code"] == 500 and failing["attempts"] == 1
    assert paused["type"] == "job.paused" and paused["consecutive_failures"] == 3
    _, got = await owner.call("GET", f"/v1/jobs/{jid}")
    assert got["state"] == "paused"
    await asyncio.sleep(2.5)  # no run starts while paused, and no second job.failing
    assert len(receiver.on("/run")) == 3
    assert len(receiver.on("/events")) == 3

    status, _ = await owner.call("POST", f"/v1/jobs/{jid}/resume")
    assert status == 200
    calls = await receiver.wait_for("/events", 4, within=30)
    recovered = _checked(owner, jid, calls[3])
    assert recovered["type"] == "job.recovered" and recovered["consecutive_failures"] == 0
    assert recovered["outcome"] == "succeeded"
    await asyncio.sleep(2.5)  # later successes send nothing
    kinds = [json.loads(c.body)["type"] for c in receiver.on("/events") if c.status == 200]
    assert sorted(kinds) == ["job.failing", "job.paused", "job.recovered"]  # each exactly once
    # and the job runs on after the resume (every second: waited for, not counted once)
    await receiver.wait_for("/run", 5, within=30)


@pytest.mark.redis
async def test_a_failure_event_to_a_redis_stream_carries_the_run_fields_and_its_type(
    owner: Owner, receiver: Receiver
) -> None:
    key = "duetime-test-events-" + uuid.uuid4().hex[:8]
    receiver.behaviour["/run"] = lambda _n: 404  # a failure that is not retried
    job = await owner.create(
        {
            "target": {"type": "webhook", "url": receiver.url + "/run"},
            "schedule": {"every": "1h"},
            "on_failure": {"target": {"type": "queue", "broker": "redis", "topic": key}},
        }
    )
    r = aioredis.from_url("redis://127.0.0.1:6379/0")
    try:
        entries: list[Any] = []
        for _ in range(300):
            entries = list(await r.xrange(key) or [])
            if entries:
                break
            await asyncio.sleep(0.05)
        [(_, fields)] = entries
        f = {str(k, "utf-8"): str(v, "utf-8") for k, v in fields.items()}
        body = json.loads(f["payload"])
        assert body["type"] == "job.failing" and body["status_code"] == 404
        assert f["duetime_event"] == "job.failing"
        assert f["idempotency_key"] == f"{job['id']}:{body['scheduled_for']}:job.failing"
        assert f["duetime_job_id"] == job["id"] and f["duetime_scheduled_for"] == body["scheduled_for"]
        assert f["duetime_attempt"] == "1"
    finally:
        await r.delete(key)
        await r.aclose()
