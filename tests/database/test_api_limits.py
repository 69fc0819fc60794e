"""Per-owner limits: a request rate (429 with Retry-After) and a cap on active jobs (409)."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp import web

from duetime.api.app import create_app
from duetime.api.limits import JobCap, OwnerRateLimiter
from duetime.api.server import api_runner
from duetime.core.errors import Conflict, RateLimited
from duetime.core.ssrf import AddressPolicy
from duetime.storage.postgres import PostgresStore
from tests.support.fixtures import serve


def spec() -> dict[str, object]:
    at = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"target": {"type": "webhook", "url": "https://example.com/h"}, "schedule": {"run_at": at}}


async def test_owner_rate_limit_answers_429_with_retry_after(store: PostgresStore) -> None:
    key_a, _ = await store.create_api_key("rate_a_" + uuid.uuid4().hex[:6])
    key_b, _ = await store.create_api_key("rate_b_" + uuid.uuid4().hex[:6])
    async with serve(create_app(store, policy=AddressPolicy(), owner_rate_per_s=2)) as client:
        statuses = []
        for _ in range(8):
            resp = await client.get("/v1/jobs", headers={"Authorization": f"Bearer {key_a}"})
            statuses.append(resp.status)
            if resp.status == 429:
                assert int(resp.headers["Retry-After"]) >= 1
                body = await resp.json()
                assert body["error"]["code"] == "rate_limited"
        assert statuses[:4] == [200] * 4 and 429 in statuses  # burst of 2 x rate, then limited
        # another owner has its own bucket
        other = await client.get("/v1/jobs", headers={"Authorization": f"Bearer {key_b}"})
        assert other.status == 200


async def test_job_cap_answers_409_past_the_cap(store: PostgresStore) -> None:
    key, _ = await store.create_api_key("cap_" + uuid.uuid4().hex[:6])
    auth = {"Authorization": f"Bearer {key}"}
    async with serve(create_app(store, policy=AddressPolicy(), max_jobs_per_owner=3)) as client:
        for _ in range(3):
            assert (await client.post("/v1/jobs", json=spec(), headers=auth)).status == 201
        resp = await client.post("/v1/jobs", json=spec(), headers=auth)
        assert resp.status == 409
        assert (await resp.json())["error"]["code"] == "job_limit_reached"


def test_rate_limiter_refills_with_time() -> None:
    now = [0.0]
    limiter = OwnerRateLimiter(1.0, 2.0, clock=lambda: now[0])
    limiter.check("o")
    limiter.check("o")
    with pytest.raises(RateLimited) as err:
        limiter.check("o")
    assert err.value.retry_after_s == 1
    now[0] += 1.0
    limiter.check("o")


async def test_job_cap_refreshes_its_count() -> None:
    now = [0.0]
    counts = {"o": 2}

    async def count(owner: str) -> int:
        return counts[owner]

    cap = JobCap(3, count, refresh_s=10.0, clock=lambda: now[0])
    await cap.check("o")
    cap.created("o")  # 3 now, known locally
    with pytest.raises(Conflict):
        await cap.check("o")
    counts["o"] = 1  # jobs were cancelled elsewhere
    now[0] += 11.0
    await cap.check("o")


async def test_a_put_by_name_that_creates_counts_against_both_owner_caps(store: PostgresStore) -> None:
    """PUT /v1/jobs/by-name creates as POST does, so it is held to the job cap and the byte cap;
    a PUT that updates an existing job is not a create and passes at the cap."""
    key, _ = await store.create_api_key("putcap_" + uuid.uuid4().hex[:6])
    auth = {"Authorization": f"Bearer {key}"}
    app = create_app(store, policy=AddressPolicy(), max_job_bytes_per_owner=1)
    async with serve(app) as client:
        first = await client.put("/v1/jobs/by-name/a", json=spec(), headers=auth)
        assert first.status == 201
        refused = await client.put("/v1/jobs/by-name/b", json=spec(), headers=auth)
        assert refused.status == 409
        assert (await refused.json())["error"]["code"] == "job_bytes_limit_reached"
        again = await client.put("/v1/jobs/by-name/a", json={**spec(), "jitter_s": 3}, headers=auth)
        assert again.status == 200
    key2, _ = await store.create_api_key("putcap2_" + uuid.uuid4().hex[:6])
    auth2 = {"Authorization": f"Bearer {key2}"}
    async with serve(create_app(store, policy=AddressPolicy(), max_jobs_per_owner=1)) as client:
        assert (await client.put("/v1/jobs/by-name/a", json=spec(), headers=auth2)).status == 201
        refused = await client.put("/v1/jobs/by-name/b", json=spec(), headers=auth2)
        assert refused.status == 409
        assert (await refused.json())["error"]["code"] == "job_limit_reached"


async def _raw_exchange(port: int, request: bytes) -> bytes:
    """Write ``request`` on a fresh connection and read everything until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=5)
    finally:
        writer.close()


SECRET = "dt_" + "s3cr3t" * 4
PARSER_REJECTED = {
    # a header over aiohttp's 8190-byte limit, with the key at its head
    "oversized-authorization": b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
    + SECRET.encode()
    + b"k" * 9000
    + b"\r\n\r\n",
    "nul-in-authorization": b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
    + SECRET.encode()
    + b"\x00tail\r\n\r\n",
    "malformed-request-line": b"GET /v1/" + SECRET.encode() + b" HTTP/1.1 extra\r\nHost: x\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(PARSER_REJECTED))
async def test_a_request_the_parser_refuses_gets_a_fixed_json_400_that_echoes_nothing(
    store: PostgresStore, name: str
) -> None:
    runner = api_runner(create_app(store, policy=AddressPolicy()), header_timeout_s=5.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        answer = await _raw_exchange(runner.addresses[0][1], PARSER_REJECTED[name])
    finally:
        await runner.cleanup()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400", answer[:200]  # HTTP/1.0: the version was unreadable
    assert b"content-type: application/json" in head.lower(), head
    assert json.loads(body) == {
        "error": {"code": "malformed_request", "message": "The request could not be read."}
    }, body
    for leak in (SECRET.encode(), b"kkkk", b"tail", b"aiohttp", b"Python"):
        assert leak not in answer, (name, leak)
