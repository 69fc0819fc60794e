"""The database misbehaving under a running Duetime, on a PRIVATE PostgreSQL cluster (the shared
server other work depends on is never restarted): ``duetime.embedded_pg.EmbeddedPostgres`` in a
temporary directory, driven with ``pg_ctl``.

* ``pg_ctl restart -m immediate`` (a crash and recovery) in the middle of a burst, while owners
  keep registering jobs: nothing lost, every duplicate attributed, every 201 still there after.
* The database stopped: the API answers 503 with ``Retry-After`` (never a 500, never a 201 it did
  not commit); after the restart every job a client saw a 201 for exists.
* The database read-only (``default_transaction_read_only``): writes answer 503, reads work.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from duetime.embedded_pg import EmbeddedPostgres
from tests.faults.harness import (
    NodeProc,
    Owner,
    account,
    every_second,
    expected_for,
    node_env,
    one_off,
    owner_on,
    seeded,
    whole_second,
)
from tests.faults.recorder import RecorderProcess
from tests.support.pgcluster import (
    migrated_database,
    private_cluster,
    restart_immediately,
    start_again,
    stop_immediately,
)

pytestmark = pytest.mark.timeout(200)


@pytest.fixture(scope="module")
async def private_pg() -> AsyncIterator[EmbeddedPostgres]:
    async with private_cluster() as pg:
        yield pg


@pytest.fixture
async def private_db(private_pg: EmbeddedPostgres) -> AsyncIterator[str]:
    yield await migrated_database(private_pg)


class Writer:
    """Owners registering jobs without pause; keeps every answer it got."""

    def __init__(self, owner: Owner, url: str, concurrency: int = 4) -> None:
        self._owner = owner
        self._url = url
        self._concurrency = concurrency
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.answers: list[tuple[float, int, dict[str, Any], str | None]] = []
        self.errors: list[str] = []

    def start(self, run_at: Any) -> None:
        self._tasks = [asyncio.create_task(self._loop(run_at)) for _ in range(self._concurrency)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _loop(self, run_at: Any) -> None:
        headers = {"Authorization": f"Bearer {self._owner.key}"}
        while not self._stop.is_set():
            spec = one_off(self._url, run_at())
            try:
                async with self._owner.http.post(
                    self._owner.base + "/v1/jobs", json=spec, headers=headers
                ) as resp:
                    body = await resp.json(content_type=None)
                    self.answers.append(
                        (time.monotonic(), resp.status, body, resp.headers.get("Retry-After"))
                    )
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.errors.append(repr(exc))
            await asyncio.sleep(0.01)

    def acknowledged(self) -> list[dict[str, Any]]:
        return [body for _, status, body, _ in self.answers if status == 201]


async def test_an_immediate_restart_mid_burst_loses_nothing(
    private_pg: EmbeddedPostgres, private_db: str, recorder: RecorderProcess, tmp_path: Path
) -> None:
    _seed, rng = seeded("pg_restart")
    env = node_env(private_db)
    api = NodeProc(env, "api", tmp_path / "api.log")
    engines = [
        NodeProc(
            {**env, "DUETIME_ENGINE_ID": f"pgr{i}-{uuid.uuid4().hex[:4]}"}, "engine", tmp_path / f"e{i}.log"
        )
        for i in range(2)
    ]
    try:
        await api.ready()
        for engine in engines:
            await engine.ready()
        async with owner_on(api.url, private_db) as owner:
            start = whole_second(4)
            window = 6
            end = start + timedelta(seconds=window)
            specs = [
                one_off(recorder.url + "/ok", start + timedelta(seconds=rng.uniform(0, window)))
                for _ in range(300)
            ]
            specs += [every_second(recorder.url + "/slow/0.3", start, end) for _ in range(5)]
            created = await owner.create_many(specs)
            writer = Writer(owner, recorder.url + "/ok")
            writer.start(lambda: whole_second(1))
            await asyncio.sleep(
                max(0.0, (start - whole_second(0)).total_seconds()) + rng.uniform(0.5, window - 1)
            )
            began = time.monotonic()
            await restart_immediately(private_pg)
            restart_s = time.monotonic() - began
            await asyncio.sleep(2)
            await writer.stop()
            acked = writer.acknowledged()
            await owner.settle(within=90)
            jobs = created + acked
            expected = [e for job in jobs for e in expected_for(job)]
            report = await account(owner, recorder, expected)
        alive = [e.alive() for e in engines] + [api.alive()]
    finally:
        for proc in [*engines, api]:
            await proc.stop()
    statuses: dict[int, int] = {}
    for _, status, _, _ in writer.answers:
        statuses[status] = statuses.get(status, 0) + 1
    print(
        json.dumps(
            {
                "scenario": "pg_restart",
                "restart_s": round(restart_s, 2),
                "create_answers": statuses,
                **report.counts(),
                **report.attribution(),
            }
        )
    )
    assert alive == [True, True, True], "every process rode out the restart"
    assert report.ok, report.explain()
    assert set(statuses) <= {201, 503}, statuses


async def test_the_api_answers_503_and_never_acknowledges_what_it_did_not_store(
    private_pg: EmbeddedPostgres, private_db: str, tmp_path: Path
) -> None:
    api = NodeProc(node_env(private_db), "api", tmp_path / "api.log")
    try:
        await api.ready()
        async with owner_on(api.url, private_db) as owner:
            writer = Writer(owner, "https://1.1.1.1/hook")
            writer.start(lambda: whole_second(3600))
            await asyncio.sleep(1.0)
            await stop_immediately(private_pg)
            down_at = time.monotonic()
            await asyncio.sleep(1.0)
            async with owner.http.get(api.url + "/readyz") as resp:
                ready_status = resp.status
            status, body = await owner.call("GET", "/v1/jobs?limit=1")
            await asyncio.sleep(2.0)
            restarting_at = time.monotonic()  # the server may answer before pg_ctl says it is up
            await start_again(private_pg)
            up_at = time.monotonic()
            while not [a for a in writer.answers if a[0] > up_at and a[1] == 201]:
                assert time.monotonic() - up_at < 60, "the API never recovered"
                await asyncio.sleep(0.2)
            await asyncio.sleep(0.5)
            await writer.stop()
            acked = writer.acknowledged()
            missing = [
                job["id"] for job in acked if (await owner.call("GET", f"/v1/jobs/{job['id']}"))[0] != 200
            ]
        conn = await asyncpg.connect(private_db)
        try:
            stored = await conn.fetchval("SELECT count(*) FROM jobs")
        finally:
            await conn.close()
    finally:
        await api.stop()
    # An answer read just after the stop may be for a commit made just before it: allow half a
    # second for it to arrive (every 201 is checked for durability below anyway).
    during = [a for a in writer.answers if down_at + 0.5 < a[0] < restarting_at]
    unavailable = [a for a in writer.answers if a[1] == 503]
    print(
        json.dumps(
            {
                "scenario": "db_unreachable",
                "answers": len(writer.answers),
                "acknowledged": len(acked),
                "answered_503": len(unavailable),
                "stored": stored,
                "stored_but_unacknowledged": stored - len(acked),
                "client_errors": len(writer.errors),
            }
        )
    )
    assert (ready_status, status) == (503, 503), body
    assert body["error"]["code"] == "storage_unavailable", body
    assert during and all(a[1] == 503 for a in during), {a[1] for a in during}
    assert all(a[3] is not None and a[2]["error"]["message"] for a in unavailable), "503 says when to retry"
    assert {a[1] for a in writer.answers} <= {201, 503}
    assert not writer.errors, writer.errors[:3]
    assert missing == [], f"{len(missing)} jobs answered 201 do not exist"
    assert stored >= len(acked)


async def test_a_read_only_database_refuses_writes_with_503_and_still_serves_reads(
    private_pg: EmbeddedPostgres, private_db: str, tmp_path: Path
) -> None:
    api = NodeProc(node_env(private_db), "api", tmp_path / "api.log")
    admin = await asyncpg.connect(private_pg.dsn)
    try:
        await api.ready()
        async with owner_on(api.url, private_db) as owner:
            job = await owner.create(one_off("https://1.1.1.1/hook", whole_second(3600)))
            await admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            await admin.execute("SELECT pg_reload_conf()")
            await asyncio.sleep(0.5)
            spec = one_off("https://1.1.1.1/hook", whole_second(3600))
            refused = await owner.call("POST", "/v1/jobs", spec)
            cancel = await owner.call("DELETE", f"/v1/jobs/{job['id']}")
            read = await owner.call("GET", f"/v1/jobs/{job['id']}")
            await admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
            await admin.execute("SELECT pg_reload_conf()")
            await asyncio.sleep(0.5)
            after = await owner.call("POST", "/v1/jobs", spec)
            listed = (await owner.call("GET", "/v1/jobs?limit=1000"))[1]
    finally:
        await admin.close()
        await api.stop()
    assert refused[0] == 503 and cancel[0] == 503, (refused, cancel)
    assert read == (200, job)
    assert after[0] == 201
    assert [j["id"] for j in listed["items"]] == [job["id"], after[1]["id"]], "nothing was half-written"


async def test_the_engines_listen_again_after_the_database_restarted(
    private_pg: EmbeddedPostgres, private_db: str
) -> None:
    """LISTEN does not survive its connection: after a restart the engine's hints were lost for
    good (only the poll found due rows). The janitor's round now listens again, and wakes the
    shards whose hints it may have missed."""
    from duetime.storage.postgres import NOTIFY_CHANNEL, PostgresStore
    from duetime.storage.shardmap import ShardMap
    from tests.support.wait import until

    woke: list[int] = []
    store = await PostgresStore.open(ShardMap.single(private_db), pool_size=1)
    listener = await store.listen_due(range(16), woke.append)
    try:
        await restart_immediately(private_pg)

        async def listening_again() -> bool:
            await listener.keep()
            return listener.relistened == 1

        await until(listening_again, within=30, what="LISTEN again after the restart")
        assert sorted(set(woke)) == list(range(16)), "every shard woken: hints may have been missed"
        woke.clear()
        conn = await asyncpg.connect(private_db)
        try:
            await conn.execute(f"NOTIFY {NOTIFY_CHANNEL}, '5'")
        finally:
            await conn.close()
        await until(lambda: 5 in woke, within=10, what="a hint after the restart")
    finally:
        await listener.close()
        await store.close()
