"""The worst schedule preview the documented limits allow, over HTTP (issue 32, item 3): it is
answered within the work cap, off the event loop that serves every other owner, and its cost is
charged to its owner's rate limit; a job whose schedule is expensive to search is charged too."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from duetime.api.app import create_app
from duetime.core.ssrf import AddressPolicy
from duetime.core.validation import parse_job_spec
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap

Client = TestClient[web.Request, web.Application]

# The input: 1 February on a Sunday, in Casablanca, with the 1,000 excluded dates allowed.
EXCLUDE = [(date(2026, 1, 1) + timedelta(days=3 * i)).isoformat() for i in range(1000)]
WORST = {"cron": "0 0 */31 2 */7", "timezone": "Africa/Casablanca", "dst_gap": "skip", "exclude": EXCLUDE}


@pytest.fixture(scope="module")
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=4)
    yield s
    await s.close()


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[Client]:
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client


async def key_of(store: PostgresStore, prefix: str) -> dict[str, str]:
    key, _ = await store.create_api_key(f"{prefix}-{uuid.uuid4().hex[:8]}")
    return {"Authorization": f"Bearer {key}"}


def worst(year: int) -> dict[str, Any]:
    """A ``from`` in a year no process has probed yet: every year of the walk is a cold probe."""
    return {"schedule": WORST, "count": 100, "from": f"{year}-01-01T00:00:00Z"}


async def test_the_worst_preview_is_answered_within_the_cap_and_off_the_event_loop(
    store: PostgresStore,
) -> None:
    """Before: each such preview ran on the event loop for 100-300 ms (2 s with a far ``from``),
    and held up every other request and timer for that long."""
    auth = await key_of(store, "worst")
    app = create_app(store, policy=AddressPolicy(), preview_per_owner=8, preview_max_waiting=8)
    async with serve(app) as client:
        await client.post("/v1/schedules/preview", json={"schedule": {"cron": "@daily"}}, headers=auth)
        lags: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            while not done.is_set():
                before = time.perf_counter()
                await asyncio.sleep(0.005)
                lags.append(time.perf_counter() - before - 0.005)

        ticking = asyncio.create_task(ticker())
        answers = []
        for year in (3100, 4200, 5300, 6400, 7500, 8600):
            resp = await client.post("/v1/schedules/preview", json=worst(year), headers=auth)
            assert resp.status == 200, await resp.text()
            answers.append(await resp.json())
        done.set()
        await ticking
        # the loop only parsed and passed on the requests: nothing held it for long
        assert max(lags) < 0.1, f"the event loop was held {max(lags) * 1000:.0f} ms"
        for body in answers:
            assert body["truncated"] and body["has_more"], body["warnings"]
            assert 0 < len(body["items"]) < 100
            assert body["resume_from"] == body["items"][-1]["at"]
        # the follow-up request carries on where the first stopped
        first = answers[0]
        resp = await client.post(
            "/v1/schedules/preview",
            json={"schedule": WORST, "count": 3, "from": first["resume_from"]},
            headers=auth,
        )
        follow = await resp.json()
        assert follow["items"][0]["at"] > first["items"][-1]["at"]


async def test_a_preview_is_charged_to_its_owner_by_its_cost(store: PostgresStore) -> None:
    """Before: a preview took one token like any GET, so an owner could send a thousand of the
    most expensive kind a second within the default rate."""
    heavy, light = await key_of(store, "heavy"), await key_of(store, "light")
    async with serve(create_app(store, policy=AddressPolicy(), owner_rate_per_s=20)) as client:
        resp = await client.post("/v1/schedules/preview", json=worst(2900), headers=heavy)
        assert resp.status == 200
        resp = await client.get("/v1/jobs?limit=1", headers=heavy)
        assert resp.status == 429, "a preview that cost ~100 requests' work leaves the owner's bucket empty"
        assert int(resp.headers["Retry-After"]) >= 2
        assert (await resp.json())["error"]["code"] == "rate_limited"
        other = await client.get("/v1/jobs?limit=1", headers=light)
        assert other.status == 200
        # an ordinary preview still costs about one request
        resp = await client.post(
            "/v1/schedules/preview", json={"schedule": {"cron": "0 9 * * *"}, "count": 5}, headers=light
        )
        assert resp.status == 200
        assert (await client.get("/v1/jobs?limit=1", headers=light)).status == 200


async def test_a_job_whose_schedule_is_costly_to_search_is_charged_too(store: PostgresStore) -> None:
    """Registering a job searches its schedule for a first occurrence twice (the check and the
    row); every Monday for 19 years excluded makes that 1,000 jumps each."""
    heavy = await key_of(store, "heavyjob")
    today = datetime.now(UTC).date()
    monday = today + timedelta(days=-today.weekday() % 7 or 7)  # the next Monday, today excluded
    mondays = [today.isoformat(), *[(monday + timedelta(weeks=i)).isoformat() for i in range(999)]]
    spec = {
        "target": {"type": "queue", "broker": "redis", "topic": "bounds"},
        "schedule": {"cron": "0 0 * * 1", "timezone": "UTC", "exclude": mondays},
    }
    async with serve(create_app(store, policy=AddressPolicy(), owner_rate_per_s=20)) as client:
        resp = await client.post("/v1/jobs", json=spec, headers=heavy)
        assert resp.status == 201, await resp.text()
        resp = await client.get("/v1/jobs?limit=1", headers=heavy)
        assert resp.status == 429


async def test_a_list_page_is_charged_by_its_size(store: PostgresStore) -> None:
    """A page's cost grows with its limit and with what it lists: 1,000 jobs with 1,000 excluded
    dates each are 14 MiB and held the event loop 1.5 s, for one token. Past 32 KiB an answer
    now costs a token per 4 KiB."""
    owner = f"lister-{uuid.uuid4().hex[:8]}"
    key, _ = await store.create_api_key(owner)
    auth = {"Authorization": f"Bearer {key}"}
    today = datetime.now(UTC).date()
    spec = parse_job_spec(
        {
            "target": {"type": "queue", "broker": "redis", "topic": "bounds"},
            "schedule": {
                "cron": "0 9 * * *",
                "exclude": [(today + timedelta(days=2 * i + 1)).isoformat() for i in range(1000)],
            },
        },
        now=datetime.now(UTC),
    )
    for _ in range(12):  # straight into the store: the creates are not what is measured
        await store.create_job(owner, spec)
    async with serve(create_app(store, policy=AddressPolicy(), owner_rate_per_s=5)) as client:
        small = await client.get("/v1/jobs?limit=1", headers=auth)
        assert small.status == 200 and len(await small.read()) < 32 * 1024
        page = await client.get("/v1/jobs?limit=100", headers=auth)
        assert page.status == 200 and len(await page.read()) > 150_000
        after = await client.get("/v1/jobs?limit=1", headers=auth)
        assert after.status == 429, "a 170 KiB page costs ~35 requests' worth, the bucket holds 10"
