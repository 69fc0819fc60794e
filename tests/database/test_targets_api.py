"""``GET /v1/targets`` over a real server and the PostgreSQL store: reports seeded through the
store as workers write them, read back through HTTP as an owner sees them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from duetime.api.app import create_app
from duetime.core.model import TargetState
from duetime.core.ssrf import AddressPolicy
from duetime.storage.ports import TargetHealthReport
from duetime.storage.postgres import PostgresStore
from tests.support.fixtures import Client, api_owner, serve

UNTIL = datetime(2030, 1, 1, 12, 0, 5, 250_000, tzinfo=UTC)


def worker() -> str:
    return "w-" + uuid.uuid4().hex[:8]


def report(owner: str, host: str, state: TargetState = TargetState.HEALTHY, **kw: Any) -> TargetHealthReport:
    fields: dict[str, Any] = {
        "concurrency_limit": 8,
        "backoff_until": None,
        "calls_5m": 0,
        "timeouts_5m": 0,
        "errors_5m": 0,
    }
    fields.update(kw)
    return TargetHealthReport(owner=owner, host=host, state=state, **fields)


async def _get(client: Client, path: str, headers: dict[str, str], status: int = 200) -> Any:
    resp = await client.get(path, headers=headers)
    assert resp.status == status, await resp.text()
    assert resp.headers["Content-Type"].startswith("application/json")
    return await resp.json()


async def test_an_owner_reads_what_the_workers_reported(client: Client, store: PostgresStore) -> None:
    owner, headers = await api_owner(store)
    await store.report_target_health(
        worker(),
        [
            report(owner, "api.example.com:443", calls_5m=40, timeouts_5m=1),
            report(owner, "[2001:db8::1]:8443", TargetState.DEGRADED, concurrency_limit=2, errors_5m=3),
        ],
    )
    await store.report_target_health(
        worker(),
        [
            report(
                owner,
                "api.example.com:443",
                TargetState.BACKING_OFF,
                concurrency_limit=1,
                backoff_until=UNTIL,
                calls_5m=12,
                timeouts_5m=9,
            )
        ],
    )
    body = await _get(client, "/v1/targets", headers)
    assert body == {
        "items": [
            {
                "host": "[2001:db8::1]:8443",
                "state": "degraded",
                "concurrency_limit": 2,
                "backoff_until": None,
                "last_5m": {"calls": 0, "timeouts": 0, "errors": 3},
            },
            {
                "host": "api.example.com:443",
                "state": "backing_off",
                "concurrency_limit": 9,
                "backoff_until": "2030-01-01T12:00:05.25Z",
                "last_5m": {"calls": 52, "timeouts": 10, "errors": 0},
            },
        ],
        "next_cursor": None,
    }


async def test_pages_follow_the_cursor(client: Client, store: PostgresStore) -> None:
    owner, headers = await api_owner(store)
    hosts = [f"h{i}.example:443" for i in range(5)]
    await store.report_target_health(worker(), [report(owner, h) for h in hosts])
    seen: list[str] = []
    path = "/v1/targets?limit=2"
    while True:
        body = await _get(client, path, headers)
        assert len(body["items"]) <= 2
        seen += [item["host"] for item in body["items"]]
        if body["next_cursor"] is None:
            break
        path = f"/v1/targets?limit=2&cursor={body['next_cursor']}"
    assert seen == hosts
    # An empty value means "not given", as on every list.
    assert len((await _get(client, "/v1/targets?limit=&cursor=", headers))["items"]) == 5


async def test_an_owner_sees_nothing_of_another_owners_hosts(client: Client, store: PostgresStore) -> None:
    first, first_headers = await api_owner(store)
    second, second_headers = await api_owner(store)
    await store.report_target_health(
        worker(),
        [
            report(first, "first.example:443", TargetState.BACKING_OFF, backoff_until=UNTIL),
            report(first, "shared.example:443", calls_5m=100, errors_5m=100),
            report(second, "shared.example:443", calls_5m=1),
        ],
    )
    body = await _get(client, "/v1/targets", second_headers)
    assert body == {
        "items": [
            {
                "host": "shared.example:443",
                "state": "healthy",
                "concurrency_limit": 8,
                "backoff_until": None,
                "last_5m": {"calls": 1, "timeouts": 0, "errors": 0},
            }
        ],
        "next_cursor": None,
    }
    # The first owner's cursor is the first owner's: the second owner's list refuses it.
    page = await _get(client, "/v1/targets?limit=1", first_headers)
    assert [i["host"] for i in page["items"]] == ["first.example:443"]
    refused = await _get(client, f"/v1/targets?cursor={page['next_cursor']}", second_headers, 422)
    assert refused["error"]["code"] == "invalid_cursor"
    after = await _get(client, f"/v1/targets?cursor={page['next_cursor']}", first_headers)
    assert [i["host"] for i in after["items"]] == ["shared.example:443"]
    assert after["items"][0]["last_5m"]["calls"] == 100
    _, nobody = await api_owner(store)
    assert await _get(client, "/v1/targets", nobody) == {"items": [], "next_cursor": None}


async def test_without_a_key_it_answers_401(client: Client, store: PostgresStore) -> None:
    for headers in ({}, {"Authorization": "Bearer dt_not-a-key"}):
        resp = await client.get("/v1/targets", headers=headers)
        assert resp.status == 401
        assert resp.headers["WWW-Authenticate"] == "Bearer"
        assert (await resp.json())["error"]["code"] == "unauthorized"


async def test_a_bad_limit_or_cursor_answers_422_naming_it(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    for limit in ("0", "1001", "-1", "ten", "1.5"):
        body = await _get(client, f"/v1/targets?limit={limit}", headers, 422)
        assert (body["error"]["code"], body["error"]["field"]) == ("invalid_limit", "limit")
    for limit in ("1", "1000"):
        await _get(client, f"/v1/targets?limit={limit}", headers)
    for cursor in ("!!!", "AAAA", "__________8", "YQ==", "x" * 2000, "é"):
        resp = await client.get("/v1/targets", params={"cursor": cursor}, headers=headers)
        assert resp.status == 422, (cursor, await resp.text())
        error = (await resp.json())["error"]
        assert (error["code"], error["field"]) == ("invalid_cursor", "cursor"), cursor


async def test_the_owner_rate_limit_applies(store: PostgresStore) -> None:
    app = create_app(store, policy=AddressPolicy(), owner_rate_per_s=1.0)
    async with serve(app) as client:
        _, headers = await api_owner(store)
        statuses = [(await client.get("/v1/targets", headers=headers)).status for _ in range(5)]
        assert statuses[0] == 200 and 429 in statuses
        limited = await client.get("/v1/targets", headers=headers)
        assert limited.status == 429 and limited.headers["Retry-After"].isdigit()
        assert (await limited.json())["error"]["code"] == "rate_limited"
