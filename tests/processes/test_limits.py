"""The operator's limits, as settings of a real ``duetime api`` process: the per-owner request
rate (429 with Retry-After, other owners unaffected), the cap on active jobs per owner (409), the
shortest cron interval allowed and the ``run_at`` horizon (422). docs/security.md lists them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.faults.harness import NodeProc, node_env

pytestmark = pytest.mark.processes


@pytest.fixture
async def api(pg_dsn: str, tmp_path: Path) -> AsyncIterator[NodeProc]:
    env = node_env(
        pg_dsn,
        DUETIME_API_OWNER_RATE="5",
        DUETIME_MAX_JOBS_PER_OWNER="3",
        DUETIME_MIN_CRON_INTERVAL_S="60",
        DUETIME_RUN_AT_HORIZON_DAYS="1",
    )
    proc = NodeProc(env, "api", tmp_path / "api.log")
    try:
        await proc.ready()
        yield proc
    finally:
        await proc.stop()


async def _keys(pg_dsn: str, n: int) -> list[str]:
    store = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=1)
    try:
        return [(await store.create_api_key(f"lim-{uuid.uuid4().hex[:8]}"))[0] for _ in range(n)]
    finally:
        await store.close()


def _spec(**schedule: Any) -> dict[str, Any]:
    return {"target": {"type": "queue", "broker": "nats", "topic": "t"}, "schedule": schedule}


def _in(hours: float) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_the_owner_rate_answers_429_with_retry_after_and_spares_other_owners(
    pg_dsn: str, api: NodeProc
) -> None:
    noisy, quiet = await _keys(pg_dsn, 2)
    async with aiohttp.ClientSession() as http:

        async def get(key: str) -> tuple[int, str | None, Any]:
            async with http.get(api.url + "/v1/jobs", headers={"Authorization": f"Bearer {key}"}) as r:
                return r.status, r.headers.get("Retry-After"), await r.json()

        answers = await asyncio.gather(*(get(noisy) for _ in range(40)))
        other = await get(quiet)
    statuses = [a[0] for a in answers]
    assert set(statuses) == {200, 429}, statuses
    assert statuses.count(200) <= 12, "a burst of twice the rate, and not much more"
    for status, retry_after, body in answers:
        if status == 429:
            assert retry_after is not None and int(retry_after) >= 1
            assert body["error"]["code"] == "rate_limited", body
    assert other[0] == 200


async def test_the_job_cap_the_cron_interval_and_the_horizon_are_enforced(pg_dsn: str, api: NodeProc) -> None:
    [key] = await _keys(pg_dsn, 1)
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:

        async def post(spec: dict[str, Any]) -> tuple[int, Any]:
            await asyncio.sleep(0.25)  # stay under the rate limit of this process
            async with http.post(api.url + "/v1/jobs", json=spec, headers=headers) as r:
                return r.status, await r.json()

        too_often = await post(_spec(cron="*/30 * * * * *"))
        too_far = await post(_spec(run_at=_in(48)))
        made = [await post(_spec(run_at=_in(1))) for _ in range(3)]
        over = await post(_spec(run_at=_in(1)))
    assert too_often[0] == 422 and too_often[1]["error"]["field"] == "schedule.cron", too_often
    assert too_far[0] == 422 and too_far[1]["error"]["field"] == "schedule.run_at", too_far
    assert [m[0] for m in made] == [201, 201, 201]
    assert over[0] == 409 and over[1]["error"]["code"] == "job_limit_reached", over
