"""`duetime run` as real processes: with DUETIME_PROCESSES=2 the shards are shared by two full
nodes on one port; every run fires once, and SIGTERM stops both cleanly. Also the engine's
crash-and-restart story with SIGKILL."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.common import free_port
from tests.support.node import Owner, at
from tests.support.processes import DuetimeProcess
from tests.support.receiver import Receiver

pytestmark = pytest.mark.processes


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=2)
    yield s
    await s.close()


def env_for(pg_dsn: str, port: int, **extra: str) -> dict[str, str]:
    return {
        "DUETIME_DATABASE_URL": pg_dsn,
        "DUETIME_HTTP_PORT": str(port),
        "DUETIME_WEBHOOK_ALLOW_PRIVATE": "1",
        "DUETIME_POLL_INTERVAL_S": "0.5",
        "DUETIME_JANITOR_INTERVAL_S": "0.5",
        "DUETIME_SHUTDOWN_GRACE_S": "5",
        **extra,
    }


async def test_two_processes_share_the_shards_and_stop_on_sigterm(
    pg_dsn: str, store: PostgresStore, receiver: Receiver, tmp_path: Path
) -> None:
    port = free_port()
    proc = DuetimeProcess("proc", env_for(pg_dsn, port, DUETIME_PROCESSES="2"), ["run"], tmp_path).start()
    try:
        await proc.ready("serving")
        key, secret = await store.create_api_key("procs_" + uuid.uuid4().hex[:6])
        async with aiohttp.ClientSession() as http:
            owner = Owner("p", key, secret, http, f"http://127.0.0.1:{port}")
            run_at = at(3)
            ids = [
                (
                    await owner.create(
                        {
                            "target": {"type": "webhook", "url": f"{receiver.url}/p"},
                            "schedule": {"run_at": run_at},
                        }
                    )
                )["id"]
                for _ in range(40)
            ]
            calls = await receiver.wait_for("/p", 40, within=20)
            await asyncio.sleep(1)
            assert sorted(c.headers["Duetime-Job-Id"] for c in receiver.on("/p")) == sorted(ids)
            assert len(calls) == 40
    finally:
        proc.signal(signal.SIGTERM)
        assert await proc.wait() == 0


async def _make_due(
    store: PostgresStore, receiver: Receiver, path: str, n: int, in_s: float
) -> tuple[list[str], str]:
    from datetime import UTC, datetime, timedelta

    from duetime.core.model import JobSpec, OneOffSchedule, WebhookTarget

    o = "kill_" + uuid.uuid4().hex[:6]
    await store.create_api_key(o)
    run_at = (datetime.now(UTC) + timedelta(seconds=in_s)).replace(microsecond=0)
    ids = []
    for _ in range(n):
        job, _ = await store.create_job(
            o, JobSpec(target=WebhookTarget(url=f"{receiver.url}{path}"), schedule=OneOffSchedule(run_at))
        )
        ids.append(job.id)
    return ids, run_at.strftime("%Y-%m-%dT%H:%M:%SZ")


async def _claimed_by(store: PostgresStore, engine_id: str, ids: list[str]) -> int:
    """How many of this test's jobs ``engine_id`` holds claimed (only these: the engine may claim
    other due rows of the database too)."""
    n: int = await store.pool_for_shard(0).fetchval(
        "SELECT count(*) FROM jobs"
        " WHERE claimed_by = $1 AND phase = 'claimed' AND job_id::text = ANY($2::text[])",
        engine_id,
        ids,
    )
    return n


async def test_an_engine_killed_with_claims_is_replaced_after_the_leases_lapse(
    pg_dsn: str, store: PostgresStore, receiver: Receiver, tmp_path: Path
) -> None:
    from datetime import timedelta

    from tests.support.node import parse

    dead_id, other_id = "dead-" + uuid.uuid4().hex[:6], "other-" + uuid.uuid4().hex[:6]
    env = env_for(pg_dsn, 0, DUETIME_LEASE_S="3", DUETIME_HEARTBEAT_S="1")
    first = DuetimeProcess("first", {**env, "DUETIME_ENGINE_ID": dead_id}, ["engine"], tmp_path).start()
    await first.ready("running")
    ids, run_at = await _make_due(store, receiver, "/lapse", 30, 4)
    for _ in range(60):
        if await _claimed_by(store, dead_id, ids) == 30:
            break
        await asyncio.sleep(0.1)
    assert await _claimed_by(store, dead_id, ids) == 30
    first.kill()  # SIGKILL: no release, no goodbye
    second = DuetimeProcess("second", {**env, "DUETIME_ENGINE_ID": other_id}, ["engine"], tmp_path).start()
    try:
        await second.ready("running")
        calls = await receiver.wait_for("/lapse", 30, within=30)
        await asyncio.sleep(1)
        assert sorted(c.headers["Duetime-Job-Id"] for c in receiver.on("/lapse")) == sorted(ids)
        # nothing fired before the dead engine's leases lapsed (due + 3 s lease)
        assert min(c.arrived for c in calls) >= parse(run_at) + timedelta(seconds=2.5)
    finally:
        second.signal(signal.SIGTERM)
        assert await second.wait() == 0


async def test_an_engine_restarted_with_the_same_id_refires_its_claims_at_once(
    pg_dsn: str, store: PostgresStore, receiver: Receiver, tmp_path: Path
) -> None:
    from datetime import timedelta

    from tests.support.node import parse

    engine_id = "phoenix-" + uuid.uuid4().hex[:6]
    env = env_for(pg_dsn, 0, DUETIME_LEASE_S="30", DUETIME_HEARTBEAT_S="5", DUETIME_ENGINE_ID=engine_id)
    first = DuetimeProcess("first", env, ["engine"], tmp_path).start()
    await first.ready("running")
    # Due 10 s ahead, not 5: on a busy machine the claims could take until the due time, and
    # the first process then fired the runs itself (token 1) before the kill.
    ids, run_at = await _make_due(store, receiver, "/phoenix", 30, 10)
    for _ in range(80):
        if await _claimed_by(store, engine_id, ids) == 30:
            break
        await asyncio.sleep(0.1)
    assert await _claimed_by(store, engine_id, ids) == 30, "the first process did not claim every run in time"
    first.kill()
    again = DuetimeProcess("again", env, ["engine"], tmp_path).start()
    try:
        await again.ready("running")
        calls = await receiver.wait_for("/phoenix", 30, within=20)
        await asyncio.sleep(1)
        assert sorted(c.headers["Duetime-Job-Id"] for c in receiver.on("/phoenix")) == sorted(ids)
        # on time: its own claims were taken back, not left to lapse (the lease is 30 s)
        assert max(c.arrived for c in calls) < parse(run_at) + timedelta(seconds=2)
        tokens = {int(c.headers["Duetime-Fencing-Token"]) for c in calls}
        assert tokens == {2}  # one lease by the first process, a new one at the retake
    finally:
        again.signal(signal.SIGTERM)
        assert await again.wait() == 0


async def test_sigterm_finishes_calls_in_flight_and_releases_unfired_claims(
    pg_dsn: str, store: PostgresStore, receiver: Receiver, tmp_path: Path
) -> None:
    from datetime import timedelta

    from tests.support.node import parse

    receiver.delay["/slow"] = 1.5
    env = env_for(pg_dsn, 0, DUETIME_LEASE_S="30", DUETIME_HEARTBEAT_S="5")
    first = DuetimeProcess(
        "first", {**env, "DUETIME_ENGINE_ID": "term-" + uuid.uuid4().hex[:6]}, ["engine"], tmp_path
    ).start()
    await first.ready("running")
    slow_ids, _ = await _make_due(store, receiver, "/slow", 10, 0)
    later_ids, later_at = await _make_due(store, receiver, "/later", 10, 6)
    await receiver.wait_for("/slow", 10, within=15)  # all ten calls are in flight now
    first.signal(signal.SIGTERM)
    assert await first.wait() == 0
    # the in-flight calls finished and were recorded: nothing left running
    running: int = await store.pool_for_shard(0).fetchval(
        "SELECT count(*) FROM jobs WHERE job_id = ANY($1::uuid[]) AND state <> 'completed'",
        [uuid.UUID(i) for i in slow_ids],
    )
    assert running == 0
    # the unfired claims were given back: another engine fires them on time, not 30 s late
    second = DuetimeProcess(
        "second", {**env, "DUETIME_ENGINE_ID": "next-" + uuid.uuid4().hex[:6]}, ["engine"], tmp_path
    ).start()
    try:
        await second.ready("running")
        calls = await receiver.wait_for("/later", 10, within=20)
        assert max(c.arrived for c in calls) < parse(later_at) + timedelta(seconds=2)
        await asyncio.sleep(1)
        assert len(receiver.on("/slow")) == 10 and len(receiver.on("/later")) == 10
        assert sorted(c.headers["Duetime-Job-Id"] for c in receiver.on("/later")) == sorted(later_ids)
    finally:
        second.signal(signal.SIGTERM)
        assert await second.wait() == 0
