"""What a black-box probe of a running node found (issue 17), each through a real `duetime api`
process: the answer over HTTP, and for the slow-client items the behaviour of a raw socket."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.faults.harness import NodeProc, node_env

PROBE_ENV = {
    "DUETIME_LOG_LEVEL": "INFO",
}


@pytest.fixture(scope="module")
async def api(pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NodeProc]:
    log = tmp_path_factory.mktemp("probe") / "api.log"
    log.touch()
    proc = NodeProc(node_env(pg_dsn, **PROBE_ENV), "api", log)
    try:
        await proc.ready()
        yield proc
    finally:
        await proc.stop()


@pytest.fixture(scope="module")
async def key(pg_dsn: str) -> str:
    store = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=1)
    try:
        return (await store.create_api_key(f"probe-{uuid.uuid4().hex[:8]}"))[0]
    finally:
        await store.close()


async def _call(
    api: NodeProc, key: str, method: str, path: str, body: Any = None, **headers: str
) -> tuple[int, Any, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method, api.url + path, json=body, headers={"Authorization": f"Bearer {key}", **headers}
        ) as resp,
    ):
        return resp.status, resp.headers, await resp.json(content_type=None)


def _cron(**schedule: Any) -> dict[str, Any]:
    return {
        "target": {"type": "webhook", "url": "https://example.com/hook", "headers": {"X-Token": "s3cret"}},
        "schedule": {"cron": "0 3 * * *", **schedule},
    }


# --- item 7: a schedule that can never fire within the horizon ----------------------------------


async def test_a_start_at_past_the_horizon_is_refused_on_post_and_patch(api: NodeProc, key: str) -> None:
    status, _, body = await _call(api, key, "POST", "/v1/jobs", _cron(start_at="9999-01-01T00:00:00Z"))
    assert status == 422, body
    assert body["error"]["code"] == "cron_never_fires"
    assert body["error"]["field"] == "schedule.start_at"
    status, _, job = await _call(api, key, "POST", "/v1/jobs", _cron())
    assert status == 201, job
    status, _, body = await _call(
        api,
        key,
        "PATCH",
        f"/v1/jobs/{job['id']}",
        {"schedule": {"cron": "0 3 * * *", "start_at": "9999-01-01T00:00:00Z"}},
    )
    assert status == 422 and body["error"]["code"] == "cron_never_fires", body
    status, _, still = await _call(api, key, "GET", f"/v1/jobs/{job['id']}")
    assert still["state"] == "scheduled" and still["next_run_at"] == job["next_run_at"]


# --- item 8: header secrets do not follow the URL to another origin -----------------------------


async def test_a_patch_to_another_origin_must_resend_secret_headers(api: NodeProc, key: str) -> None:
    status, _, job = await _call(api, key, "POST", "/v1/jobs", _cron())
    assert status == 201, job
    path = f"/v1/jobs/{job['id']}"
    for url in (
        "https://evil.example.org/hook",
        "http://example.com/hook",
        "https://example.com:8443/hook",
    ):
        target = {"type": "webhook", "url": url, "headers": {"X-Token": "<redacted>"}}
        status, _, body = await _call(api, key, "PATCH", path, {"target": target})
        assert status == 422, (url, body)
        assert body["error"]["code"] == "invalid_header"
        assert body["error"]["field"] == "target.headers.X-Token"
        assert "resend" in body["error"]["message"].lower()
    # The same origin keeps the stored secret; a new origin with the value sent again is fine.
    same = {"type": "webhook", "url": "https://EXAMPLE.com:443/other", "headers": {"X-Token": "<redacted>"}}
    status, _, body = await _call(api, key, "PATCH", path, {"target": same})
    assert status == 200, body
    moved = {"type": "webhook", "url": "https://other.example.org/h", "headers": {"X-Token": "new"}}
    status, _, body = await _call(api, key, "PATCH", path, {"target": moved})
    assert status == 200, body
