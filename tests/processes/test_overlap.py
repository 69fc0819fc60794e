"""Overlap policy and backfill end to end: a real node (API, engine, workers) on the test database,
every-second crons against a loopback receiver whose answers take longer than a second."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.node import Owner, parse
from tests.support.receiver import Call, Receiver
from tests.support.wait import until

SLOW_S = 2.5  # each call takes this long: longer than the every-second cron's period


def _slots(calls: list[Call]) -> list[datetime]:
    return [parse(c.headers["Duetime-Scheduled-For"]) for c in calls]


async def _succeeded_at_least(owner: Owner, job_id: str, n: int) -> bool:
    """Whether the job's history holds ``n`` succeeded runs yet."""
    return sum(1 for r in await owner.runs(job_id) if r["outcome"] == "succeeded") >= n


async def _every_second(owner: Owner, receiver: Receiver, path: str, overlap: str) -> dict[str, Any]:
    receiver.delay[path] = SLOW_S
    return await owner.create(
        {
            "target": {"type": "webhook", "url": receiver.url + path},
            "schedule": {"cron": "* * * * * *"},
            "overlap": overlap,
            "misfire_grace_s": 3600,  # a late run is late, not missed: only the overlap policy decides
        }
    )


async def test_allow_starts_each_occurrence_on_time_beside_the_slow_one(
    owner: Owner, receiver: Receiver
) -> None:
    job = await _every_second(owner, receiver, "/allow", "allow")
    assert job["overlap"] == "allow"
    calls = await receiver.wait_for("/allow", 8, within=40)
    await owner.call("DELETE", f"/v1/jobs/{job['id']}")
    calls = sorted(calls[:8], key=lambda c: c.headers["Duetime-Scheduled-For"])
    slots = _slots(calls)
    # every occurrence ran, none twice, each under the job's own id and key
    assert slots == [slots[0] + timedelta(seconds=i) for i in range(8)]
    assert {c.headers["Duetime-Job-Id"] for c in calls} == {job["id"]}
    assert len({c.headers["Idempotency-Key"] for c in calls}) == 8
    # on time: without running beside each other, the 8th would start ~1.5 s × 7 ≈ 10 s late
    lateness = [(c.arrived - s).total_seconds() for c, s in zip(calls, slots, strict=True)]
    assert max(lateness) < SLOW_S, lateness
    # and so they did overlap: a call started while the one before it was still being answered
    assert any(b.arrived < a.arrived + timedelta(seconds=SLOW_S) for a, b in itertools.pairwise(calls))
    # the history is the job's, one succeeded run per occurrence (the last calls are recorded once
    # their slow answers came back: waited for, not slept on)
    done: set[datetime] = set()

    async def all_recorded() -> bool:
        nonlocal done
        done = {parse(r["scheduled_for"]) for r in await owner.runs(job["id"]) if r["outcome"] == "succeeded"}
        return set(slots) <= done

    await until(all_recorded, within=30, what="a succeeded run recorded for each of the 8 occurrences")
    assert set(slots) <= done
    status, got = await owner.call("GET", f"/v1/jobs/{job['id']}")
    assert status == 200 and got["last_run"] is not None


async def test_skip_records_what_came_due_during_a_run_and_never_overlaps(
    owner: Owner, receiver: Receiver
) -> None:
    job = await _every_second(owner, receiver, "/skip", "skip")
    await receiver.wait_for("/skip", 3, within=40)
    await asyncio.sleep(SLOW_S + 0.5)  # let the third call end
    await until(  # and be recorded: the worker writes its outcome after the slow answer came back
        lambda: _succeeded_at_least(owner, job["id"], 3), within=30, what="the first three runs recorded"
    )
    await owner.call("DELETE", f"/v1/jobs/{job['id']}")
    calls = receiver.on("/skip")
    for a, b in itertools.pairwise(calls):
        assert b.arrived >= a.arrived + timedelta(seconds=SLOW_S) - timedelta(milliseconds=50), (
            "runs overlapped"
        )
    history = await owner.runs(job["id"])
    ran = sorted(parse(r["scheduled_for"]) for r in history if r["outcome"] == "succeeded")
    skipped = sorted(parse(r["scheduled_for"]) for r in history if r["outcome"] == "skipped")
    assert ran[:3] == _slots(calls)[:3]
    assert skipped, history
    assert all("overlap policy skip" in r["error"] for r in history if r["outcome"] == "skipped")
    # every second between the first and the last run is accounted for: run, or skipped, once
    first, last = ran[0], ran[-1]
    span = [first + timedelta(seconds=i) for i in range(int((last - first).total_seconds()) + 1)]
    accounted = sorted([s for s in ran + skipped if first <= s <= last])
    assert accounted == span


async def test_buffer_one_runs_one_right_after_and_skips_the_rest(owner: Owner, receiver: Receiver) -> None:
    job = await _every_second(owner, receiver, "/buffer", "buffer_one")
    calls = await receiver.wait_for("/buffer", 3, within=40)
    await asyncio.sleep(SLOW_S + 0.5)
    await owner.call("DELETE", f"/v1/jobs/{job['id']}")
    calls = receiver.on("/buffer")
    slots = _slots(calls)
    for i, (a, b) in enumerate(itertools.pairwise(calls)):
        ended = a.arrived + timedelta(seconds=SLOW_S)
        assert b.arrived >= ended - timedelta(milliseconds=50), "runs overlapped"
        # the buffered run starts right after the one that held it up (margin for a busy machine)
        assert b.arrived - ended < timedelta(seconds=2), (i, b.arrived - ended)
        # and it is the first occurrence that came due while the previous ran
        assert slots[i + 1] > slots[i]
    history = await owner.runs(job["id"])
    skipped = [r for r in history if r["outcome"] == "skipped"]
    assert skipped and all("overlap policy buffer_one" in r["error"] for r in skipped)
    ran = {parse(r["scheduled_for"]) for r in history if r["outcome"] == "succeeded"}
    assert not ran & {parse(r["scheduled_for"]) for r in skipped}  # nothing both ran and skipped
    assert len(skipped) == len({r["scheduled_for"] for r in skipped})  # nothing recorded twice


async def test_backfill_runs_each_past_occurrence_once_with_its_own_key(
    owner: Owner, receiver: Receiver
) -> None:
    job = await owner.create(
        {"target": {"type": "webhook", "url": receiver.url + "/backfill"}, "schedule": {"cron": "0 * * * *"}}
    )
    now = datetime.now(UTC)
    start = (now - timedelta(hours=5)).replace(minute=0, second=0, microsecond=0)
    end = start + timedelta(hours=5)  # exclusive: five hourly occurrences
    status, body = await owner.call(
        "POST", f"/v1/jobs/{job['id']}/backfill", {"from": start.isoformat(), "to": end.isoformat()}
    )
    assert status == 202, body
    assert body["queued"] == 5 and parse(body["first"]) == start
    assert parse(body["last"]) == start + timedelta(hours=4)
    calls = await receiver.wait_for("/backfill", 5, within=30)
    await asyncio.sleep(1.0)
    calls = receiver.on("/backfill")
    assert len(calls) == 5  # each once
    assert sorted(_slots(calls)) == [start + timedelta(hours=h) for h in range(5)]
    assert {c.headers["Duetime-Job-Id"] for c in calls} == {job["id"]}
    keys = {c.headers["Idempotency-Key"] for c in calls}
    assert keys == {
        f"{job['id']}:{(start + timedelta(hours=h)).strftime('%Y-%m-%dT%H:%M:%SZ')}" for h in range(5)
    }
    # each call's outcome is recorded after it came back: the history is waited for, then read
    await until(
        lambda: _succeeded_at_least(owner, job["id"], 5), within=30, what="the five backfilled runs recorded"
    )
    # the job itself is untouched: still scheduled for its next regular occurrence
    status, got = await owner.call("GET", f"/v1/jobs/{job['id']}")
    assert got["state"] == "scheduled" and parse(got["next_run_at"]) > now
    assert got["last_run"] is not None and got["last_run"]["outcome"] == "succeeded"
    history = await owner.runs(job["id"])
    assert sorted(parse(r["scheduled_for"]) for r in history) == sorted(_slots(calls))
    # the job's list shows the job once: the backfilled runs' rows are internal
    status, page = await owner.call("GET", "/v1/jobs?limit=1000")
    assert [j["id"] for j in page["items"]].count(job["id"]) == 1


async def test_backfill_under_buffer_one_runs_one_at_a_time_in_order(
    owner: Owner, receiver: Receiver
) -> None:
    receiver.delay["/chain"] = 0.6
    job = await owner.create(
        {
            "target": {"type": "webhook", "url": receiver.url + "/chain"},
            "schedule": {"cron": "0 0 1 1 *"},
            "overlap": "buffer_one",
        }
    )
    start = datetime(2020, 1, 1, tzinfo=UTC)
    status, body = await owner.call(
        "POST",
        f"/v1/jobs/{job['id']}/backfill",
        {"from": "2020-01-01T00:00:00Z", "to": "2024-01-01T00:00:00Z"},
    )
    assert status == 202 and body["queued"] == 4, body
    calls = await receiver.wait_for("/chain", 4, within=30)
    assert _slots(calls) == [start.replace(year=y) for y in (2020, 2021, 2022, 2023)]  # in order
    for a, b in itertools.pairwise(calls):
        assert b.arrived >= a.arrived + timedelta(seconds=0.55), "backfilled runs overlapped"


async def test_cancelling_a_job_stops_its_waiting_backfill(owner: Owner, receiver: Receiver) -> None:
    receiver.delay["/stop"] = 1.0
    job = await owner.create(
        {
            "target": {"type": "webhook", "url": receiver.url + "/stop"},
            "schedule": {"cron": "0 0 * * *"},
            "overlap": "skip",
        }
    )
    status, body = await owner.call(
        "POST",
        f"/v1/jobs/{job['id']}/backfill",
        {"from": "2025-01-01T00:00:00Z", "to": "2025-01-21T00:00:00Z"},
    )
    assert status == 202 and body["queued"] == 20, body
    await receiver.wait_for("/stop", 1, within=20)
    status, _ = await owner.call("DELETE", f"/v1/jobs/{job['id']}")
    assert status == 200
    seen = len(receiver.on("/stop"))
    await asyncio.sleep(3.0)
    # the call in flight at the cancel may finish and one released at that moment may start, no more
    assert len(receiver.on("/stop")) <= seen + 1 < 20


async def test_backfill_refusals(owner: Owner, receiver: Receiver) -> None:
    one_off = await owner.create(
        {
            "target": {"type": "webhook", "url": receiver.url + "/x"},
            "schedule": {"run_at": "2030-01-01T00:00:00Z"},
        }
    )
    rng = {"from": "2025-01-01T00:00:00Z", "to": "2025-01-02T00:00:00Z"}
    status, body = await owner.call("POST", f"/v1/jobs/{one_off['id']}/backfill", rng)
    assert status == 422 and body["error"]["code"] == "not_recurring"
    cron = await owner.create(
        {"target": {"type": "webhook", "url": receiver.url + "/x"}, "schedule": {"cron": "* * * * *"}}
    )
    path = f"/v1/jobs/{cron['id']}/backfill"
    status, body = await owner.call(
        "POST", path, {"from": "2025-01-01T00:00:00Z", "to": "2025-01-03T00:00:00Z"}
    )
    assert status == 422 and body["error"]["code"] == "backfill_too_large", body
    status, body = await owner.call(
        "POST", path, {"from": "2025-01-02T00:00:00Z", "to": "2025-01-01T00:00:00Z"}
    )
    assert status == 422 and body["error"]["field"] == "to"
    status, body = await owner.call("POST", path, {"from": "2025-01-02T00:00:00Z"})
    assert status == 422 and body["error"]["field"] == "to"
    status, body = await owner.call("POST", path, {**rng, "overlap": "skip"})
    assert status == 422 and body["error"]["field"] == "overlap"
    await owner.call("POST", f"/v1/jobs/{cron['id']}/pause")
    status, body = await owner.call("POST", path, rng)
    assert status == 409 and body["error"]["code"] == "job_paused"
    status, body = await owner.call("POST", "/v1/jobs/00000000-0000-7000-8000-000000000000/backfill", rng)
    assert status == 404
    status, body = await owner.call("POST", f"/v1/jobs/{cron['id']}", {**rng})
    assert status == 405


async def test_a_large_backfill_is_paced_and_does_not_hold_up_the_owners_other_jobs(
    owner: Owner, receiver: Receiver
) -> None:
    receiver.delay["/big"] = 0.5
    big = await owner.create(
        {"target": {"type": "webhook", "url": receiver.url + "/big"}, "schedule": {"cron": "* * * * *"}}
    )
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    status, body = await owner.call(
        "POST",
        f"/v1/jobs/{big['id']}/backfill",
        {"from": (end - timedelta(minutes=1000)).isoformat(), "to": end.isoformat()},
    )
    assert status == 202 and body["queued"] == 1000, body
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    await owner.create(
        {
            "target": {"type": "webhook", "url": receiver.url + "/other"},
            "schedule": {"run_at": due.isoformat()},
        }
    )
    [call] = await receiver.wait_for("/other", 1, within=20)
    # on time, while the backfill trickles out at its pace (10 a second) instead of all at once
    assert (call.arrived - due).total_seconds() < 1.5
    started = len(receiver.on("/big"))
    assert started < 200, started
    await owner.call("DELETE", f"/v1/jobs/{big['id']}")


@pytest.mark.redis
async def test_backfilled_runs_to_a_redis_stream_carry_the_jobs_id(owner: Owner) -> None:
    """Regression: the batched path for Redis targets named the occurrence row, not the job."""
    import json
    import uuid

    import redis.asyncio as aioredis

    key = "duetime-test-" + uuid.uuid4().hex[:8]
    job = await owner.create(
        {"target": {"type": "queue", "broker": "redis", "topic": key}, "schedule": {"cron": "0 0 1 * *"}}
    )
    status, body = await owner.call(
        "POST",
        f"/v1/jobs/{job['id']}/backfill",
        {"from": "2025-01-01T00:00:00Z", "to": "2025-04-01T00:00:00Z"},
    )
    assert status == 202 and body["queued"] == 3, body
    r = aioredis.from_url("redis://127.0.0.1:6379/0")
    try:
        entries: list[Any] = []
        for _ in range(200):
            entries = list(await r.xrange(key) or [])
            if len(entries) >= 3:
                break
            await asyncio.sleep(0.05)
        fields = [{str(k, "utf-8"): str(v, "utf-8") for k, v in f.items()} for _, f in entries]
        assert {f["duetime_job_id"] for f in fields} == {job["id"]}
        assert sorted(f["idempotency_key"] for f in fields) == [
            f"{job['id']}:2025-0{m}-01T00:00:00Z" for m in (1, 2, 3)
        ]
        assert all(json.loads(f["payload"]) is None for f in fields)
    finally:
        await r.delete(key)
        await r.aclose()
