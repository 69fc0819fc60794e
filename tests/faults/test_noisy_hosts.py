"""Hosts that hang must not hurt anyone else (issue 28): two hosts that answer only after 8 s take
more runs than the worker has call slots, and a healthy host's runs, of the same owner and of
another, start on time in both waves; nothing is lost or doubled.

Before the per-host queues, each run held one of the worker's 128 call slots while it waited for
its host: the slow hosts' 300 runs took all of them for 8 s at a time, and the healthy runs
queued behind them started 8 s and more late."""

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
    Owner,
    account,
    expected_for,
    free_ports,
    metric,
    node_env,
    one_off,
    owner_on,
    whole_second,
)
from tests.faults.recorder import RecorderProcess
from tests.support.wait import settles, until

pytestmark = pytest.mark.timeout(240)

SLOW_S = 8
SLOW_RUNS = 150  # per slow host: two hosts, 300 runs for 128 call slots
WAVE_RUNS = 20  # per owner per wave
WAVE_GAP_S = 4
# Generous for a loaded two-core machine; the runs queued behind the slow hosts started at least
# SLOW_S late before the change.
LATE_BOUND_S = 3.0


async def _targets(owner: Owner) -> list[dict[str, Any]]:
    status, body = await owner.call("GET", "/v1/targets?limit=1000")
    assert status == 200, body
    return body["items"]  # type: ignore[no-any-return]


async def _target_calls(owner: Owner) -> dict[str, int]:
    return {t["host"]: t["last_5m"]["calls"] for t in await _targets(owner)}


async def test_hanging_hosts_leave_healthy_hosts_on_time(
    fault_db: str, api: NodeProc, tmp_path: Path
) -> None:
    recorders = [RecorderProcess(tmp_path / f"rec{i}.jsonl") for i in range(3)]
    await asyncio.gather(*(r.start() for r in recorders))
    slow, healthy = recorders[:2], recorders[2]
    node = NodeProc(
        node_env(fault_db, DUETIME_ENGINE_ID=f"noisy-{uuid.uuid4().hex[:6]}"), "engine", tmp_path / "e.log"
    )
    try:
        await node.ready()
        async with owner_on(api.url, fault_db) as a, owner_on(api.url, fault_db) as b:
            due = whole_second(4)
            slow_jobs: list[dict[str, Any]] = []
            for rec in slow:
                spec = one_off(f"{rec.url}/slow/{SLOW_S}/a", due)
                spec["target"]["timeout_s"] = SLOW_S + 10
                slow_jobs += await a.create_many([spec] * SLOW_RUNS)
            waves = [due, due + timedelta(seconds=WAVE_GAP_S)]
            mine: list[dict[str, Any]] = []
            theirs: list[dict[str, Any]] = []
            for at in waves:
                mine += await a.create_many([one_off(f"{healthy.url}/ok/a", at)] * WAVE_RUNS)
                theirs += await b.create_many([one_off(f"{healthy.url}/ok/b", at)] * WAVE_RUNS)
            await a.settle(within=150)
            await b.settle(within=60)
            reports = []
            for rec in slow:
                theirs_slow = [j for j in slow_jobs if j["target"]["url"].startswith(rec.url)]
                reports.append(await account(a, rec, [e for j in theirs_slow for e in expected_for(j)]))
            reports.append(await account(a, healthy, [e for j in mine for e in expected_for(j)]))
            reports.append(await account(b, healthy, [e for j in theirs for e in expected_for(j)]))
            # What the workers saw, as each owner reads it: its own hosts and calls only.
            hosts = {r.url.removeprefix("http://"): r for r in recorders}
            want_a = {h: (SLOW_RUNS if r in slow else 2 * WAVE_RUNS) for h, r in hosts.items()}
            await settles(lambda: _target_calls(a), want_a, within=30, what="owner a's /v1/targets")
            healthy_host = healthy.url.removeprefix("http://")
            await settles(lambda: _target_calls(b), {healthy_host: 2 * WAVE_RUNS}, within=30, what="b's")
    finally:
        await node.stop()
        await asyncio.gather(*(r.stop() for r in recorders))
    for report in reports:
        assert report.ok, report.explain()
        assert not report.duplicates, report.explain()
    late: dict[str, list[float]] = {}
    for call in healthy.records():
        if call.attempt != 1:
            continue
        who = "same owner" if call.path.endswith("/a") else "other owner"
        late.setdefault(f"{who}, wave at +{(call.scheduled_for - due).seconds} s", []).append(
            (call.arrived - call.scheduled_for).total_seconds()
        )
    print(json.dumps({"scenario": "noisy hosts", "worst_lateness_s": {k: max(v) for k, v in late.items()}}))
    assert sorted(late) == sorted(
        f"{who}, wave at +{s} s" for who in ("same owner", "other owner") for s in (0, WAVE_GAP_S)
    )
    for group, values in late.items():
        assert len(values) == WAVE_RUNS, group
        assert max(values) <= LATE_BOUND_S, (group, sorted(values)[-5:])


async def test_a_host_that_refuses_backs_off_and_its_runs_wait_without_using_attempts(
    fault_db: str, api: NodeProc, recorder: RecorderProcess, tmp_path: Path
) -> None:
    [closed] = free_ports(1)  # nobody listens: every connection is refused
    env = node_env(
        fault_db,
        DUETIME_ENGINE_ID=f"refused-{uuid.uuid4().hex[:6]}",
        DUETIME_TARGET_BACKOFF_AFTER="3",
        DUETIME_TARGET_BACKOFF_S="60",  # longer than the test: the runs must wait, not fail
    )
    node = NodeProc(env, "engine", tmp_path / "e.log")
    try:
        await node.ready()
        async with owner_on(api.url, fault_db) as owner:
            due = whole_second(2)
            down = one_off(f"http://127.0.0.1:{closed}/down", due)
            down["retry"] = {"max_attempts": 5, "backoff_initial_s": 0.1, "backoff_max_s": 0.2}
            down_jobs = await owner.create_many([down] * 10)
            up_jobs = await owner.create_many(
                [one_off(f"{recorder.url}/ok/up", due + timedelta(seconds=2))] * 10
            )
            host = f"127.0.0.1:{closed}"

            async def state() -> str:
                return next((t["state"] for t in await _targets(owner) if t["host"] == host), "unseen")

            await settles(state, "backing_off", within=30, what=f"{host}'s state in /v1/targets")
            [target] = [t for t in await _targets(owner) if t["host"] == host]
            assert target["backoff_until"] is not None and target["concurrency_limit"] == 1, target
            assert await metric(node.url, "duetime_target_state") >= 1
            await until(
                lambda: _waiting(node), within=10, what="duetime_runs_waiting{reason=backing_off} > 0"
            )

            async def attempts() -> dict[str, list[int]]:
                views = await owner.views(j["id"] for j in down_jobs)
                return {k: sorted(r.attempt for r in v.history) for k, v in views.items()}

            # Every down job's first attempt failed before the host backed off; its retry waits:
            # no second attempt, no job dead, for as long as we look.
            first = {j["id"]: [1] for j in down_jobs}
            await settles(attempts, first, within=20, what="the down jobs' attempts")
            await asyncio.sleep(3)
            assert await attempts() == first
            assert await owner.ids("dead") == set()
            await owner.settle(within=30, exclude=[j["id"] for j in down_jobs])
            done = await owner.views(j["id"] for j in up_jobs)
            assert {v.state for v in done.values()} == {"completed"}  # the other host was not held up
    finally:
        await node.stop()


async def _waiting(node: NodeProc) -> bool:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(node.url + "/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith('duetime_runs_waiting{reason="backing_off"}'):
            return float(line.rsplit(" ", 1)[1]) > 0
    return False


async def test_one_owners_slow_calls_to_a_shared_host_leave_another_owner_its_share(
    fault_db: str, api: NodeProc, tmp_path: Path
) -> None:
    """Issue 32, item 2: owner a holds every call a shared host allows with calls that take 8 s;
    owner b's runs to the same host start at once (before the owners' shares they waited for a's
    calls to end, 8 s and more)."""
    shared = RecorderProcess(tmp_path / "shared.jsonl")
    await shared.start()
    env = node_env(
        fault_db, DUETIME_ENGINE_ID=f"shared-{uuid.uuid4().hex[:6]}", DUETIME_TARGET_CONCURRENCY="32"
    )
    node = NodeProc(env, "engine", tmp_path / "e.log")
    try:
        await node.ready()
        async with owner_on(api.url, fault_db) as a, owner_on(api.url, fault_db) as b:
            due = whole_second(4)
            slow = one_off(f"{shared.url}/slow/{SLOW_S}/a", due)
            slow["target"]["timeout_s"] = SLOW_S + 10
            await a.create_many([slow] * 100)
            later = due + timedelta(seconds=2)
            theirs = await b.create_many([one_off(f"{shared.url}/slow/{SLOW_S}/b", later)] * 8)
            await b.settle(within=60)
            report = await account(b, shared, [e for j in theirs for e in expected_for(j)])
            await a.settle(within=120)
    finally:
        await node.stop()
        await shared.stop()
    assert report.ok and not report.duplicates, report.explain()
    late = sorted(
        (c.arrived - c.scheduled_for).total_seconds() for c in shared.records() if c.path.endswith("/b")
    )
    print(json.dumps({"scenario": "shared host", "owner_b_lateness_s": late}))
    assert len(late) == 8
    # b's share of the host is 32 // 2 = 16: all eight start at once
    assert max(late) <= LATE_BOUND_S, late
