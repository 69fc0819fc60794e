"""The run path end to end, in one process, on real PostgreSQL, Redis and NATS: a job goes in
through the HTTP API and comes out at a loopback receiver or a broker."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from datetime import UTC, datetime, timedelta

import nats
import pytest
import redis.asyncio as aioredis

from duetime.app import Node
from duetime.core.signing import verify_signature
from tests.support.node import Owner, at, fast_settings, parse
from tests.support.receiver import Receiver


def webhook(receiver: Receiver, path: str, **extra: object) -> dict[str, object]:
    return {"type": "webhook", "url": receiver.url + path, **extra}


async def test_one_off_fires_within_its_second_with_contract_headers(
    owner: Owner, receiver: Receiver
) -> None:
    run_at = at(2)
    job = await owner.create(
        {
            "target": webhook(receiver, "/one", headers={"X-Team": "blue"}),
            "payload": {"hello": "world"},
            "schedule": {"run_at": run_at},
        }
    )
    [call] = await receiver.wait_for("/one", 1, within=15)
    due = parse(run_at)
    assert due <= call.arrived < due + timedelta(seconds=1), (call.arrived, due)
    h = call.headers
    assert h["Idempotency-Key"] == f"{job['id']}:{run_at}"
    assert h["Duetime-Job-Id"] == job["id"]
    assert h["Duetime-Scheduled-For"] == run_at
    assert h["Duetime-Attempt"] == "1"
    assert int(h["Duetime-Fencing-Token"]) >= 1
    assert h["X-Team"] == "blue"
    assert json.loads(call.body) == {"hello": "world"}
    assert verify_signature(owner.secret, h, call.body)
    # the outcome is recorded: job completed, history has the run with its lateness
    for _ in range(100):
        _status, got = await owner.call("GET", f"/v1/jobs/{job['id']}")
        if got["state"] == "completed":
            break
        await asyncio.sleep(0.05)
    assert got["state"] == "completed", got
    _, runs = await owner.call("GET", f"/v1/jobs/{job['id']}/runs")
    [run] = runs["items"]
    assert run["outcome"] == "succeeded" and run["status_code"] == 200 and run["attempt"] == 1
    assert 0 <= run["lateness_ms"] < 1000


async def test_run_at_two_seconds_ahead_reaches_the_wheel_without_waiting_for_a_poll(
    pg_dsn: str, receiver: Receiver
) -> None:
    """With a 30 s poll interval, only LISTEN/NOTIFY can make this fire on time."""
    import aiohttp

    node = Node(fast_settings(pg_dsn, poll_interval_s=30.0))
    await node.start()
    try:
        assert node.store is not None and node.url is not None
        key, _ = await node.store.create_api_key("notify_" + uuid.uuid4().hex[:6])
        async with aiohttp.ClientSession() as http:
            o = Owner("n", key, "", http, node.url)
            await asyncio.sleep(0.5)  # let the first (empty) claim pass
            run_at = at(2)
            await o.create({"target": webhook(receiver, "/notify"), "schedule": {"run_at": run_at}})
            [call] = await receiver.wait_for("/notify", 1, within=10)
            assert call.arrived < parse(run_at) + timedelta(seconds=1)
            await o.cancel_all()
    finally:
        await node.stop()


async def test_every_second_cron_fires_each_second_in_order_without_drift(
    owner: Owner, receiver: Receiver
) -> None:
    job = await owner.create(
        {
            "target": webhook(receiver, "/cron"),
            "schedule": {"cron": "* * * * * *", "timezone": "Europe/Berlin"},
        }
    )
    calls = await receiver.wait_for("/cron", 60, within=80)  # a whole minute, second by second
    await owner.call("DELETE", f"/v1/jobs/{job['id']}")
    slots = [parse(c.headers["Duetime-Scheduled-For"]) for c in calls[:60]]
    assert len(slots) == len(set(slots)) == 60
    assert slots == sorted(slots)
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(slots)), slots
    for c, slot in zip(calls, slots, strict=False):
        assert slot <= c.arrived < slot + timedelta(seconds=1), (slot, c.arrived)


async def test_retries_keep_the_key_and_follow_the_backoff_then_dead_letter(
    owner: Owner, receiver: Receiver
) -> None:
    receiver.behaviour["/flaky"] = lambda n: 503
    job = await owner.create(
        {
            "target": webhook(receiver, "/flaky"),
            "schedule": {"run_at": at(0)},
            "retry": {"max_attempts": 3, "backoff_initial_s": 0.2, "backoff_max_s": 0.5},
        }
    )
    calls = await receiver.wait_for("/flaky", 3, within=20)
    keys = {c.headers["Idempotency-Key"] for c in calls}
    assert len(keys) == 1
    assert [c.headers["Duetime-Attempt"] for c in calls] == ["1", "2", "3"]
    tokens = [int(c.headers["Duetime-Fencing-Token"]) for c in calls]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    gaps = [(b.arrived - a.arrived).total_seconds() for a, b in itertools.pairwise(calls)]
    assert all(g < 3.0 for g in gaps), gaps  # full jitter under a 0.5 s cap, plus the poll
    for _ in range(100):
        _, got = await owner.call("GET", f"/v1/jobs/{job['id']}")
        if got["state"] == "dead":
            break
        await asyncio.sleep(0.05)
    assert got["state"] == "dead" and got["attempt"] == 3
    _, listed = await owner.call("GET", "/v1/jobs?state=dead")
    assert job["id"] in {j["id"] for j in listed["items"]}
    # replay: back to scheduled, runs now, attempts reset
    receiver.behaviour["/flaky"] = lambda n: 200
    status, replayed = await owner.call("POST", f"/v1/jobs/{job['id']}/replay")
    assert status == 200 and replayed["state"] == "scheduled" and replayed["attempt"] == 0
    calls = await receiver.wait_for("/flaky", 4, within=15)
    assert calls[3].headers["Duetime-Attempt"] == "1"
    assert calls[3].headers["Idempotency-Key"] == calls[0].headers["Idempotency-Key"]


async def test_a_400_dead_letters_at_once(owner: Owner, receiver: Receiver) -> None:
    receiver.behaviour["/bad"] = lambda n: 400
    job = await owner.create({"target": webhook(receiver, "/bad"), "schedule": {"run_at": at(0)}})
    await receiver.wait_for("/bad", 1)
    for _ in range(100):
        _, got = await owner.call("GET", f"/v1/jobs/{job['id']}")
        if got["state"] == "dead":
            break
        await asyncio.sleep(0.05)
    assert got["state"] == "dead" and got["attempt"] == 1
    await asyncio.sleep(1.5)
    assert len(receiver.on("/bad")) == 1
    _, runs = await owner.call("GET", f"/v1/jobs/{job['id']}/runs")
    assert runs["items"][0]["outcome"] == "failed" and runs["items"][0]["status_code"] == 400


async def test_cancel_and_pause_stop_a_job_already_in_the_wheel(
    node: Node, owner: Owner, receiver: Receiver
) -> None:
    a = await owner.create({"target": webhook(receiver, "/cancel"), "schedule": {"run_at": at(3)}})
    b = await owner.create({"target": webhook(receiver, "/pause"), "schedule": {"run_at": at(3)}})
    assert node._engine is not None
    for _ in range(100):  # both claimed into the wheel (lookahead 60 s)
        if node._engine.waiting_runs >= 2:
            break
        await asyncio.sleep(0.05)
    assert node._engine.waiting_runs >= 2
    status, cancelled = await owner.call("DELETE", f"/v1/jobs/{a['id']}")
    assert status == 200 and cancelled["state"] == "cancelled"
    status, paused = await owner.call("POST", f"/v1/jobs/{b['id']}/pause")
    assert status == 200 and paused["state"] == "paused"
    await asyncio.sleep(4.5)
    assert receiver.on("/cancel") == [] and receiver.on("/pause") == []
    # resume: the occurrence missed while paused is within its grace, so it runs now
    status, resumed = await owner.call("POST", f"/v1/jobs/{b['id']}/resume")
    assert status == 200 and resumed["state"] == "scheduled"
    await receiver.wait_for("/pause", 1, within=10)


async def test_trigger_runs_now_besides_the_schedule(owner: Owner, receiver: Receiver) -> None:
    job = await owner.create({"target": webhook(receiver, "/trig"), "schedule": {"cron": "0 0 1 1 *"}})
    status, _ = await owner.call("POST", f"/v1/jobs/{job['id']}/trigger")
    assert status == 202
    [call] = await receiver.wait_for("/trig", 1, within=10)
    for _ in range(100):
        _, got = await owner.call("GET", f"/v1/jobs/{job['id']}")
        if got["last_run"] is not None:
            break
        await asyncio.sleep(0.05)
    assert got["last_run"]["outcome"] == "succeeded"
    assert got["next_run_at"] == job["next_run_at"]  # the regular schedule is untouched
    assert call.headers["Duetime-Scheduled-For"] != job["next_run_at"]


@pytest.mark.redis
async def test_redis_stream_target_receives_message_with_fields(owner: Owner) -> None:
    key = "duetime-test-" + uuid.uuid4().hex[:8]
    job = await owner.create(
        {
            "target": {"type": "queue", "broker": "redis", "topic": key},
            "payload": {"n": 1},
            "schedule": {"run_at": at(0)},
        }
    )
    r = aioredis.from_url("redis://127.0.0.1:6379/0")
    try:
        for _ in range(200):
            entries = await r.xrange(key)
            if entries:
                break
            await asyncio.sleep(0.05)
        [(_, fields)] = entries  # type: ignore[misc]
        f = {str(k, "utf-8"): str(v, "utf-8") for k, v in fields.items()}  # type: ignore[union-attr, arg-type]
        assert json.loads(f["payload"]) == {"n": 1}
        assert f["idempotency_key"].startswith(job["id"] + ":")
        assert f["duetime_attempt"] == "1"
    finally:
        await r.delete(key)
        await r.aclose()


@pytest.mark.nats
async def test_nats_jetstream_target_receives_message_with_headers(owner: Owner) -> None:
    subject = "duetime.test." + uuid.uuid4().hex[:8]
    nc = await nats.connect("nats://127.0.0.1:4222")
    js = nc.jetstream()
    stream = "DT_" + uuid.uuid4().hex[:8].upper()
    await js.add_stream(name=stream, subjects=[subject])
    try:
        job = await owner.create(
            {
                "target": {"type": "queue", "broker": "nats", "topic": subject},
                "payload": [1, 2],
                "schedule": {"run_at": at(0)},
            }
        )
        sub = await js.pull_subscribe(subject, durable="t" + uuid.uuid4().hex[:6], stream=stream)
        msgs = []
        for _ in range(40):
            try:
                msgs = await sub.fetch(1, timeout=0.5)
                break
            except nats.errors.TimeoutError:
                continue
        [msg] = msgs
        assert json.loads(msg.data) == [1, 2]
        assert msg.headers is not None
        assert msg.headers["Idempotency-Key"].startswith(job["id"] + ":")
        assert msg.headers["Duetime-Attempt"] == "1"
    finally:
        await js.delete_stream(stream)
        await nc.close()


async def test_cron_next_run_at_is_reported_in_utc(owner: Owner, receiver: Receiver) -> None:
    job = await owner.create(
        {
            "target": webhook(receiver, "/tz"),
            "schedule": {"cron": "30 9 * * *", "timezone": "America/New_York"},
        }
    )
    nxt = parse(job["next_run_at"])
    assert nxt > datetime.now(UTC)
    assert nxt.minute == 30 and nxt.hour in (13, 14)  # 09:30 New York is 13:30 or 14:30 UTC
