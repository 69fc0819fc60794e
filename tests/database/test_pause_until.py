"""Pause with a note, until a time (issue 30, item 3), over HTTP and with real engines.

The contract (api-v1.md, "Additions: why a job did or did not run"): ``POST /v1/jobs/{id}/pause``
takes ``{"note", "until"}`` (bulk pause the same two fields); the Job shows ``paused`` while
paused, null otherwise; at ``until`` Duetime resumes the job itself (``auto_resume`` by
``duetime``) within the usual lateness, applying its missed-run policy as a resume does, across
restarts of its engines, once; ``until`` not in the future or past the horizon: 422
``invalid_until``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from duetime.api.app import create_app
from duetime.app import Node
from duetime.core.codec import format_time
from duetime.core.ids import shard_of
from duetime.core.ssrf import AddressPolicy
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.support.node import Owner, fast_settings, parse
from tests.support.receiver import Receiver

Client = TestClient[web.Request, web.Application]
SPEC = {"target": {"type": "webhook", "url": "https://1.1.1.1/hook"}, "schedule": {"cron": "0 3 * * *"}}


def rfc3339(at: datetime) -> str:
    """As the API writes a time (UTC, ``Z``, a fraction only when there is one, no trailing zeros)."""
    return format_time(at)


@pytest.fixture(scope="module")
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    opened = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=4)
    yield opened
    await opened.close()


@pytest.fixture(scope="module")
async def client(store: PostgresStore) -> AsyncIterator[Client]:
    async with TestClient(TestServer(create_app(store, policy=AddressPolicy()), host="127.0.0.1")) as c:
        yield c


async def new_key(store: PostgresStore) -> tuple[dict[str, str], str]:
    api_key, _ = await store.create_api_key(f"owner-{uuid.uuid4().hex[:12]}")
    return {"Authorization": f"Bearer {api_key}"}, api_key[:10]


async def create(client: Client, headers: dict[str, str], **extra: Any) -> dict[str, Any]:
    resp = await client.post("/v1/jobs", json={**SPEC, **extra}, headers=headers)
    assert resp.status == 201, await resp.text()
    job: dict[str, Any] = await resp.json()
    return job


async def test_the_job_shows_its_pause_while_paused(client: Client, store: PostgresStore) -> None:
    headers, key_id = await new_key(store)
    job = await create(client, headers)
    assert job["paused"] is None
    until = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    resp = await client.post(
        f"/v1/jobs/{job['id']}/pause",
        json={"note": "database upgrade\nback on Monday", "until": until.isoformat()},
        headers=headers,
    )
    assert resp.status == 200, await resp.text()
    paused = (await resp.json())["paused"]
    assert paused == {
        "at": paused["at"],
        "note": "database upgrade\nback on Monday",
        "until": rfc3339(until),
        "actor": {"type": "owner", "key_id": key_id},
    }
    assert parse(paused["at"]) <= datetime.now(UTC)
    got = await (await client.get(f"/v1/jobs/{job['id']}", headers=headers)).json()
    assert got["state"] == "paused" and got["paused"] == paused
    resumed = await (await client.post(f"/v1/jobs/{job['id']}/resume", headers=headers)).json()
    assert resumed["paused"] is None
    # Without a body (or with an empty one) a pause says nothing more.
    plain = await (await client.post(f"/v1/jobs/{job['id']}/pause", headers=headers)).json()
    assert (plain["paused"]["note"], plain["paused"]["until"]) == (None, None)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"until": "2020-01-01T00:00:00Z"}, (422, "invalid_until", "until")),
        ({"until": "in an hour"}, (422, "invalid_until", "until")),
        ({"until": "2026-12-01T10:00:00"}, (422, "invalid_until", "until")),  # no offset
        ({"until": "9999-01-01T00:00:00Z"}, (422, "invalid_until", "until")),  # past the horizon
        ({"until": 1767225600}, (400, "wrong_type", "until")),
        ({"note": "x" * 501}, (422, "invalid_value", "note")),
        ({"note": "bell\u0007"}, (422, "invalid_value", "note")),
        ({"note": 5}, (400, "wrong_type", "note")),
        ({"reason": "x"}, (422, "unknown_field", "reason")),
    ],
)
async def test_a_bad_pause_is_refused_and_changes_nothing(
    client: Client, store: PostgresStore, body: dict[str, Any], expected: tuple[int, str, str]
) -> None:
    status, code, field = expected
    headers, _ = await new_key(store)
    job = await create(client, headers)
    resp = await client.post(f"/v1/jobs/{job['id']}/pause", json=body, headers=headers)
    assert resp.status == status, await resp.text()
    error = (await resp.json())["error"]
    assert (error["code"], error["field"]) == (code, field)
    assert (await (await client.get(f"/v1/jobs/{job['id']}", headers=headers)).json())["state"] == "scheduled"


async def test_until_now_is_not_in_the_future_and_a_body_must_be_json(
    client: Client, store: PostgresStore
) -> None:
    headers, _ = await new_key(store)
    job = await create(client, headers)
    now = rfc3339(datetime.now(UTC) - timedelta(seconds=1))
    resp = await client.post(f"/v1/jobs/{job['id']}/pause", json={"until": now}, headers=headers)
    assert resp.status == 422 and (await resp.json())["error"]["code"] == "invalid_until"
    text = await client.post(f"/v1/jobs/{job['id']}/pause", data="note=x", headers=headers)
    assert text.status == 415


async def test_bulk_pause_takes_note_and_until_and_the_others_do_not(
    client: Client, store: PostgresStore
) -> None:
    headers, key_id = await new_key(store)
    group = {"g": uuid.uuid4().hex[:8]}
    jobs = [await create(client, headers, labels=group) for _ in range(3)]
    until = rfc3339((datetime.now(UTC) + timedelta(hours=3)).replace(microsecond=0))
    resp = await client.post(
        "/v1/jobs/bulk/pause", json={"labels": group, "note": "freeze", "until": until}, headers=headers
    )
    assert resp.status == 200 and (await resp.json())["changed"] == 3, await resp.text()
    for job in jobs:
        got = await (await client.get(f"/v1/jobs/{job['id']}", headers=headers)).json()
        assert (got["paused"]["note"], got["paused"]["until"], got["paused"]["actor"]["key_id"]) == (
            "freeze",
            until,
            key_id,
        )
    past = await client.post(
        "/v1/jobs/bulk/pause", json={"labels": group, "until": "2020-01-01T00:00:00Z"}, headers=headers
    )
    assert past.status == 422 and (await past.json())["error"]["code"] == "invalid_until"
    for action in ("resume", "cancel"):
        resp = await client.post(
            f"/v1/jobs/bulk/{action}", json={"labels": group, "note": "x"}, headers=headers
        )
        assert resp.status == 422 and (await resp.json())["error"]["code"] == "unknown_field", action
    resumed = await client.post("/v1/jobs/bulk/resume", json={"labels": group}, headers=headers)
    assert (await resumed.json())["changed"] == 3
    got = await (await client.get(f"/v1/jobs/{jobs[0]['id']}", headers=headers)).json()
    assert got["paused"] is None


async def test_the_engines_resume_the_job_at_until_once_across_a_restart(
    pg_dsn: str, receiver: Receiver
) -> None:
    """The pause's end outlives the engine that was running when it was set: the engine stops
    before ``until``, two others start after it, and the job is resumed once, by one of them,
    within about a second of ``until``; no run starts while it is paused."""
    api = Node(fast_settings(pg_dsn), engine=False, workers=False)
    await api.start()
    engines: list[Node] = []
    try:
        assert api.store is not None and api.url is not None
        key, secret = await api.store.create_api_key("pause_" + uuid.uuid4().hex[:6])
        async with aiohttp.ClientSession() as http:
            owner = Owner("p", key, secret, http, api.url)
            path = f"/pause-{uuid.uuid4().hex[:6]}"
            first = Node(fast_settings(pg_dsn), api=False)
            engines.append(first)
            await first.start()
            job = await owner.create(
                {
                    "target": {"type": "webhook", "url": receiver.url + path},
                    "schedule": {"cron": "* * * * * *"},
                }
            )
            await receiver.wait_for(path, 1, within=20)
            # Long enough for the engines started below to have the shards dealt to them first.
            until = datetime.now(UTC) + timedelta(seconds=8)
            status, paused = await owner.call(
                "POST", f"/v1/jobs/{job['id']}/pause", {"until": rfc3339(until)}
            )
            assert status == 200 and paused["paused"]["until"] == rfc3339(until), paused
            paused_at = datetime.now(UTC)
            await first.stop()  # the engine goes away while the job is paused
            engines.remove(first)
            for _ in range(2):  # two engines serving every shard after the pause has ended
                node = Node(fast_settings(pg_dsn), api=False)
                engines.append(node)
            for node in engines:
                await node.start()
            calls_before = len(receiver.on(path))
            after = await receiver.wait_for(path, calls_before + 1, within=30)
            resumed_call = after[calls_before].arrived
            # Nothing ran while paused (a call the answer found already on its way may arrive
            # just after it, later on a loaded machine).
            assert all(c.arrived <= paused_at + timedelta(seconds=3) or c.arrived >= until for c in after)
            assert resumed_call >= until
            assert resumed_call - until < timedelta(seconds=5), (resumed_call, until)
            status, changes = await owner.call("GET", f"/v1/jobs/{job['id']}/changes")
            assert status == 200
            actions = [c["action"] for c in changes["items"]]
            assert actions.count("auto_resume") == 1 and actions[-2:] == ["pause", "create"], actions
            [auto] = [c for c in changes["items"] if c["action"] == "auto_resume"]
            assert auto["actor"] == {"type": "duetime", "key_id": None}
            status, got = await owner.call("GET", f"/v1/jobs/{job['id']}")
            assert got["state"] == "scheduled" and got["paused"] is None
            await owner.call("DELETE", f"/v1/jobs/{job['id']}")
    finally:
        for node in engines:
            await node.stop()
        await api.stop()


async def test_each_wake_up_is_gone_once_it_was_looked_at(
    client: Client, store: PostgresStore, pg_dsn: str
) -> None:
    """A pause's end (pause_ends, migration 0020) is a wake-up: one per pause with an until,
    deleted by the look that deals with it, whatever became of the job (here: resumed by hand and
    paused anew until later, so the first end must not resume it)."""
    headers, _ = await new_key(store)
    job = await create(client, headers)
    jid = uuid.UUID(job["id"])
    soon = datetime.now(UTC) + timedelta(seconds=0.3)
    later = datetime.now(UTC) + timedelta(hours=1)
    await client.post(f"/v1/jobs/{job['id']}/pause", json={"until": rfc3339(soon)}, headers=headers)
    await client.post(f"/v1/jobs/{job['id']}/resume", headers=headers)
    await client.post(f"/v1/jobs/{job['id']}/pause", json={"until": rfc3339(later)}, headers=headers)
    conn = await asyncpg.connect(pg_dsn)
    try:
        ends = "SELECT until FROM pause_ends WHERE job_id = $1 ORDER BY until"
        assert [r["until"] for r in await conn.fetch(ends, jid)] == [soon, later]
        await asyncio.sleep(max(0.0, (soon - datetime.now(UTC)).total_seconds()) + 0.05)
        assert await store.end_pauses(shard_of(jid), limit=500) == 0
        assert [r["until"] for r in await conn.fetch(ends, jid)] == [later]
    finally:
        await conn.close()
    got = await (await client.get(f"/v1/jobs/{job['id']}", headers=headers)).json()
    assert got["state"] == "paused" and got["paused"]["until"] == rfc3339(later)
