"""The v1 HTTP API over a real server and the real PostgreSQL store.

Every row of the contract's endpoint table, its status codes and bodies; owner isolation;
idempotency; pagination under concurrent inserts; the strict JSON edge; limits; redaction; SSRF;
and the unauthenticated probes. States the API cannot reach on its own (dead, completed, a run
history) are set up with plain SQL on the test database.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict

from duetime._version import __version__
from duetime.api.app import create_app, metrics_app
from duetime.core.errors import StorageUnavailable
from duetime.core.ids import shard_of
from duetime.core.ssrf import AddressPolicy
from duetime.storage.ports import ApiStore
from duetime.storage.postgres import PostgresStore
from tests.support.fixtures import Client, api_owner, serve

SECRET = "s3cr3t-header-VALUE-9f2e"
PUBLIC_URL = "https://1.1.1.1/hook"  # a public literal: no DNS lookup, allowed by the default policy


def in_an_hour() -> str:
    return (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")


def webhook_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "nightly-report",
        "target": {"type": "webhook", "url": PUBLIC_URL, "headers": {"X-Token": SECRET}},
        "payload": {"report": "daily", "n": [1, 2, 3]},
        "schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
    }
    spec.update(overrides)
    return spec


def queue_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": {"type": "queue", "broker": "nats", "topic": "billing.invoices"},
        "schedule": {"run_at": in_an_hour()},
    }
    spec.update(overrides)
    return spec


async def create(
    client: Client, headers: dict[str, str], spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    resp = await client.post("/v1/jobs", json=spec or queue_spec(), headers=headers)
    assert resp.status == 201, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def error_of(resp: Any, status: int) -> dict[str, Any]:
    """Assert the contract's error shape and status; return the inner error object."""
    text = await resp.text()
    assert resp.status == status, text
    assert resp.headers["Content-Type"].startswith("application/json"), resp.headers
    body = json.loads(text)
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    if status >= 500:  # a 5xx names the request id its log lines carry
        assert error["request_id"] == resp.headers["X-Request-Id"], (error, resp.headers)
        assert set(error) <= {"code", "message", "field", "request_id"}
    else:
        assert set(error) <= {"code", "message", "field"}
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    return error


async def set_state(db: asyncpg.Connection, job_id: str, state: str) -> None:
    await db.execute("UPDATE jobs SET state = $2 WHERE job_id = $1", uuid.UUID(job_id), state)


# --- create / read -----------------------------------------------------------------------------


async def test_create_answers_201_with_location_and_the_job_with_defaults(
    client: Client, store: PostgresStore
) -> None:
    _, headers = await api_owner(store)
    resp = await client.post("/v1/jobs", json=webhook_spec(), headers=headers)
    assert resp.status == 201
    assert resp.content_type == "application/json"
    job = await resp.json()
    assert resp.headers["Location"] == f"/v1/jobs/{job['id']}"
    uuid.UUID(job["id"])
    assert job["state"] == "scheduled"
    assert job["attempt"] == 0
    assert job["last_run"] is None
    assert job["name"] == "nightly-report"
    assert job["payload"] == {"report": "daily", "n": [1, 2, 3]}
    assert job["target"] == {
        "type": "webhook",
        "url": PUBLIC_URL,
        "method": "POST",
        "headers": {"X-Token": "<redacted>"},
        "timeout_s": 30,
    }
    assert job["schedule"] == {
        "cron": "0 3 * * *",
        "timezone": "Europe/Berlin",
        "start_at": None,
        "end_at": None,
        "dst_gap": "shift",
        "dst_overlap": "first",
        "exclude": [],
    }
    assert job["retry"] == {
        "max_attempts": 5,
        "backoff_initial_s": 1.0,
        "backoff_max_s": 600.0,
        "backoff_multiplier": 2.0,
        "max_duration_s": None,
    }
    assert (job["misfire"], job["misfire_grace_s"], job["jitter_s"]) == ("run_once", 60, 0)
    for name in ("created_at", "updated_at", "next_run_at"):
        assert job[name].endswith("Z")
        datetime.fromisoformat(job[name].replace("Z", "+00:00"))
    # 03:00 in Berlin is 01:00 or 02:00 UTC, depending on the season.
    next_run = datetime.fromisoformat(job["next_run_at"].replace("Z", "+00:00"))
    assert next_run > datetime.now(UTC)
    assert next_run.hour in (1, 2) and next_run.minute == 0

    got = await client.get(f"/v1/jobs/{job['id']}", headers=headers)
    assert got.status == 200
    assert await got.json() == job


async def test_request_times_accept_any_offset_and_answer_in_utc(
    client: Client, store: PostgresStore
) -> None:
    _, headers = await api_owner(store)
    run_at = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    local = run_at.astimezone(datetime.now(UTC).astimezone().tzinfo).isoformat()
    offset = run_at.astimezone(UTC).replace(tzinfo=None).isoformat() + "-05:00"
    job = await create(client, headers, queue_spec(schedule={"run_at": local}))
    assert job["schedule"]["run_at"] == run_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    job = await create(client, headers, queue_spec(schedule={"run_at": offset}))
    assert job["schedule"]["run_at"] == (run_at + timedelta(hours=5)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_invalid_spec_values_answer_422_with_the_field(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    cases = [
        (queue_spec(jitter_s=3601), "jitter_s"),
        (queue_spec(misfire="sometimes"), "misfire"),
        (queue_spec(schedule={"cron": "61 * * * *"}), "schedule.cron"),
        (queue_spec(schedule={"cron": "* * * * *", "timezone": "Mars/Olympus"}), "schedule.timezone"),
        (queue_spec(name="x" * 201), "name"),
        ({"schedule": {"run_at": in_an_hour()}}, "target"),
    ]
    for spec, field in cases:
        error = await error_of(await client.post("/v1/jobs", json=spec, headers=headers), 422)
        assert error["field"] == field, (spec, error)


async def test_wrong_types_answer_400(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    for spec in (queue_spec(jitter_s="5"), queue_spec(jitter_s=5.5), [queue_spec()], "job", 7):
        error = await error_of(await client.post("/v1/jobs", json=spec, headers=headers), 400)
        assert error["code"] == "wrong_type", (spec, error)


# --- list ----------------------------------------------------------------------------------


async def test_list_answers_items_and_next_cursor(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    ids = [(await create(client, headers))["id"] for _ in range(3)]
    resp = await client.get("/v1/jobs", headers=headers)
    assert resp.status == 200
    body = await resp.json()
    assert set(body) == {"items", "next_cursor"}
    assert [j["id"] for j in body["items"]] == sorted(ids)
    assert body["next_cursor"] is None

    first = await (await client.get("/v1/jobs?limit=2", headers=headers)).json()
    assert len(first["items"]) == 2 and isinstance(first["next_cursor"], str)
    rest = await (
        await client.get("/v1/jobs", params={"limit": "2", "cursor": first["next_cursor"]}, headers=headers)
    ).json()
    assert [j["id"] for j in first["items"] + rest["items"]] == sorted(ids)
    assert rest["next_cursor"] is None


async def test_list_treats_empty_parameters_as_absent_and_ignores_unknown_ones(
    client: Client, store: PostgresStore
) -> None:
    _, headers = await api_owner(store)
    job = await create(client, headers)
    resp = await client.get("/v1/jobs?state=&limit=&cursor=&colour=blue", headers=headers)
    assert resp.status == 200
    assert [j["id"] for j in (await resp.json())["items"]] == [job["id"]]


@pytest.mark.parametrize("limit", ["0", "1001", "abc", "1.5", "-1", "1e2", " 5", "99999999999"])
async def test_list_refuses_a_limit_out_of_range_or_not_an_integer(
    client: Client, store: PostgresStore, limit: str
) -> None:
    _, headers = await api_owner(store)
    for path in ("/v1/jobs", f"/v1/jobs/{(await create(client, headers))['id']}/runs"):
        error = await error_of(await client.get(path, params={"limit": limit}, headers=headers), 422)
        assert error["field"] == "limit"


async def test_list_accepts_the_limit_bounds(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    await create(client, headers)
    for limit in ("1", "1000"):
        assert (await client.get("/v1/jobs", params={"limit": limit}, headers=headers)).status == 200


async def test_list_refuses_an_unknown_state_and_a_foreign_cursor(
    client: Client, store: PostgresStore
) -> None:
    _, headers = await api_owner(store)
    error = await error_of(await client.get("/v1/jobs?state=running", headers=headers), 422)
    assert error["field"] == "state"
    job = await create(client, headers)
    # "__________8" and "_____________________w" are cursors as the stores make them (and as the
    # API handed them out before cursors were sealed): all-ones 8 and 16 bytes. The last two are
    # 32 bytes, /v1/runs' size: all ones (run id 2**64-1) and a time past 9999. None is sealed,
    # so every one is refused before a store reads it (tests/database/test_cursors_api.py has
    # sealed ones; test_bad_input.py seals these for the stores' own checks).
    foreign = ["!!!", "not a cursor", "é", "AAAA", "x" * 2000, "__________8", "_____________________w"]
    foreign += ["_" * 42 + "8", "f_________8" + "A" * 32]
    for path in ("/v1/jobs", f"/v1/jobs/{job['id']}/runs", "/v1/runs", "/v1/targets"):
        for cursor in foreign:
            resp = await client.get(path, params={"cursor": cursor}, headers=headers)
            error = await error_of(resp, 422)
            assert (error["code"], error["field"]) == ("invalid_cursor", "cursor"), (path, cursor)


async def _all_pages(client: Client, headers: dict[str, str], **params: str) -> list[str]:
    seen: list[str] = []
    cursor: str | None = None
    while True:
        query = dict(params, limit="7")
        if cursor:
            query["cursor"] = cursor
        resp = await client.get("/v1/jobs", params=query, headers=headers)
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        seen.extend(j["id"] for j in body["items"])
        for j in body["items"]:
            if "state" in params:
                assert j["state"] == params["state"]
        cursor = body["next_cursor"]
        if cursor is None:
            return seen
        await asyncio.sleep(0)  # let the concurrent inserts interleave with the pages


async def test_pagination_lists_every_job_once_despite_concurrent_inserts(
    client: Client, store: PostgresStore
) -> None:
    _, headers = await api_owner(store)
    before = [(await create(client, headers))["id"] for _ in range(30)]
    paused = set(before[::3])
    for job_id in paused:
        assert (await client.post(f"/v1/jobs/{job_id}/pause", headers=headers)).status == 200

    async def insert_more() -> list[str]:
        return [(await create(client, headers))["id"] for _ in range(20)]

    listed, listed_paused, added = await asyncio.gather(
        _all_pages(client, headers), _all_pages(client, headers, state="paused"), insert_more()
    )
    assert len(listed) == len(set(listed)), "a job was listed twice"
    assert set(before) <= set(listed)
    assert set(listed) <= set(before) | set(added)
    assert listed == sorted(listed)
    # New jobs are only ever scheduled, so the filtered listing is exactly the paused set.
    assert len(listed_paused) == len(set(listed_paused))
    assert set(listed_paused) == paused
    # Once the inserts are over, a full listing has every job exactly once.
    final = await _all_pages(client, headers)
    assert sorted(final) == sorted(before + added)


# --- patch ---------------------------------------------------------------------------------


async def test_patch_merges_and_keeps_the_rest(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    job = await create(client, headers, webhook_spec(retry={"max_attempts": 3, "backoff_max_s": 60}))
    resp = await client.patch(
        f"/v1/jobs/{job['id']}", json={"name": "renamed", "retry": {"max_attempts": 7}}, headers=headers
    )
    assert resp.status == 200
    patched = await resp.json()
    assert patched["name"] == "renamed"
    assert patched["retry"]["max_attempts"] == 7
    assert patched["retry"]["backoff_max_s"] == 60
    assert patched["target"] == job["target"]
    assert patched["schedule"] == job["schedule"]
    assert patched["next_run_at"] == job["next_run_at"]
    # null resets a nullable field
    cleared = await (await client.patch(f"/v1/jobs/{job['id']}", json={"name": None}, headers=headers)).json()
    assert cleared["name"] is None
    # the merge-patch media type is accepted too
    resp = await client.patch(
        f"/v1/jobs/{job['id']}",
        data=json.dumps({"jitter_s": 5}),
        headers={**headers, "Content-Type": "application/merge-patch+json"},
    )
    assert resp.status == 200
    assert (await resp.json())["jitter_s"] == 5


async def test_patch_of_the_schedule_recomputes_next_run_at(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    job = await create(client, headers)
    run_at = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0)
    resp = await client.patch(
        f"/v1/jobs/{job['id']}",
        json={"schedule": {"run_at": run_at.isoformat()}},
        headers=headers,
    )
    assert resp.status == 200
    body = await resp.json()
    assert body["next_run_at"] == run_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    # a one-off can become recurring: the schedule is replaced whole
    resp = await client.patch(
        f"/v1/jobs/{job['id']}", json={"schedule": {"cron": "*/5 * * * *"}}, headers=headers
    )
    assert resp.status == 200
    body = await resp.json()
    assert body["schedule"]["cron"] == "*/5 * * * *"
    next_run = datetime.fromisoformat(body["next_run_at"].replace("Z", "+00:00"))
    assert next_run.minute % 5 == 0 and next_run - datetime.now(UTC) <= timedelta(minutes=5)


async def test_patch_keeps_redacted_header_secrets(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    job = await create(client, headers, webhook_spec())
    target = dict(job["target"], timeout_s=10)  # the GET body sent back, header shown redacted
    resp = await client.patch(f"/v1/jobs/{job['id']}", json={"target": target}, headers=headers)
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["target"]["timeout_s"] == 10
    owner = (await resp.json())["owner"]
    stored = await store.get_job(owner, uuid.UUID(job["id"]))
    assert stored.spec.target.headers == {"X-Token": SECRET}  # type: ignore[union-attr]
    # the placeholder under a name the job does not have is refused, never stored literally
    target["headers"] = {"X-Other": "<redacted>"}
    error = await error_of(
        await client.patch(f"/v1/jobs/{job['id']}", json={"target": target}, headers=headers), 422
    )
    assert error["field"] == "target.headers.X-Other"


async def test_patch_refuses_bad_values_and_bad_shapes(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    job = await create(client, headers)
    path = f"/v1/jobs/{job['id']}"
    error = await error_of(await client.patch(path, json={"jitter_s": -1}, headers=headers), 422)
    assert error["field"] == "jitter_s"
    error = await error_of(await client.patch(path, json={"colour": "blue"}, headers=headers), 422)
    assert error["field"] == "colour"
    await error_of(await client.patch(path, json=["name"], headers=headers), 400)
    await error_of(await client.patch(path, json={"target": None}, headers=headers), 400)
    unchanged = await (await client.get(path, headers=headers)).json()
    assert unchanged == job


async def test_patch_answers_409_on_a_cancelled_or_completed_job(
    client: Client, store: PostgresStore, db: asyncpg.Connection
) -> None:
    _, headers = await api_owner(store)
    cancelled = await create(client, headers)
    assert (await client.delete(f"/v1/jobs/{cancelled['id']}", headers=headers)).status == 200
    error = await error_of(
        await client.patch(f"/v1/jobs/{cancelled['id']}", json={"name": "x"}, headers=headers), 409
    )
    assert error["code"] == "job_cancelled"
    completed = await create(client, headers)
    await set_state(db, completed["id"], "completed")
    error = await error_of(
        await client.patch(f"/v1/jobs/{completed['id']}", json={"name": "x"}, headers=headers), 409
    )
    assert error["code"] == "job_completed"


# --- delete, pause, resume, trigger, replay ----------------------------------------------------


async def test_delete_cancels_and_repeating_it_is_harmless(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    job = await create(client, headers)
    first = await client.delete(f"/v1/jobs/{job['id']}", headers=headers)
    assert first.status == 200
    body = await first.json()
    assert body["state"] == "cancelled"
    assert body["next_run_at"] is None
    again = await client.delete(f"/v1/jobs/{job['id']}", headers=headers)
    assert again.status == 200
    assert (await again.json())["state"] == "cancelled"
    for action in ("pause", "resume", "trigger", "replay"):
        error = await error_of(await client.post(f"/v1/jobs/{job['id']}/{action}", headers=headers), 409)
        assert error["code"] in ("job_cancelled",), (action, error)


async def test_pause_and_resume(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    job = await create(client, headers)
    paused = await client.post(f"/v1/jobs/{job['id']}/pause", headers=headers)
    assert paused.status == 200
    assert (await paused.json())["state"] == "paused"
    again = await client.post(f"/v1/jobs/{job['id']}/pause", headers=headers)
    assert again.status == 200 and (await again.json())["state"] == "paused"
    error = await error_of(await client.post(f"/v1/jobs/{job['id']}/trigger", headers=headers), 409)
    assert error["code"] == "job_paused"
    resumed = await client.post(f"/v1/jobs/{job['id']}/resume", headers=headers)
    assert resumed.status == 200
    body = await resumed.json()
    assert body["state"] == "scheduled"
    assert body["next_run_at"] == job["next_run_at"]


async def test_trigger_answers_202_with_the_job(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    job = await create(client, headers, webhook_spec())
    resp = await client.post(f"/v1/jobs/{job['id']}/trigger", headers=headers)
    assert resp.status == 202
    body = await resp.json()
    assert body["id"] == job["id"] and body["state"] == "scheduled"
    next_run = datetime.fromisoformat(body["next_run_at"].replace("Z", "+00:00"))
    assert next_run <= datetime.now(UTC) + timedelta(seconds=5)


async def test_replay_brings_a_dead_job_back_and_refuses_others(
    client: Client, store: PostgresStore, db: asyncpg.Connection
) -> None:
    _, headers = await api_owner(store)
    job = await create(client, headers)
    error = await error_of(await client.post(f"/v1/jobs/{job['id']}/replay", headers=headers), 409)
    assert error["code"] == "job_scheduled"
    await db.execute("UPDATE jobs SET state = 'dead', attempt = 5 WHERE job_id = $1", uuid.UUID(job["id"]))
    dead = await (await client.get(f"/v1/jobs/{job['id']}", headers=headers)).json()
    assert (dead["state"], dead["attempt"], dead["next_run_at"]) == ("dead", 5, None)
    listed = await (await client.get("/v1/jobs?state=dead", headers=headers)).json()
    assert [j["id"] for j in listed["items"]] == [job["id"]]
    resp = await client.post(f"/v1/jobs/{job['id']}/replay", headers=headers)
    assert resp.status == 200
    body = await resp.json()
    assert (body["state"], body["attempt"]) == ("scheduled", 0)
    assert datetime.fromisoformat(body["next_run_at"].replace("Z", "+00:00")) <= datetime.now(
        UTC
    ) + timedelta(seconds=5)


async def test_runs_are_listed_newest_first_across_pages(
    client: Client, store: PostgresStore, db: asyncpg.Connection
) -> None:
    _, headers = await api_owner(store)
    job = await create(client, headers, webhook_spec())
    empty = await client.get(f"/v1/jobs/{job['id']}/runs", headers=headers)
    assert empty.status == 200
    assert await empty.json() == {"items": [], "next_cursor": None}
    job_id = uuid.UUID(job["id"])
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(5):
        at = base + timedelta(minutes=i)
        await db.execute(
            "INSERT INTO runs (job_id, shard, scheduled_for, attempt, started_at, finished_at, outcome,"
            " status_code, error, lateness_ms) VALUES ($1, $2, $3, 1, $4, $5, $6, $7, $8, $9)",
            job_id,
            shard_of(job_id),
            at,
            at + timedelta(milliseconds=40),
            at + timedelta(milliseconds=90),
            "succeeded" if i % 2 == 0 else "failed",
            200 if i % 2 == 0 else 500,
            None if i % 2 == 0 else "HTTP 500",
            40,
        )
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        resp = await client.get(f"/v1/jobs/{job['id']}/runs", params=params, headers=headers)
        assert resp.status == 200
        page = await resp.json()
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [r["scheduled_for"] for r in items] == [
        (base + timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%SZ") for i in reversed(range(5))
    ]
    assert items[0] == {
        "scheduled_for": "2026-01-01T00:04:00Z",
        "attempt": 1,
        "started_at": "2026-01-01T00:04:00.04Z",
        "finished_at": "2026-01-01T00:04:00.09Z",
        "outcome": "succeeded",
        "status_code": 200,
        "error": None,
        "lateness_ms": 40,
        "spec_version": 1,
    }
    assert items[1]["outcome"] == "failed" and items[1]["error"] == "HTTP 500"


# --- not found, owner isolation --------------------------------------------------------------

JOB_CALLS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "", None),
    ("PATCH", "", {"name": "mine-now"}),
    ("DELETE", "", None),
    ("POST", "/pause", None),
    ("POST", "/resume", None),
    ("POST", "/trigger", None),
    ("POST", "/replay", None),
    ("GET", "/runs", None),
    ("GET", "/changes", None),
    ("GET", "/preview", None),
    ("POST", "/backfill", {"from": "2025-01-01T00:00:00Z", "to": "2025-01-02T00:00:00Z"}),
]


@pytest.mark.parametrize(("method", "suffix", "body"), JOB_CALLS)
async def test_another_owners_job_answers_404_like_a_missing_one(
    client: Client, store: PostgresStore, method: str, suffix: str, body: dict[str, Any] | None
) -> None:
    (_, alice), (_, mallory) = await api_owner(store), await api_owner(store)
    job = await create(client, alice, webhook_spec())
    missing = str(uuid.uuid4())
    answers = []
    for job_id in (job["id"], missing, "not-a-uuid", job["id"].upper()[:-1] + "Z"):
        resp = await client.request(method, f"/v1/jobs/{job_id}{suffix}", json=body, headers=mallory)
        error = await error_of(resp, 404)
        assert SECRET not in await resp.text()
        answers.append((error["code"], error.get("field"), error["message"].replace(job_id, "<id>")))
    assert len(set(answers)) == 1, answers
    # ... and nothing happened to alice's job, nor to its change history
    assert await (await client.get(f"/v1/jobs/{job['id']}", headers=alice)).json() == job
    changes = await (await client.get(f"/v1/jobs/{job['id']}/changes", headers=alice)).json()
    assert [c["action"] for c in changes["items"]] == ["create"]
    listed = await (await client.get("/v1/jobs", headers=mallory)).json()
    assert listed["items"] == []


# --- idempotency ---------------------------------------------------------------------------


async def test_idempotency_key_replays_the_same_body_and_refuses_a_different_one(
    client: Client, store: PostgresStore
) -> None:
    _, headers = await api_owner(store)
    key = {"Idempotency-Key": f"order-{uuid.uuid4()}"}
    spec = webhook_spec()
    first = await client.post("/v1/jobs", json=spec, headers={**headers, **key})
    assert first.status == 201
    job = await first.json()
    reordered = json.dumps(dict(reversed(list(spec.items()))), indent=2)
    again = await client.post(
        "/v1/jobs", data=reordered, headers={**headers, **key, "Content-Type": "application/json"}
    )
    assert again.status == 200
    assert again.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert await again.json() == job
    error = await error_of(
        await client.post("/v1/jobs", json=webhook_spec(name="other"), headers={**headers, **key}), 422
    )
    assert error["code"] == "idempotency_key_reused"
    listed = await (await client.get("/v1/jobs", headers=headers)).json()
    assert [j["id"] for j in listed["items"]] == [job["id"]]
    # another owner's identical key is a different key
    _, other = await api_owner(store)
    theirs = await client.post("/v1/jobs", json=spec, headers={**other, **key})
    assert theirs.status == 201
    assert (await theirs.json())["id"] != job["id"]


async def test_concurrent_retries_with_one_key_make_one_job(client: Client, store: PostgresStore) -> None:
    headers = {**(await api_owner(store)).headers, "Idempotency-Key": "retry-storm"}
    answers = await asyncio.gather(
        *(client.post("/v1/jobs", json=queue_spec(name="once"), headers=headers) for _ in range(8))
    )
    assert sorted(r.status for r in answers).count(201) == 1
    assert {r.status for r in answers} <= {200, 201}
    assert len({(await r.json())["id"] for r in answers}) == 1


# (Leading and trailing spaces are stripped by the HTTP parser before a handler could see them:
# tests/database/test_api_limits.py sends them on a raw socket to the API's own runner.)
@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there", "caf\u00e9"])
async def test_an_invalid_idempotency_key_answers_422(client: Client, store: PostgresStore, key: str) -> None:
    _, headers = await api_owner(store)
    resp = await client.post(
        "/v1/jobs",
        data=json.dumps(queue_spec()).encode(),
        headers={
            **headers,
            "Content-Type": "application/json",
            "Idempotency-Key": key.encode().decode("latin-1"),
        },
    )
    error = await error_of(resp, 422)
    assert error["field"] == "Idempotency-Key"
    assert (await (await client.get("/v1/jobs", headers=headers)).json())["items"] == []


# --- the JSON edge, limits -----------------------------------------------------------------


async def test_body_over_256_kib_answers_413(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    big = json.dumps(queue_spec(payload="x" * (300 * 1024)))
    resp = await client.post("/v1/jobs", data=big, headers={**headers, "Content-Type": "application/json"})
    assert (await error_of(resp, 413))["code"] == "body_too_large"
    job = await create(client, headers)
    resp = await client.patch(
        f"/v1/jobs/{job['id']}", data=big, headers={**headers, "Content-Type": "application/json"}
    )
    assert (await error_of(resp, 413))["code"] == "body_too_large"


async def test_payload_over_64_kib_answers_422(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    error = await error_of(
        await client.post("/v1/jobs", json=queue_spec(payload="x" * (65 * 1024)), headers=headers), 422
    )
    assert error["field"] == "payload"
    assert (
        await client.post("/v1/jobs", json=queue_spec(payload="x" * 60000), headers=headers)
    ).status == 201


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"],
)
async def test_a_body_not_sent_as_json_answers_415(
    client: Client, store: PostgresStore, content_type: str | None
) -> None:
    _, headers = await api_owner(store)
    job = await create(client, headers)
    extra = {"Content-Type": content_type} if content_type else {}
    body = json.dumps(queue_spec()).encode()
    for method, path in (("POST", "/v1/jobs"), ("PATCH", f"/v1/jobs/{job['id']}")):
        resp = await client.request(method, path, data=body, headers={**headers, **extra})
        assert (await error_of(resp, 415))["code"] == "unsupported_media_type"


MALFORMED: list[tuple[str, bytes]] = [
    ("syntax", b'{"target": '),
    ("empty", b""),
    ("whitespace", b"  \n"),
    ("trailing garbage", b'{"a": 1} x'),
    ("duplicate keys", b'{"name": "a", "name": "b", "target": {}}'),
    ("nested duplicate keys", b'{"payload": {"k": 1, "k": 2}}'),
    ("NaN", b'{"payload": NaN}'),
    ("Infinity", b'{"payload": Infinity}'),
    ("-Infinity", b'{"jitter_s": -Infinity}'),
    ("overflowing float", b'{"payload": 1e400}'),
    ("invalid UTF-8", b'{"name": "\xff\xfe"}'),
    ("overlong UTF-8", b'{"name": "\xc0\xaf"}'),
    ("raw surrogate bytes", b'{"name": "\xed\xa0\x80"}'),
    ("lone surrogate escape", b'{"name": "\\ud800"}'),
    ("lone surrogate in a key", b'{"payload": {"\\udc00": 1}}'),
    ("byte order mark", b'\xef\xbb\xbf{"name": "x"}'),
    ("single quotes", b"{'name': 'x'}"),
    ("huge integer", b'{"payload": ' + b"9" * 5000 + b"}"),
    ("deep nesting", b'{"payload": ' + b"[" * 100000 + b"]" * 100000 + b"}"),
]


@pytest.mark.parametrize(("case", "raw"), MALFORMED, ids=[c for c, _ in MALFORMED])
async def test_malformed_json_answers_4xx_never_5xx(
    client: Client, store: PostgresStore, case: str, raw: bytes
) -> None:
    headers = {**(await api_owner(store)).headers, "Content-Type": "application/json"}
    job = await create(client, {"Authorization": headers["Authorization"]})
    for method, path in (("POST", "/v1/jobs"), ("PATCH", f"/v1/jobs/{job['id']}")):
        resp = await client.request(method, path, data=raw, headers=headers)
        if case == "deep nesting":  # valid JSON, refused for its depth
            assert (await error_of(resp, 422))["code"] == "nesting_too_deep"
        else:
            assert (await error_of(resp, 400))["code"] == "malformed_json", case


async def test_unstorable_strings_and_deep_payloads_answer_422(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    for payload in ({"note": "a\u0000b"}, {"a\u0000": 1}, [[[[[[["x"]]]]]]]):
        spec = queue_spec(payload=payload)
        resp = await client.post("/v1/jobs", json=spec, headers=headers)
        if payload == [[[[[[["x"]]]]]]]:
            assert resp.status == 201  # nesting within the limit is fine
            continue
        error = await error_of(resp, 422)
        assert error["field"].startswith("payload")
    deep: Any = "x"
    for _ in range(70):
        deep = {"k": deep}
    assert (
        await error_of(await client.post("/v1/jobs", json=queue_spec(payload=deep), headers=headers), 422)
    )["code"] == "nesting_too_deep"


# --- redaction -----------------------------------------------------------------------------


async def test_header_values_are_redacted_in_every_response(
    client: Client, store: PostgresStore, db: asyncpg.Connection
) -> None:
    _, headers = await api_owner(store)
    key = {"Idempotency-Key": "redact-1"}
    created = await client.post("/v1/jobs", json=webhook_spec(), headers={**headers, **key})
    job = await created.json()
    base = f"/v1/jobs/{job['id']}"
    responses = [
        created,
        await client.post("/v1/jobs", json=webhook_spec(), headers={**headers, **key}),
        await client.get(base, headers=headers),
        await client.get("/v1/jobs", headers=headers),
        await client.patch(base, json={"name": "still secret"}, headers=headers),
        await client.patch(
            base,
            json={"target": dict(job["target"], headers={"X-Token": SECRET + "2", "X-Other": SECRET})},
            headers=headers,
        ),
        await client.post(f"{base}/trigger", headers=headers),
        await client.post(f"{base}/pause", headers=headers),
        await client.get("/v1/jobs?state=paused", headers=headers),
        await client.post(f"{base}/resume", headers=headers),
        await client.post("/v1/jobs", json=webhook_spec(jitter_s=99999), headers=headers),
    ]
    await set_state(db, job["id"], "dead")
    responses.append(await client.post(f"{base}/replay", headers=headers))
    responses.append(await client.delete(base, headers=headers))
    for resp in responses:
        text = await resp.text()
        assert resp.status < 500
        assert SECRET not in text, text
    final = json.loads(await responses[-1].text())
    assert final["target"]["headers"] == {"X-Token": "<redacted>", "X-Other": "<redacted>"}


# --- SSRF ----------------------------------------------------------------------------------


async def test_a_loopback_webhook_is_refused_by_default(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    for url in (
        "http://127.0.0.1/",
        "http://localhost:8080/x",
        "http://[::1]/",
        "http://169.254.169.254/latest",
    ):
        spec = webhook_spec(target={"type": "webhook", "url": url})
        error = await error_of(await client.post("/v1/jobs", json=spec, headers=headers), 422)
        assert (error["code"], error["field"]) == ("target_not_allowed", "target.url"), url
    job = await create(client, headers, webhook_spec())
    error = await error_of(
        await client.patch(
            f"/v1/jobs/{job['id']}",
            json={"target": {"type": "webhook", "url": "http://127.0.0.1/"}},
            headers=headers,
        ),
        422,
    )
    assert error["code"] == "target_not_allowed"
    assert (await (await client.get(f"/v1/jobs/{job['id']}", headers=headers)).json())["target"][
        "url"
    ] == PUBLIC_URL


async def test_a_loopback_webhook_is_accepted_when_private_targets_are_allowed(store: PostgresStore) -> None:
    async with serve(create_app(store, policy=AddressPolicy(allow_private=True))) as private:
        _, headers = await api_owner(store)
        spec = webhook_spec(target={"type": "webhook", "url": "http://127.0.0.1:9/hook"})
        resp = await private.post("/v1/jobs", json=spec, headers=headers)
        assert resp.status == 201, await resp.text()
        assert (await resp.json())["target"]["url"] == "http://127.0.0.1:9/hook"


# --- auth ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Bearer dt_unknown-key",
        "Bearer caf\u00e9",
        "Token x",
    ],
)
async def test_missing_or_unknown_keys_answer_401(client: Client, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization.encode().decode("latin-1")}
    for method, path in (("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", f"/v1/jobs/{uuid.uuid4()}")):
        resp = await client.request(method, path, headers=headers)
        assert (await error_of(resp, 401))["code"] == "unauthorized"
        assert resp.headers["WWW-Authenticate"] == "Bearer"


async def test_the_scheme_is_case_insensitive(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    key = headers["Authorization"].split(" ", 1)[1]
    assert (await client.get("/v1/jobs", headers={"Authorization": f"bearer {key}"})).status == 200


async def test_a_revoked_key_stops_working_within_the_cache_ttl(store: PostgresStore) -> None:
    api_key, _ = await store.create_api_key(f"owner-{uuid.uuid4().hex[:12]}")
    headers = {"Authorization": f"Bearer {api_key}"}
    async with (
        serve(create_app(store, policy=AddressPolicy(), key_cache_ttl_s=3600)) as cached,
        serve(create_app(store, policy=AddressPolicy(), key_cache_ttl_s=0.2)) as short,
    ):
        assert (await cached.get("/v1/jobs", headers=headers)).status == 200
        assert (await short.get("/v1/jobs", headers=headers)).status == 200
        assert await store.revoke_api_key(api_key) == 1
        # The long-TTL process still knows the key: that is the documented window.
        assert (await cached.get("/v1/jobs", headers=headers)).status == 200
        deadline = asyncio.get_running_loop().time() + 10
        while (status := (await short.get("/v1/jobs", headers=headers)).status) == 200:
            assert asyncio.get_running_loop().time() < deadline, "revoked key still accepted"
            await asyncio.sleep(0.05)
        assert status == 401


# --- router answers, failures ---------------------------------------------------------------


async def test_wrong_method_answers_405_with_allow(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    resp = await client.put("/v1/jobs", headers=headers)
    assert (await error_of(resp, 405))["code"] == "method_not_allowed"
    assert set(resp.headers["Allow"].split(",")) == {"GET", "POST"}
    resp = await client.post(f"/v1/jobs/{uuid.uuid4()}/runs", headers=headers)
    assert (await error_of(resp, 405))["code"] == "method_not_allowed"
    assert resp.headers["Allow"] == "GET"


async def test_unknown_paths_answer_404_json(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    assert (await error_of(await client.get("/v1/nothing", headers=headers), 404))["code"] == "not_found"
    assert (await error_of(await client.get("/nothing"), 404))["code"] == "not_found"
    assert (await error_of(await client.get("/v1/nothing"), 401))["code"] == "unauthorized"


class _FailingReads:
    """The real store, except that reading a job fails the way a bug or a lost database would."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self.failure: Exception = RuntimeError("boom")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def get_job(self, owner: str, job_id: uuid.UUID) -> Any:
        raise self.failure


class _FlakyKeys:
    """The real store, with key lookups that fail (slowly) while ``down`` is set."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self.down = True
        self.lookups = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def owner_for_key(self, api_key: str) -> str | None:
        self.lookups += 1
        if self.down:
            await asyncio.sleep(0.3)  # long enough for the concurrent requests to pile up behind it
            raise StorageUnavailable("the home database is unavailable")
        return await self._store.owner_for_key(api_key)


async def test_a_failed_key_lookup_answers_503_and_is_not_remembered(store: PostgresStore) -> None:
    flaky = _FlakyKeys(store)
    async with serve(create_app(cast(ApiStore, flaky), policy=AddressPolicy())) as c:
        _, headers = await api_owner(store)
        answers = await asyncio.gather(*(c.get("/v1/jobs", headers=headers) for _ in range(10)))
        for resp in answers:
            assert (await error_of(resp, 503))["code"] == "storage_unavailable"
        assert flaky.lookups < 10  # concurrent requests for one key share a lookup
        flaky.down = False
        assert (await c.get("/v1/jobs", headers=headers)).status == 200
        lookups = flaky.lookups
        assert (await c.get("/v1/jobs", headers=headers)).status == 200
        assert flaky.lookups == lookups  # a success is cached


async def test_an_unexpected_error_answers_500_and_storage_trouble_503(
    store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    failing = _FailingReads(store)
    async with serve(create_app(cast(ApiStore, failing), policy=AddressPolicy())) as c:
        _, headers = await api_owner(store)
        resp = await c.get(f"/v1/jobs/{uuid.uuid4()}", headers=headers)
        error = await error_of(resp, 500)
        assert error["code"] == "internal_error"
        assert "boom" not in error["message"]
        assert any(r.exc_info and "boom" in str(r.exc_info[1]) for r in caplog.records)
        failing.failure = StorageUnavailable("the job database is unavailable")
        resp = await c.get(f"/v1/jobs/{uuid.uuid4()}", headers=headers)
        assert (await error_of(resp, 503))["code"] == "storage_unavailable"
        assert resp.headers["Retry-After"] == "1"


# --- probes --------------------------------------------------------------------------------


async def test_healthz_and_readyz(client: Client) -> None:
    resp = await client.get("/healthz")
    assert resp.status == 200 and await resp.json() == {"status": "ok", "version": __version__}
    resp = await client.get("/readyz")
    assert resp.status == 200 and await resp.json() == {"status": "ready"}


async def test_readyz_answers_503_when_a_dependency_is_down(store: PostgresStore) -> None:
    async def broker_down() -> None:
        raise ConnectionRefusedError("nats at 127.0.0.1:4222 refused the connection")

    async def storage_down() -> None:
        raise StorageUnavailable("shard 3 is unreachable")

    checks: list[Callable[[], Awaitable[None]]] = [broker_down, storage_down]
    for check in checks:
        async with serve(create_app(store, policy=AddressPolicy(), readiness=check)) as c:
            resp = await c.get("/readyz")
            error = await error_of(resp, 503)
            assert error["code"] in ("not_ready", "storage_unavailable")
            # liveness does not depend on the databases
            assert (await c.get("/healthz")).status == 200


async def test_two_idempotency_keys_answer_400(client: Client, store: PostgresStore) -> None:
    headers = CIMultiDict((await api_owner(store)).headers)
    headers.add("Idempotency-Key", "one")
    headers.add("Idempotency-Key", "two")
    resp = await client.post("/v1/jobs", json=queue_spec(), headers=headers)
    error = await error_of(resp, 400)
    assert (error["code"], error["field"]) == ("duplicate_header", "Idempotency-Key")
    _, fresh = await api_owner(store)
    assert (await (await client.get("/v1/jobs", headers=fresh)).json())["items"] == []


async def test_the_metrics_token_scheme_is_case_insensitive() -> None:
    """RFC 9110 §11.1: the auth scheme is case-insensitive; the token itself is not."""
    async with TestClient(TestServer(metrics_app("tok-123"))) as metrics:
        for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
            resp = await metrics.get("/metrics", headers={"Authorization": f"{scheme} tok-123"})
            assert resp.status == 200, scheme
        for wrong in ("Bearer TOK-123", "Basic tok-123", "Bearer", "tok-123", "Bearer  tok-123"):
            resp = await metrics.get("/metrics", headers={"Authorization": wrong})
            assert resp.status == 401, wrong
        assert (await metrics.get("/metrics")).status == 401


async def test_metrics_count_requests_by_route_template(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    job = await create(client, headers)
    await client.get(f"/v1/jobs/{job['id']}", headers=headers)
    await client.get(f"/v1/jobs/{uuid.uuid4()}", headers=headers)
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = await resp.text()
    assert 'duetime_api_requests_total{method="GET",route="/v1/jobs/{job_id}",status="200"}' in text
    assert 'duetime_api_requests_total{method="GET",route="/v1/jobs/{job_id}",status="404"}' in text
    assert 'duetime_api_requests_total{method="POST",route="/v1/jobs",status="201"}' in text
    assert (
        'duetime_api_request_duration_seconds_bucket{le="0.005",method="GET",route="/v1/jobs/{job_id}"}'
        in text
    )
    assert job["id"] not in text


async def test_openapi_is_served_without_auth(client: Client) -> None:
    resp = await client.get("/openapi.json")
    assert resp.status == 200 and resp.content_type == "application/json"
    assert (await resp.json())["openapi"].startswith("3.1")


async def test_patch_of_other_fields_after_a_bounded_cron_ended_is_not_refused(
    client: Client, store: PostgresStore
) -> None:
    """Regression: once end_at had passed, a PATCH of only the name re-checked the unchanged
    schedule against the current time and answered 422 cron_never_fires."""
    _, auth = await api_owner(store)
    end_at = (datetime.now(UTC) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    spec = webhook_spec(schedule={"cron": "* * * * * *", "end_at": end_at})
    resp = await client.post("/v1/jobs", json=spec, headers=auth)
    assert resp.status == 201
    job = await resp.json()
    await asyncio.sleep(3)  # no engine here: the job is still scheduled, its end_at has passed
    resp = await client.patch(f"/v1/jobs/{job['id']}", json={"name": "renamed"}, headers=auth)
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["name"] == "renamed"
    # a schedule that is itself changed is still judged against now
    resp = await client.patch(
        f"/v1/jobs/{job['id']}", json={"schedule": {"cron": "* * * * * *", "end_at": end_at}}, headers=auth
    )
    assert resp.status == 422
