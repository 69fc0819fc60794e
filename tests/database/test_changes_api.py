"""Change history over HTTP (issue 30, item 1), on the real server and PostgreSQL store.

The contract (api-v1.md, "Additions: why a job did or did not run"): every call that changes a job
takes ``Duetime-Reason`` (printable, at most 500 characters, else 422 ``invalid_reason``);
``GET /v1/jobs/{id}/changes`` lists the records newest first, each naming the API key that made
the change; another owner's job answers 404; Jobs and Runs carry ``spec_version``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from duetime.api.app import create_app
from duetime.core.ids import shard_of
from duetime.core.ssrf import AddressPolicy
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap

Client = TestClient[web.Request, web.Application]
PUBLIC_URL = "https://1.1.1.1/hook"
SECRET = "a-header-secret-77"


@pytest.fixture(scope="module")
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    opened = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=4)
    yield opened
    await opened.close()


@pytest.fixture(scope="module")
async def client(store: PostgresStore) -> AsyncIterator[Client]:
    async with TestClient(TestServer(create_app(store, policy=AddressPolicy()), host="127.0.0.1")) as c:
        yield c


async def new_key(store: PostgresStore, owner: str | None = None) -> tuple[dict[str, str], str]:
    """An API key (of a new owner unless one is named): its auth header and its id (prefix)."""
    api_key, _ = await store.create_api_key(owner or f"owner-{uuid.uuid4().hex[:12]}")
    return {"Authorization": f"Bearer {api_key}"}, api_key[:10]


def spec(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "target": {"type": "webhook", "url": PUBLIC_URL, "headers": {"X-Token": SECRET}},
        "schedule": {"cron": "0 3 * * *"},
    }
    body.update(overrides)
    return body


async def changes(client: Client, headers: dict[str, str], job_id: str) -> list[dict[str, Any]]:
    resp = await client.get(f"/v1/jobs/{job_id}/changes", headers=headers)
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["next_cursor"] is None
    items: list[dict[str, Any]] = body["items"]
    return items


async def test_each_change_names_its_key_and_reason_newest_first(
    client: Client, store: PostgresStore
) -> None:
    alice, alice_id = await new_key(store)
    resp = await client.post(
        "/v1/jobs", json=spec(), headers={**alice, "Duetime-Reason": "Müller's rollout ✓"}
    )
    assert resp.status == 201
    job = await resp.json()
    assert job["spec_version"] == 1
    job_id = job["id"]
    owner_name = job["owner"]
    bob, bob_id = await new_key(store, owner_name)  # a second key of the same owner

    patched = await client.patch(
        f"/v1/jobs/{job_id}",
        json={
            "schedule": {"cron": "0 4 * * *"},
            "target": {"type": "webhook", "url": PUBLIC_URL, "headers": {"X-Token": "rotated"}},
        },
        headers={**bob, "Duetime-Reason": "later, and a new token"},
    )
    assert patched.status == 200, await patched.text()
    assert (await patched.json())["spec_version"] == 2
    assert (await client.post(f"/v1/jobs/{job_id}/pause", headers=alice)).status == 200
    assert (
        await client.delete(f"/v1/jobs/{job_id}", headers={**bob, "Duetime-Reason": "gone"})
    ).status == 200

    cancel, pause, update, create = await changes(client, alice, job_id)
    assert [c["seq"] for c in (cancel, pause, update, create)] == [4, 3, 2, 1]
    assert create["action"] == "create" and create["actor"] == {"type": "owner", "key_id": alice_id}
    assert create["reason"] == "Müller's rollout ✓" and create["spec_version"] == 1
    assert create["diff"][""]["from"] is None
    assert create["diff"][""]["to"]["target"]["headers"] == {"X-Token": "<redacted>"}
    assert create["diff"][""]["to"]["schedule"]["cron"] == "0 3 * * *"
    assert update == {
        "seq": 2,
        "at": update["at"],
        "actor": {"type": "owner", "key_id": bob_id},
        "action": "update",
        "reason": "later, and a new token",
        "spec_version": 2,
        "diff": {
            "/target/headers/X-Token": {"from": "<redacted>", "to": "<redacted>"},
            "/schedule/cron": {"from": "0 3 * * *", "to": "0 4 * * *"},
        },
    }
    assert (pause["action"], pause["reason"], pause["diff"], pause["spec_version"]) == ("pause", None, {}, 2)
    assert (cancel["action"], cancel["actor"]["key_id"], cancel["reason"]) == ("cancel", bob_id, "gone")
    assert create["at"].endswith("Z") and update["at"] <= cancel["at"]
    everything = str(await changes(client, alice, job_id))
    assert SECRET not in everything and "rotated" not in everything


@pytest.mark.parametrize(
    "reason",
    ["x" * 501, "two\tcolumns"],
    ids=["501 characters", "a tab"],
)
async def test_an_unacceptable_reason_is_422_on_every_changing_call_and_changes_nothing(
    client: Client, store: PostgresStore, reason: str
) -> None:
    headers, _ = await new_key(store)
    job_id = (await (await client.post("/v1/jobs", json=spec(labels={"t": "1"}), headers=headers)).json())[
        "id"
    ]
    bad = {**headers, "Duetime-Reason": reason}
    calls = [
        client.post("/v1/jobs", json=spec(), headers=bad),
        client.patch(f"/v1/jobs/{job_id}", json={"payload": 1}, headers=bad),
        client.put("/v1/jobs/by-name/reasoned", json=spec(), headers=bad),
        client.delete(f"/v1/jobs/{job_id}", headers=bad),
        client.post(f"/v1/jobs/{job_id}/pause", headers=bad),
        client.post(f"/v1/jobs/{job_id}/resume", headers=bad),
        client.post(f"/v1/jobs/{job_id}/trigger", headers=bad),
        client.post(f"/v1/jobs/{job_id}/replay", headers=bad),
        client.post(
            f"/v1/jobs/{job_id}/backfill",
            json={"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"},
            headers=bad,
        ),
        *(
            client.post(f"/v1/jobs/bulk/{a}", json={"labels": {"t": "1"}}, headers=bad)
            for a in ("pause", "resume", "cancel")
        ),
    ]
    for call in calls:
        resp = await call
        assert resp.status == 422, (resp.method, resp.url, await resp.text())
        error = (await resp.json())["error"]
        assert (error["code"], error["field"]) == ("invalid_reason", "Duetime-Reason")
        assert "500 characters" in error["message"]
    job = await (await client.get(f"/v1/jobs/{job_id}", headers=headers)).json()
    assert (job["state"], job["payload"], job["spec_version"]) == ("scheduled", None, 1)
    assert [c["action"] for c in await changes(client, headers, job_id)] == ["create"]
    assert (await (await client.get("/v1/jobs", headers=headers)).json())["items"] == [job]


async def test_a_reason_of_500_characters_or_none_is_accepted_and_two_are_400(
    client: Client, store: PostgresStore
) -> None:
    headers, _ = await new_key(store)
    longest = "é" * 500
    resp = await client.post("/v1/jobs", json=spec(), headers={**headers, "Duetime-Reason": longest})
    assert resp.status == 201
    job_id = (await resp.json())["id"]
    empty = await client.post(f"/v1/jobs/{job_id}/pause", headers={**headers, "Duetime-Reason": ""})
    assert empty.status == 200
    paused, created = await changes(client, headers, job_id)
    assert (created["reason"], paused["reason"]) == (longest, None)
    two = await client.post(
        f"/v1/jobs/{job_id}/resume",
        headers=[*headers.items(), ("Duetime-Reason", "a"), ("Duetime-Reason", "b")],
    )
    assert two.status == 400 and (await two.json())["error"]["code"] == "duplicate_header"
    assert (await client.get(f"/v1/jobs/{job_id}", headers=headers)).status == 200


async def test_another_owners_job_has_no_changes_for_you(client: Client, store: PostgresStore) -> None:
    alice, _ = await new_key(store)
    mallory, _ = await new_key(store)
    job_id = (await (await client.post("/v1/jobs", json=spec(), headers=alice)).json())["id"]
    for path in (f"/v1/jobs/{job_id}/changes", f"/v1/jobs/{uuid.uuid4()}/changes", "/v1/jobs/nope/changes"):
        resp = await client.get(path, headers=mallory)
        assert resp.status == 404, path
        assert (await resp.json())["error"]["code"] == "not_found"
    # Nor may another owner change it with a reason (and nothing is recorded).
    resp = await client.post(f"/v1/jobs/{job_id}/pause", headers={**mallory, "Duetime-Reason": "x"})
    assert resp.status == 404
    assert [c["action"] for c in await changes(client, alice, job_id)] == ["create"]
    assert (await client.get(f"/v1/jobs/{job_id}/changes")).status == 401


async def test_paging_and_limits(client: Client, store: PostgresStore) -> None:
    headers, _ = await new_key(store)
    job_id = (await (await client.post("/v1/jobs", json=spec(), headers=headers)).json())["id"]
    for _ in range(2):
        await client.post(f"/v1/jobs/{job_id}/pause", headers=headers)
        await client.post(f"/v1/jobs/{job_id}/resume", headers=headers)
    seen: list[int] = []
    cursor: str | None = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = await (await client.get(f"/v1/jobs/{job_id}/changes", params=params, headers=headers)).json()
        seen += [c["seq"] for c in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [5, 4, 3, 2, 1]
    for bad in ("0", "1001", "x"):
        resp = await client.get(f"/v1/jobs/{job_id}/changes", params={"limit": bad}, headers=headers)
        assert resp.status == 422 and (await resp.json())["error"]["field"] == "limit"


async def test_put_by_name_bulk_trigger_replay_and_backfill_are_recorded(
    client: Client, store: PostgresStore, pg_dsn: str
) -> None:
    headers, key_id = await new_key(store)
    why = {**headers, "Duetime-Reason": "deploy 42"}
    name = f"named-{uuid.uuid4().hex[:8]}"
    created = await client.put(f"/v1/jobs/by-name/{name}", json=spec(labels={"g": name}), headers=why)
    assert created.status == 201
    job_id = (await created.json())["id"]
    same = await client.put(f"/v1/jobs/by-name/{name}", json=spec(labels={"g": name}), headers=why)
    assert same.status == 200 and (await same.json())["spec_version"] == 1  # nothing changed: no record
    replaced = await client.put(
        f"/v1/jobs/by-name/{name}", json=spec(labels={"g": name}, jitter_s=5), headers=why
    )
    assert (await replaced.json())["spec_version"] == 2
    assert (await client.post(f"/v1/jobs/{job_id}/trigger", headers=why)).status == 202
    backfill = await client.post(
        f"/v1/jobs/{job_id}/backfill",
        json={"from": "2026-01-01T00:00:00Z", "to": "2026-01-03T00:00:00Z"},
        headers=why,
    )
    assert backfill.status == 202 and (await backfill.json())["queued"] == 2
    bulk = await client.post("/v1/jobs/bulk/pause", json={"labels": {"g": name}}, headers=why)
    assert (await bulk.json())["changed"] == 1
    # A dead one-off to replay: the history a failed last attempt leaves, set with SQL.
    dead = await client.post(
        "/v1/jobs", json=spec(schedule={"run_at": "2030-01-01T00:00:00Z"}), headers=headers
    )
    dead_id = (await dead.json())["id"]
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute("UPDATE jobs SET state = 'dead' WHERE job_id = $1", uuid.UUID(dead_id))
    finally:
        await conn.close()
    assert (await client.post(f"/v1/jobs/{dead_id}/replay", headers=why)).status == 200

    records = await changes(client, headers, job_id)
    assert [(c["seq"], c["action"], c["spec_version"]) for c in records] == [
        (5, "pause", 2),
        (4, "backfill", 2),
        (3, "trigger", 2),
        (2, "replace", 2),
        (1, "create", 1),
    ]
    assert {(c["reason"], c["actor"]["key_id"]) for c in records} == {("deploy 42", key_id)}
    assert records[3]["diff"] == {"/jitter_s": {"from": 0, "to": 5}}
    assert [c["action"] for c in await changes(client, headers, dead_id)] == ["replay", "create"]


async def test_runs_carry_the_spec_version_they_ran_under(
    client: Client, store: PostgresStore, pg_dsn: str
) -> None:
    headers, _ = await new_key(store)
    job_id = (await (await client.post("/v1/jobs", json=spec(), headers=headers)).json())["id"]
    await client.patch(f"/v1/jobs/{job_id}", json={"payload": {"v": 2}}, headers=headers)
    jid = uuid.UUID(job_id)
    conn = await asyncpg.connect(pg_dsn)
    try:  # two history rows, as the completion writes them (its tests are in tests/contract)
        for version in (1, 2):
            await conn.execute(
                "INSERT INTO runs (job_id, shard, scheduled_for, attempt, started_at, finished_at, outcome,"
                " spec_version) VALUES ($1, $2, now(), 1, now(), now(), 'succeeded', $3)",
                jid,
                shard_of(jid),
                version,
            )
    finally:
        await conn.close()
    runs = await (await client.get(f"/v1/jobs/{job_id}/runs", headers=headers)).json()
    assert [r["spec_version"] for r in runs["items"]] == [2, 1]
    owner_runs = await (await client.get("/v1/runs", headers=headers)).json()
    assert sorted(r["spec_version"] for r in owner_runs["items"]) == [1, 2]


async def test_a_reason_that_is_not_utf8_is_422(client: Client, store: PostgresStore) -> None:
    """Bytes that are not UTF-8 reach the handler as lone surrogates: not printable, so 422. (The
    HTTP parser refuses control characters other than a tab itself, with its fixed 400.)"""
    headers, _ = await new_key(store)
    job_id = (await (await client.post("/v1/jobs", json=spec(), headers=headers)).json())["id"]
    server = client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        f"POST /v1/jobs/{job_id}/pause HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: {headers['Authorization']}\r\nContent-Length: 0\r\n".encode()
        + b"Duetime-Reason: caf\xe9 latin-1\r\nConnection: close\r\n\r\n"
    )
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 422"), answer
    assert json.loads(body)["error"]["code"] == "invalid_reason"
    job = await (await client.get(f"/v1/jobs/{job_id}", headers=headers)).json()
    assert job["state"] == "scheduled"
