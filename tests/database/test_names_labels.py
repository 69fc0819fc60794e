"""Unique names, PUT by name, labels and bulk actions, through HTTP on the real PostgreSQL store.

States the API cannot reach on its own (completed, dead) and rows as an engine would hold them
(claimed) are set up with plain SQL on the test database.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import asyncpg
import pytest

from duetime.api.app import create_app
from duetime.core.ids import shard_of
from duetime.core.ssrf import AddressPolicy
from duetime.core.validation import parse_job_spec
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.support.fixtures import Client, api_owner, serve


@pytest.fixture(scope="module")
async def client(store: PostgresStore) -> AsyncIterator[Client]:
    """The API with a small bound on bulk actions, so a test can pass it."""
    async with serve(create_app(store, policy=AddressPolicy(), bulk_max=50)) as c:
        yield c


def spec(**overrides: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "target": {"type": "webhook", "url": "https://1.1.1.1/hook", "headers": {"X-Token": "s3cret"}},
        "schedule": {"cron": "*/5 * * * *"},
    }
    out.update(overrides)
    return out


async def put(client: Client, headers: dict[str, str], name: str, body: dict[str, Any]) -> tuple[int, Any]:
    resp = await client.put(f"/v1/jobs/by-name/{name}", json=body, headers=headers)
    return resp.status, await resp.json()


# ---------------------------------------------------------------------------------- names, PUT


async def test_put_creates_then_updates_then_is_a_no_op(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    status, made = await put(client, headers, "billing/nightly", spec(labels={"team": "billing"}))
    assert status == 201, made
    assert made["name"] == "billing/nightly" and made["labels"] == {"team": "billing"}
    resp = await client.put("/v1/jobs/by-name/billing/nightly", json=spec(), headers=headers)
    assert resp.status == 200
    updated = await resp.json()
    assert updated["id"] == made["id"]
    assert updated["labels"] == {}  # a PUT is a PATCH of every field: absent means the default
    assert updated["target"]["headers"] == {"X-Token": "<redacted>"}
    again = await client.put("/v1/jobs/by-name/billing/nightly", json=spec(), headers=headers)
    assert again.status == 200
    same = await again.json()
    assert same == updated  # nothing written: updated_at unchanged
    # The redacted placeholder sent back keeps the secret and is no change either.
    echoed = spec(target={**spec()["target"], "headers": {"X-Token": "<redacted>"}})
    status, body = await put(client, headers, "billing/nightly", echoed)
    assert status == 200 and body["updated_at"] == updated["updated_at"]
    resp = await client.get("/v1/jobs/by-name/billing/nightly", headers=headers)
    assert resp.status == 200 and (await resp.json())["id"] == made["id"]
    # The same name through an encoded slash names the same job.
    resp = await client.get(f"/v1/jobs/by-name/{quote('billing/nightly', safe='')}", headers=headers)
    assert resp.status == 200 and (await resp.json())["id"] == made["id"]


async def test_put_keeps_the_state_and_recomputes_a_changed_schedule(
    client: Client, store: PostgresStore
) -> None:
    _, headers = await api_owner(store)
    _, made = await put(client, headers, "x", spec())
    assert (await client.post(f"/v1/jobs/{made['id']}/pause", headers=headers)).status == 200
    status, body = await put(client, headers, "x", spec(schedule={"cron": "0 3 * * *"}))
    assert status == 200
    assert body["state"] == "paused"
    assert body["schedule"]["cron"] == "0 3 * * *"
    assert body["next_run_at"].endswith("T03:00:00Z")


async def test_a_repeated_put_of_an_every_schedule_without_start_at_is_a_no_op(
    client: Client, store: PostgresStore
) -> None:
    """``start_at`` of an ``every`` schedule defaults to the time of the call: a PUT that leaves
    it out keeps the stored one (as a PATCH would), so the same body again changes nothing."""
    _, headers = await api_owner(store)
    body = spec(schedule={"every": "1h"})
    status, made = await put(client, headers, "hourly", body)
    assert status == 201, made
    await asyncio.sleep(1.1)  # a new default start_at would now be a different second
    status, again = await put(client, headers, "hourly", body)
    assert status == 200, again
    assert again == made  # nothing written: same start_at, same updated_at
    status, changed = await put(client, headers, "hourly", spec(schedule={"every": "2h"}))
    assert status == 200 and changed["schedule"]["start_at"] == made["schedule"]["start_at"]
    assert changed["schedule"]["every"] == "2h" and changed["updated_at"] != made["updated_at"]
    moved = "2030-01-01T00:00:00Z"
    status, body2 = await put(client, headers, "hourly", spec(schedule={"every": "2h", "start_at": moved}))
    assert status == 200 and body2["schedule"]["start_at"] == moved


async def test_put_refuses_a_change_to_a_completed_or_dead_job_but_not_a_no_op(
    client: Client, store: PostgresStore, db: asyncpg.Connection
) -> None:
    _, headers = await api_owner(store)
    for state in ("completed", "dead"):
        name = f"done-{state}"
        _, made = await put(client, headers, name, spec())
        await db.execute("UPDATE jobs SET state = $2 WHERE job_id = $1", uuid.UUID(made["id"]), state)
        status, body = await put(client, headers, name, spec())
        assert status == 200 and body["state"] == state and body["updated_at"] == made["updated_at"]
        status, body = await put(client, headers, name, spec(jitter_s=5))
        assert status == 409, body
        assert body["error"]["code"] == f"job_{state}"


async def test_put_name_must_match_and_be_valid(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    status, body = await put(client, headers, "a", spec(name="b"))
    assert status == 422 and body["error"]["code"] == "name_mismatch" and body["error"]["field"] == "name"
    status, body = await put(client, headers, "a", spec(name=None))
    assert status == 422 and body["error"]["code"] == "name_mismatch"
    status, body = await put(client, headers, "a", spec(name="a"))
    assert status == 201
    status, body = await put(client, headers, "bad%20name", spec())
    assert status == 422 and body["error"]["field"] == "name"
    resp = await client.get("/v1/jobs/by-name/bad%20name", headers=headers)
    assert resp.status == 404
    resp = await client.get("/v1/jobs/by-name/nothing-here", headers=headers)
    assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_found"


DOT_SEGMENT_NAMES = (".", "..", "a/../b", "a/./b", "../a", "./a", "a/..", "a/.", "a//../b")


async def test_a_new_name_with_a_dot_segment_is_refused(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    for name in DOT_SEGMENT_NAMES:
        resp = await client.post("/v1/jobs", json=spec(name=name), headers=headers)
        body = await resp.json()
        assert resp.status == 422, (name, body)
        assert (body["error"]["code"], body["error"]["field"]) == ("invalid_name", "name"), name
    # PUT by name: the URL's dot segments are resolved before routing (even percent-encoded), so
    # such a name never reaches the handler; a body naming one differs from the URL's
    status, body = await put(client, headers, "x/%2E%2E", spec())
    assert status in (404, 422) and body["error"]["code"] in ("not_found", "invalid_name"), body
    status, body = await put(client, headers, "x", spec(name="x/.."))
    assert status == 422 and body["error"]["field"] == "name", body
    # a rename to such a name is refused too
    made = await (await client.post("/v1/jobs", json=spec(name="plain"), headers=headers)).json()
    resp = await client.patch(f"/v1/jobs/{made['id']}", json={"name": "plain/.."}, headers=headers)
    assert resp.status == 422 and (await resp.json())["error"]["code"] == "invalid_name"
    # dots that are not a whole segment are ordinary characters
    for name in ("...", ".hidden", "a..b", "a/.b/c", "v1.2", "a/b./c"):
        resp = await client.post("/v1/jobs", json=spec(name=name), headers=headers)
        assert resp.status == 201, (name, await resp.json())


async def test_a_job_stored_with_a_dot_segment_name_keeps_it(client: Client, store: PostgresStore) -> None:
    """Jobs named before the rule are left as they are: updated without a rename, they keep it."""
    _, headers = await api_owner(store)
    owner = await store.owner_for_key(headers["Authorization"].removeprefix("Bearer "))
    assert owner is not None
    base = parse_job_spec(spec(), now=datetime.now(UTC))
    job, _ = await store.create_job(owner, dataclasses.replace(base, name="old/../name"))
    resp = await client.patch(f"/v1/jobs/{job.id}", json={"jitter_s": 3}, headers=headers)
    assert resp.status == 200, await resp.json()
    assert (await resp.json())["name"] == "old/../name"


async def test_a_name_with_a_route_word_is_still_a_name(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    for name in ("pause", "x/pause", "runs", "a/b/resume"):
        status, body = await put(client, headers, name, spec())
        assert status == 201, (name, body)
        assert body["name"] == name


async def test_post_and_patch_taking_a_name_in_use_answer_name_taken(
    client: Client, store: PostgresStore
) -> None:
    _, headers = await api_owner(store)
    first = await (await client.post("/v1/jobs", json=spec(name="report"), headers=headers)).json()
    resp = await client.post("/v1/jobs", json=spec(name="report"), headers=headers)
    assert resp.status == 409
    error = (await resp.json())["error"]
    assert error["code"] == "name_taken" and first["id"] in error["message"]
    other = await (await client.post("/v1/jobs", json=spec(name="other"), headers=headers)).json()
    resp = await client.patch(f"/v1/jobs/{other['id']}", json={"name": "report"}, headers=headers)
    assert resp.status == 409 and (await resp.json())["error"]["code"] == "name_taken"
    # Renaming to a free name frees the old one; renaming to its own name is no conflict.
    resp = await client.patch(f"/v1/jobs/{first['id']}", json={"name": "report-v2"}, headers=headers)
    assert resp.status == 200
    resp = await client.patch(
        f"/v1/jobs/{first['id']}", json={"name": "report-v2", "jitter_s": 3}, headers=headers
    )
    assert resp.status == 200
    resp = await client.patch(f"/v1/jobs/{other['id']}", json={"name": "report"}, headers=headers)
    assert resp.status == 200
    # A cancelled job holds no name.
    assert (await client.delete(f"/v1/jobs/{other['id']}", headers=headers)).status == 200
    resp = await client.post("/v1/jobs", json=spec(name="report"), headers=headers)
    assert resp.status == 201
    # Names are per owner.
    _, stranger = await api_owner(store)
    resp = await client.post("/v1/jobs", json=spec(name="report"), headers=stranger)
    assert resp.status == 201
    resp = await client.get("/v1/jobs/by-name/report-v2", headers=stranger)
    assert resp.status == 404


async def test_an_idempotent_replay_of_a_named_create_is_not_name_taken(
    client: Client, store: PostgresStore
) -> None:
    headers = {**(await api_owner(store)).headers, "Idempotency-Key": "deploy-1"}
    first = await client.post("/v1/jobs", json=spec(name="idem"), headers=headers)
    assert first.status == 201
    again = await client.post("/v1/jobs", json=spec(name="idem"), headers=headers)
    assert again.status == 200 and (await again.json())["id"] == (await first.json())["id"]
    other = await client.post("/v1/jobs", json=spec(name="idem", jitter_s=1), headers=headers)
    assert other.status == 422 and (await other.json())["error"]["code"] == "idempotency_key_reused"


async def test_concurrent_puts_of_one_name_make_one_job(
    client: Client, store: PostgresStore, db: asyncpg.Connection
) -> None:
    _, headers = await api_owner(store)
    results = await asyncio.gather(*(put(client, headers, "race", spec(jitter_s=i % 3)) for i in range(20)))
    assert [s for s, _ in results].count(201) == 1, results
    assert {s for s, _ in results} <= {200, 201}
    assert len({b["id"] for _, b in results}) == 1
    owner = results[0][1]["owner"]
    count = await db.fetchval(
        "SELECT count(*) FROM jobs WHERE owner = $1 AND spec->>'name' = 'race' AND parent_id IS NULL", owner
    )
    assert count == 1


async def test_concurrent_posts_of_one_name_make_one_job(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    answers = await asyncio.gather(
        *(client.post("/v1/jobs", json=spec(name="post-race"), headers=headers) for _ in range(10))
    )
    assert sorted(a.status for a in answers) == [201] + [409] * 9


async def test_names_are_unique_across_databases(pg_dsn_pair: tuple[str, str]) -> None:
    """Shards on two primaries: the name's lock on the home database keeps one holder."""
    from duetime.core.codec import spec_from_json
    from duetime.core.errors import Conflict

    a, b = pg_dsn_pair
    two = await PostgresStore.open(ShardMap.from_dsns([a] * 8 + [b] * 8))
    try:
        owner = f"owner-{uuid.uuid4().hex[:8]}"
        made = []
        taken = 0
        # Random ids land on both databases; every create after the first must be refused.
        for _ in range(12):
            try:
                made.append(await two.create_job(owner, spec_from_json(_stored(spec(name="one")))))
            except Conflict as exc:
                assert exc.code == "name_taken"
                taken += 1
        assert len(made) == 1 and taken == 11
        racing = await asyncio.gather(
            *(
                two.apply_job(owner, spec_from_json(_stored(spec(name="two"))), expected_id=None)
                for _ in range(8)
            ),
            return_exceptions=True,
        )
        created = [r for r in racing if isinstance(r, tuple) and r[1]]
        assert len(created) == 1
        assert (await two.get_job_by_name(owner, "two")).id == created[0][0].id
    finally:
        await two.close()


def _stored(body: dict[str, Any]) -> dict[str, Any]:
    from duetime.core.codec import spec_to_json
    from duetime.core.validation import parse_job_spec

    return spec_to_json(parse_job_spec(body, now=datetime.now(UTC)))


# ---------------------------------------------------------------------------------- labels


async def _pages(client: Client, headers: dict[str, str], query: str, limit: int = 7) -> list[str]:
    ids: list[str] = []
    cursor = ""
    while True:
        resp = await client.get(f"/v1/jobs?{query}&limit={limit}&cursor={cursor}", headers=headers)
        assert resp.status == 200, await resp.text()
        page = await resp.json()
        ids.extend(j["id"] for j in page["items"])
        if page["next_cursor"] is None:
            return ids
        cursor = page["next_cursor"]
        await asyncio.sleep(0)


async def test_label_filters_page_each_match_once_under_concurrent_inserts(
    client: Client, store: PostgresStore
) -> None:
    _, headers = await api_owner(store)

    async def make(labels: dict[str, str], name: str | None = None) -> str:
        resp = await client.post("/v1/jobs", json=spec(labels=labels, name=name), headers=headers)
        assert resp.status == 201, await resp.text()
        return str((await resp.json())["id"])

    both = [await make({"team": "a", "env": "prod"}, name=f"svc/a-{i}") for i in range(15)]
    only_team = [await make({"team": "a", "env": "dev"}) for _ in range(10)]
    other = [await make({"team": "b"}) for _ in range(5)]

    async def insert_more() -> list[str]:
        return [await make({"team": "a", "env": "prod"}) for _ in range(15)]

    listed, team_a, added = await asyncio.gather(
        _pages(client, headers, "label=team%3Da&label=env%3Dprod"),
        _pages(client, headers, "label=team=a"),
        insert_more(),
    )
    assert len(listed) == len(set(listed))
    assert set(both) <= set(listed) <= set(both) | set(added)
    assert set(both) | set(only_team) <= set(team_a) <= set(both) | set(only_team) | set(added)
    assert not set(other) & set(team_a)
    assert listed == sorted(listed, key=uuid.UUID)
    # Afterwards, everything once.
    assert set(await _pages(client, headers, "label=env=prod")) == set(both) | set(added)
    assert set(await _pages(client, headers, "name_prefix=svc/a-")) == set(both)
    assert set(await _pages(client, headers, "name_prefix=svc/a-1&label=team=a")) == {
        j for i, j in enumerate(both) if str(i).startswith("1")
    }
    assert await _pages(client, headers, "label=team=c") == []
    first = (await (await client.get("/v1/jobs?label=team=b", headers=headers)).json())["items"][0]
    assert first["labels"] == {"team": "b"}
    # Another owner's jobs are never listed.
    assert await _pages(client, (await api_owner(store)).headers, "label=team=a") == []


async def test_label_query_errors(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    for query, code in (
        ("label=team", "invalid_label"),
        ("label=Team=a", "invalid_label"),
        ("name_prefix=a%20b", "invalid_value"),
    ):
        resp = await client.get(f"/v1/jobs?{query}", headers=headers)
        assert resp.status == 422, query
        assert (await resp.json())["error"]["code"] == code


async def test_label_repeats_and_name_prefix_does_not(client: Client, store: PostgresStore) -> None:
    """``label`` is the one query parameter the contract lets repeat (AND); a repeated
    ``name_prefix`` is 400 duplicate_parameter like any other."""
    _, headers = await api_owner(store)
    _, both = await put(client, headers, "r/both", spec(labels={"a": "1", "b": "2"}))
    await put(client, headers, "r/one", spec(labels={"a": "1"}))
    resp = await client.get("/v1/jobs?label=a%3D1&label=b%3D2", headers=headers)
    assert resp.status == 200
    assert [j["id"] for j in (await resp.json())["items"]] == [both["id"]]
    resp = await client.get("/v1/jobs?name_prefix=r/&name_prefix=x", headers=headers)
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["code"] == "duplicate_parameter" and error["field"] == "name_prefix"


async def test_patch_replaces_labels(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    job = await (
        await client.post("/v1/jobs", json=spec(labels={"a": "1", "b": "2"}), headers=headers)
    ).json()
    resp = await client.patch(f"/v1/jobs/{job['id']}", json={"labels": {"c": "3"}}, headers=headers)
    assert (await resp.json())["labels"] == {"c": "3"}
    assert await _pages(client, headers, "label=a=1") == []
    assert await _pages(client, headers, "label=c=3") == [job["id"]]


# ---------------------------------------------------------------------------------- bulk


async def test_bulk_pause_resume_cancel(client: Client, store: PostgresStore, db: asyncpg.Connection) -> None:
    _, headers = await api_owner(store)
    ids = []
    for i in range(120):  # more than the client fixture's bulk_max of 50
        resp = await client.post(
            "/v1/jobs", json=spec(labels={"fleet": "x", "i": str(i % 2)}), headers=headers
        )
        ids.append((await resp.json())["id"])
    # One row as an engine holds it: claimed, leased. The bulk pause gives the lease back.
    claimed = uuid.UUID(ids[0])
    await db.execute(
        "UPDATE jobs SET phase = 'claimed', claimed_by = 'e1', leased_until = now() + interval '1 minute',"
        " lease_token = lease_token + 1 WHERE job_id = $1",
        claimed,
    )
    bodies = []
    while True:
        resp = await client.post("/v1/jobs/bulk/pause", json={"labels": {"fleet": "x"}}, headers=headers)
        assert resp.status == 200
        bodies.append(await resp.json())
        if not bodies[-1]["more"]:
            break
    assert bodies == [
        {"matched": 50, "changed": 50, "more": True},
        {"matched": 50, "changed": 50, "more": True},
        {"matched": 20, "changed": 20, "more": False},
    ]
    row = await db.fetchrow(
        "SELECT state, phase, claimed_by, leased_until FROM jobs WHERE job_id = $1", claimed
    )
    assert dict(row) == {"state": "paused", "phase": "idle", "claimed_by": None, "leased_until": None}
    states = await db.fetch(
        "SELECT DISTINCT state FROM jobs WHERE job_id = ANY($1::uuid[])", [uuid.UUID(i) for i in ids]
    )
    assert [r["state"] for r in states] == ["paused"]
    again = await client.post("/v1/jobs/bulk/pause", json={"labels": {"fleet": "x"}}, headers=headers)
    assert await again.json() == {"matched": 0, "changed": 0, "more": False}
    resp = await client.post(
        "/v1/jobs/bulk/resume", json={"labels": {"fleet": "x", "i": "0"}}, headers=headers
    )
    assert await resp.json() == {"matched": 50, "changed": 50, "more": True}
    resp = await client.post(
        "/v1/jobs/bulk/cancel", json={"labels": {"fleet": "x"}, "state": "scheduled"}, headers=headers
    )
    assert await resp.json() == {"matched": 50, "changed": 50, "more": False}
    counts = dict(
        await db.fetch(
            "SELECT state, count(*) FROM jobs WHERE job_id = ANY($1::uuid[]) GROUP BY state",
            [uuid.UUID(i) for i in ids],
        )
    )
    assert counts == {"paused": 70, "cancelled": 50}
    assert (
        await db.fetchval(
            "SELECT count(*) FROM jobs WHERE job_id = ANY($1::uuid[]) AND state = 'cancelled'"
            " AND next_run_at IS NOT NULL",
            [uuid.UUID(i) for i in ids],
        )
        == 0
    )


async def test_bulk_never_touches_another_owner(
    client: Client, store: PostgresStore, db: asyncpg.Connection
) -> None:
    (_, mine), (_, theirs) = await api_owner(store), await api_owner(store)
    their_ids = []
    for _ in range(5):
        resp = await client.post("/v1/jobs", json=spec(labels={"shared": "label"}), headers=theirs)
        their_ids.append(uuid.UUID((await resp.json())["id"]))
    resp = await client.post("/v1/jobs/bulk/cancel", json={"labels": {"shared": "label"}}, headers=mine)
    assert await resp.json() == {"matched": 0, "changed": 0, "more": False}
    states = {
        r["state"] for r in await db.fetch("SELECT state FROM jobs WHERE job_id = ANY($1::uuid[])", their_ids)
    }
    assert states == {"scheduled"}


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({}, 422, "selector_required"),
        ({"labels": {}}, 422, "selector_required"),
        ({"state": "paused"}, 422, "selector_required"),
        ({"labels": {"a": "b"}, "state": "nope"}, 422, "invalid_state"),
        ({"labels": {"A": "b"}}, 422, "invalid_label"),
        ({"labels": "a=b"}, 400, "wrong_type"),
        ([], 400, "wrong_type"),
    ],
)
async def test_bulk_refuses_what_it_cannot_act_on(
    client: Client, store: PostgresStore, body: Any, status: int, code: str
) -> None:
    _, headers = await api_owner(store)
    resp = await client.post("/v1/jobs/bulk/pause", json=body, headers=headers)
    assert resp.status == status
    assert (await resp.json())["error"]["code"] == code


async def test_a_deadline_in_the_past_is_kept_by_put(
    client: Client, store: PostgresStore, db: asyncpg.Connection
) -> None:
    """A bounded cron whose end passed: PUT of the same schedule (a rename-free redeploy) is a
    no-op, as PATCH judges an unchanged schedule as of the job's creation."""
    _, headers = await api_owner(store)
    end = (datetime.now(UTC) + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = spec(schedule={"cron": "*/5 * * * *", "end_at": end})
    status, made = await put(client, headers, "bounded", body)
    assert status == 201
    past_end = (datetime.now(UTC) - timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    await db.execute(
        "UPDATE jobs SET created_at = created_at - interval '2 hours',"
        " spec = jsonb_set(spec, '{schedule,end_at}', to_jsonb($2::text)) WHERE job_id = $1",
        uuid.UUID(made["id"]),
        past_end,
    )
    status, again = await put(
        client, headers, "bounded", spec(schedule={"cron": "*/5 * * * *", "end_at": past_end})
    )
    assert status == 200, again


async def test_the_label_table_follows_every_write(
    client: Client, store: PostgresStore, db: asyncpg.Connection
) -> None:
    """job_labels is kept by triggers: after creates (batched and single), PATCH, PUT, bulk
    cancel and a delete it holds exactly the pairs the owner's job rows carry."""
    _, headers = await api_owner(store)
    made = await asyncio.gather(
        *(
            client.post("/v1/jobs", json=spec(labels={"a": str(i % 3), "b": "x"}), headers=headers)
            for i in range(30)
        )
    )
    ids = [uuid.UUID((await r.json())["id"]) for r in made]
    owner = (await made[0].json())["owner"]
    await client.patch(f"/v1/jobs/{ids[0]}", json={"labels": {"c": "new"}}, headers=headers)
    await client.patch(f"/v1/jobs/{ids[1]}", json={"jitter_s": 2}, headers=headers)
    await put(client, headers, "named", spec(labels={"a": "0"}))
    await put(client, headers, "named", spec(labels={"a": "1", "d": ""}))
    await client.post("/v1/jobs/bulk/cancel", json={"labels": {"a": "2"}}, headers=headers)
    await db.execute("DELETE FROM jobs WHERE job_id = $1", ids[3])

    async def pairs() -> tuple[set[tuple[str, str, str]], set[tuple[str, str, str]]]:
        want = {
            (str(r["job_id"]), k, v)
            for r in await db.fetch(
                "SELECT job_id, spec FROM jobs WHERE owner = $1 AND parent_id IS NULL", owner
            )
            for k, v in (r["spec"] if isinstance(r["spec"], dict) else json.loads(r["spec"]))[
                "labels"
            ].items()
        }
        have = {
            (str(r["job_id"]), r["key"], r["value"])
            for r in await db.fetch("SELECT job_id, key, value FROM job_labels WHERE owner = $1", owner)
        }
        return want, have

    want, have = await pairs()
    assert want == have
    assert (str(ids[0]), "c", "new") in have and (str(ids[0]), "a", "0") not in have
    assert not any(j == str(ids[3]) for j, _, _ in have)


@pytest.fixture
async def own_pair(run_tag: str) -> AsyncIterator[tuple[str, str]]:
    """Two fresh databases: a shard move needs a target that holds nothing of the shard."""
    from tests.conftest import _create_db, _drop_db

    names = [f"duetime_test_{run_tag}_mv{i}_{uuid.uuid4().hex[:4]}" for i in range(2)]
    dsns = [await _create_db(n) for n in names]
    yield dsns[0], dsns[1]
    for n in names:
        await _drop_db(n)


async def test_labels_and_names_move_with_their_shard(own_pair: tuple[str, str]) -> None:
    """A shard move copies job rows with COPY: the target's triggers build their label rows, the
    source's delete theirs, and the moved jobs are found by label and by name on the target."""
    from duetime.core.codec import spec_from_json
    from duetime.storage.postgres import move_shard

    a, b = own_pair
    owner = f"owner-{uuid.uuid4().hex[:8]}"
    before = await PostgresStore.open(ShardMap.single(a))
    try:
        made = [
            (
                await before.create_job(
                    owner, spec_from_json(_stored(spec(name=f"m{i}", labels={"move": "me"})))
                )
            )[0]
            for i in range(40)
        ]
    finally:
        await before.close()
    moving = shard_of(uuid.UUID(made[0].id))
    report = await move_shard(moving, a, b)
    assert report.jobs == sum(1 for j in made if shard_of(uuid.UUID(j.id)) == moving)
    after = await PostgresStore.open(ShardMap.from_dsns([b if s == moving else a for s in range(16)]))
    try:
        listed = await after.list_jobs(owner, state=None, limit=1000, cursor=None, labels={"move": "me"})
        assert sorted(j.id for j in listed.items) == sorted(j.id for j in made)
        mover = next(j for j in made if shard_of(uuid.UUID(j.id)) == moving)
        assert (await after.get_job_by_name(owner, mover.spec.name or "")).id == mover.id
    finally:
        await after.close()
    src, dst = await asyncpg.connect(a), await asyncpg.connect(b)
    try:
        moved = [uuid.UUID(j.id) for j in made if shard_of(uuid.UUID(j.id)) == moving]
        assert (
            await src.fetchval("SELECT count(*) FROM job_labels WHERE job_id = ANY($1::uuid[])", moved) == 0
        )
        assert await dst.fetchval(
            "SELECT count(*) FROM job_labels WHERE job_id = ANY($1::uuid[])", moved
        ) == len(moved)
    finally:
        await src.close()
        await dst.close()
