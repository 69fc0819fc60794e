"""Secrets never leak: a canary header value, the owner's signing secret and its API key are
planted, a real ``duetime run`` process (DEBUG logging) calls targets that succeed, fail, hang,
refuse connections and redirect, the owner uses every endpoint (including sending a bad header
value that contains the canary) — and then every API response, the process's whole output, the
run history (API and table) and ``/metrics`` are grepped. A positive control proves the target
did receive the canary, so its absence elsewhere means "kept secret", not "never used"."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.common import free_port
from tests.faults.harness import NodeProc, node_env
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]


def _always(status: int) -> Callable[[int], int]:
    return lambda _n: status


async def test_canaries_appear_in_no_response_log_history_or_metric(own_db: str, tmp_path: Path) -> None:
    canary = "cnry" + secrets.token_hex(12)
    store = await PostgresStore.open(ShardMap.single(own_db), pool_size=1)
    try:
        owner = f"secrets-{uuid.uuid4().hex[:6]}"
        api_key, signing_secret = await store.create_api_key(owner)
    finally:
        await store.close()
    receiver = Receiver()
    await receiver.start()
    for path, status in (("/s500", 500), ("/s400", 400), ("/s302", 302)):
        receiver.behaviour[path] = _always(status)
    receiver.delay["/hang"] = 3.0
    env = node_env(
        own_db,
        DUETIME_LOG_LEVEL="DEBUG",
        DUETIME_DATA_DIR=str(tmp_path / "data"),
        DUETIME_HTTP_PORT=str(free_port()),
    )
    node = NodeProc(env, "run", tmp_path / "node.log")
    bodies: list[str] = []
    try:
        base = await node.ready()
        auth = {"Authorization": f"Bearer {api_key}"}
        async with aiohttp.ClientSession() as http:

            async def call(method: str, path: str, body: Any = None, **headers: str) -> Any:
                async with http.request(method, base + path, json=body, headers={**auth, **headers}) as resp:
                    text = await resp.text()
                    bodies.append(text)
                    return resp.status, (await resp.json(content_type=None)) if text else None

            now = datetime.now(UTC)

            def spec(path: str, *, timeout_s: int = 5, attempts: int = 2, **extra: Any) -> dict[str, Any]:
                return {
                    "target": {
                        "type": "webhook",
                        "url": receiver.url + path if path.startswith("/") else path,
                        "timeout_s": timeout_s,
                        "headers": {"X-Api-Token": canary, "X-Other": f"Bearer {canary}"},
                    },
                    "schedule": {"run_at": (now + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")},
                    "retry": {"max_attempts": attempts, "backoff_initial_s": 0.1},
                    **extra,
                }

            closed_port = free_port()
            specs = [
                spec("/ok"),
                spec("/s500"),
                spec("/s400"),
                spec("/s302"),
                spec("/hang", timeout_s=1, attempts=1),
                spec(f"http://127.0.0.1:{closed_port}/refused", attempts=1),
            ]
            ids = []
            for i, s in enumerate(specs):
                status, job = await call("POST", "/v1/jobs", s, **{"Idempotency-Key": f"k{i}"})
                assert status == 201, job
                ids.append(job["id"])
                assert (await call("POST", "/v1/jobs", s, **{"Idempotency-Key": f"k{i}"}))[0] == 200
            cron = {**spec("/ok"), "schedule": {"cron": "* * * * * *"}}
            status, cron_job = await call("POST", "/v1/jobs", cron)
            assert status == 201
            first = ids[0]
            await call("GET", f"/v1/jobs/{first}")
            await call("GET", "/v1/jobs?limit=1000")
            await call("PATCH", f"/v1/jobs/{cron_job['id']}", {"name": "renamed"})
            await call("PATCH", f"/v1/jobs/{cron_job['id']}", {"target": cron_job["target"]})
            bad = {"target": {**cron_job["target"], "headers": {"X-Api-Token": canary + "\r\nX-Evil: 1"}}}
            status, refused = await call("PATCH", f"/v1/jobs/{cron_job['id']}", bad)
            assert status == 422, refused
            status, refused = await call("POST", "/v1/jobs", {**spec("/ok"), **bad})
            assert status == 422, refused
            await call("POST", f"/v1/jobs/{cron_job['id']}/pause")
            await call("POST", f"/v1/jobs/{cron_job['id']}/resume")
            await call("POST", f"/v1/jobs/{cron_job['id']}/trigger")
            await call("GET", f"/v1/jobs/{cron_job['id']}/preview")
            deadline = asyncio.get_running_loop().time() + 40
            while True:
                states = [(await call("GET", f"/v1/jobs/{i}"))[1]["state"] for i in ids]
                if "scheduled" not in states:
                    break
                assert asyncio.get_running_loop().time() < deadline, states
                await asyncio.sleep(0.3)
            await asyncio.sleep(1.5)  # a few cron runs
            await call("DELETE", f"/v1/jobs/{cron_job['id']}")
            for job_id in [*ids, cron_job["id"]]:
                status, runs = await call("GET", f"/v1/jobs/{job_id}/runs?limit=1000")
                assert status == 200
                await call("POST", f"/v1/jobs/{job_id}/replay")
            async with http.get(base + "/metrics") as resp:
                metrics_text = await resp.text()
            outcomes = {r["outcome"] for r in runs["items"]}
    finally:
        await node.stop()
        await receiver.stop()
    conn = await asyncpg.connect(own_db)
    try:
        history = [str(r[0]) for r in await conn.fetch("SELECT row_to_json(r)::text FROM runs r")]
        last_runs = [
            str(r[0]) for r in await conn.fetch("SELECT last_run::text FROM jobs WHERE last_run IS NOT NULL")
        ]
    finally:
        await conn.close()
    log_text = node.log.read_text(errors="replace")
    # Positive controls: the target got the canary; the history and logs are not empty.
    assert {c.headers.get("X-Api-Token") for c in receiver.calls} == {canary}, "the target got the canary"
    assert len(history) >= 8 and "Duetime is serving" in log_text and "duetime_calls_total" in metrics_text
    assert outcomes == {"succeeded"}
    places = {
        "API responses": "\n".join(bodies),
        "node output (stdout+stderr, DEBUG)": log_text,
        "/metrics": metrics_text,
        "runs table": "\n".join(history),
        "jobs.last_run": "\n".join(last_runs),
    }
    for secret_name, value in (
        ("header canary", canary),
        ("signing secret", signing_secret),
        ("API key", api_key),
    ):
        leaked = [where for where, text in places.items() if value in text]
        assert leaked == [], f"the {secret_name} appears in {leaked}"
