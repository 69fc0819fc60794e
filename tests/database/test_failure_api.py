"""on_failure and pause_after_failures through the HTTP API: defaults on the Job, the value
rules (422 with the field's path), SSRF and topic checks of the event target, PATCH and PUT by
name with the same rules as other fields, and a redacted event-target header kept by a PATCH."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from duetime.storage.postgres import PostgresStore
from tests.database.test_api import PUBLIC_URL, SECRET, create, error_of, webhook_spec
from tests.support.fixtures import Client, api_owner

EVENTS = {"type": "webhook", "url": "https://1.1.1.1/events", "headers": {"X-Pager": SECRET}}


async def test_the_job_shows_the_fields_with_their_defaults(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    plain = await create(client, headers, webhook_spec(name=None))
    assert plain["on_failure"] is None and plain["pause_after_failures"] is None
    job = await create(
        client, headers, webhook_spec(name=None, on_failure={"target": EVENTS}, pause_after_failures=3)
    )
    assert job["on_failure"] == {
        "target": {
            "type": "webhook",
            "url": "https://1.1.1.1/events",
            "method": "POST",
            "headers": {"X-Pager": "<redacted>"},
            "timeout_s": 30,
        },
        "after": 1,
    }
    assert job["pause_after_failures"] == 3


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"on_failure": {"target": EVENTS, "after": 0}}, (422, "invalid_value", "on_failure.after")),
        ({"on_failure": {"target": EVENTS, "after": 1001}}, (422, "invalid_value", "on_failure.after")),
        ({"on_failure": {"after": 2}}, (422, None, "on_failure.target")),
        ({"on_failure": {"target": EVENTS, "every": 2}}, (422, None, "on_failure.every")),
        ({"on_failure": {"target": {"type": "webhook"}}}, (422, None, "on_failure.target.url")),
        ({"on_failure": "https://x"}, (400, "wrong_type", "on_failure")),
        ({"pause_after_failures": 0}, (422, "invalid_value", "pause_after_failures")),
        ({"pause_after_failures": 1001}, (422, "invalid_value", "pause_after_failures")),
        ({"pause_after_failures": "3"}, (400, "wrong_type", "pause_after_failures")),
        (
            {"on_failure": {"target": {"type": "webhook", "url": "http://127.0.0.1/x"}}},
            (422, "target_not_allowed", "on_failure.target.url"),
        ),
    ],
)
async def test_values_out_of_range_name_their_field(
    client: Client, store: PostgresStore, fields: dict[str, Any], expected: tuple[int, str | None, str]
) -> None:
    status, code, field = expected
    _, headers = await api_owner(store)
    resp = await client.post("/v1/jobs", json=webhook_spec(name=None, **fields), headers=headers)
    error = await error_of(resp, status)
    assert error.get("field") == field, error
    if code is not None:
        assert error["code"] == code, error


async def test_patch_sets_clears_and_keeps_a_redacted_header(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store)
    job = await create(client, headers, webhook_spec(name=None))
    path = f"/v1/jobs/{job['id']}"
    resp = await client.patch(path, json={"on_failure": {"target": EVENTS, "after": 2}}, headers=headers)
    assert resp.status == 200, await resp.text()
    shown = (await resp.json())["on_failure"]
    assert shown["after"] == 2
    # The Job as shown (the header redacted), sent back with a new `after`: the secret is kept.
    resp = await client.patch(path, json={"on_failure": {**shown, "after": 5}}, headers=headers)
    assert resp.status == 200, await resp.text()
    row = await store.get_job(job["owner"], uuid.UUID(job["id"]))
    assert row.spec.on_failure is not None and row.spec.on_failure.after == 5
    assert row.spec.on_failure.target.headers == {"X-Pager": SECRET}  # type: ignore[union-attr]
    moved = {**shown, "target": {**shown["target"], "url": "https://8.8.8.8/events"}}
    error = await error_of(await client.patch(path, json={"on_failure": moved}, headers=headers), 422)
    assert error["field"] == "on_failure.target.headers.X-Pager"
    error = await error_of(
        await client.patch(
            path,
            json={"on_failure": {"target": {"type": "webhook", "url": "http://10.0.0.1/"}}},
            headers=headers,
        ),
        422,
    )
    assert (error["code"], error["field"]) == ("target_not_allowed", "on_failure.target.url")
    resp = await client.patch(path, json={"on_failure": None, "pause_after_failures": 4}, headers=headers)
    body = await resp.json()
    assert (body["on_failure"], body["pause_after_failures"]) == (None, 4)
    resp = await client.patch(path, json={"pause_after_failures": None}, headers=headers)
    assert (await resp.json())["pause_after_failures"] is None


async def test_put_by_name_applies_them_and_a_repeat_changes_nothing(
    client: Client, store: PostgresStore
) -> None:
    _, headers = await api_owner(store)
    body = {
        "target": {"type": "webhook", "url": PUBLIC_URL},
        "schedule": {"cron": "0 3 * * *"},
        "on_failure": {"target": {"type": "queue", "broker": "nats", "topic": "ops.failures"}, "after": 3},
        "pause_after_failures": 10,
    }
    resp = await client.put("/v1/jobs/by-name/failing-report", json=body, headers=headers)
    assert resp.status == 201, await resp.text()
    first = await resp.json()
    assert first["on_failure"]["after"] == 3 and first["pause_after_failures"] == 10
    resp = await client.put("/v1/jobs/by-name/failing-report", json=body, headers=headers)
    again = await resp.json()
    assert resp.status == 200 and again["updated_at"] == first["updated_at"]
    resp = await client.put(
        "/v1/jobs/by-name/failing-report", json={**body, "pause_after_failures": None}, headers=headers
    )
    assert (await resp.json())["pause_after_failures"] is None
