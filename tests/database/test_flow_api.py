"""``target.flow`` through the HTTP API on the real store: created, shown, changed by PATCH and
PUT like any other target field, refused with the field named, absent when never set."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from duetime.core.model import Flow
from duetime.storage.postgres import PostgresStore
from tests.support.fixtures import Client, api_owner

URL = "https://1.1.1.1/hook"  # a public literal: no DNS lookup, allowed by the default policy
SECRET = "flow-test-secret-7d1c"
FLOW = {"key": "billing-api", "rate_per_s": 2.5, "parallelism": 4}


def spec(flow: dict[str, Any] | None = FLOW, **overrides: Any) -> dict[str, Any]:
    target: dict[str, Any] = {"type": "webhook", "url": URL, "headers": {"X-Token": SECRET}}
    if flow is not None:
        target["flow"] = flow
    return {"target": target, "schedule": {"cron": "0 3 * * *"}, **overrides}


async def ok(resp: Any, status: int = 200) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def refused(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    error: dict[str, Any] = (await resp.json())["error"]
    return error


async def test_created_with_a_flow_it_is_shown_and_stored(client: Client, store: PostgresStore) -> None:
    name, headers = await api_owner(store, "flow")
    job = await ok(await client.post("/v1/jobs", json=spec(), headers=headers), 201)
    assert job["target"]["flow"] == FLOW
    assert job["target"]["headers"] == {"X-Token": "<redacted>"}
    got = await ok(await client.get(f"/v1/jobs/{job['id']}", headers=headers))
    assert got["target"]["flow"] == FLOW
    stored = await store.get_job(name, uuid.UUID(job["id"]))
    assert stored.spec.target.flow == Flow("billing-api", 2.5, 4)
    listed = await ok(await client.get("/v1/jobs", headers=headers))
    assert [j["target"]["flow"] for j in listed["items"]] == [FLOW]


async def test_a_target_without_flow_shows_no_flow(client: Client, store: PostgresStore) -> None:
    _, headers = await api_owner(store, "flow")
    job = await ok(await client.post("/v1/jobs", json=spec(None), headers=headers), 201)
    assert "flow" not in job["target"]
    queue = {"type": "queue", "broker": "redis", "topic": "jobs:flow", "flow": None}
    job = await ok(await client.post("/v1/jobs", json=spec(None, target=queue), headers=headers), 201)
    assert job["target"] == {"type": "queue", "broker": "redis", "topic": "jobs:flow"}


async def test_a_queue_target_and_the_failure_target_take_one_too(
    client: Client, store: PostgresStore
) -> None:
    _, headers = await api_owner(store, "flow")
    queue = {"type": "queue", "broker": "nats", "topic": "billing.invoices", "flow": FLOW}
    body = spec(None, target=queue, on_failure={"target": {"type": "webhook", "url": URL, "flow": FLOW}})
    job = await ok(await client.post("/v1/jobs", json=body, headers=headers), 201)
    assert job["target"]["flow"] == FLOW
    assert job["on_failure"]["target"]["flow"] == FLOW


async def test_patch_changes_keeps_and_drops_the_flow(client: Client, store: PostgresStore) -> None:
    name, headers = await api_owner(store, "flow")
    job = await ok(await client.post("/v1/jobs", json=spec(), headers=headers), 201)
    path = f"/v1/jobs/{job['id']}"

    kept = await ok(await client.patch(path, json={"jitter_s": 7}, headers=headers))
    assert kept["target"] == job["target"] and kept["jitter_s"] == 7

    # The target is replaced whole: the GET body's target with the flow changed, headers redacted.
    target = {**job["target"], "flow": {**FLOW, "parallelism": 9, "rate_per_s": 100}}
    changed = await ok(await client.patch(path, json={"target": target}, headers=headers))
    assert changed["target"]["flow"] == {"key": "billing-api", "rate_per_s": 100, "parallelism": 9}
    stored = await store.get_job(name, uuid.UUID(job["id"]))
    assert stored.spec.target.flow == Flow("billing-api", 100.0, 9)
    assert stored.spec.target.headers == {"X-Token": SECRET}  # type: ignore[union-attr]

    without = {k: v for k, v in job["target"].items() if k != "flow"}
    dropped = await ok(await client.patch(path, json={"target": without}, headers=headers))
    assert "flow" not in dropped["target"]
    assert (await store.get_job(name, uuid.UUID(job["id"]))).spec.target.flow is None


async def test_put_by_name_sets_the_flow_and_an_unchanged_body_writes_nothing(
    client: Client, store: PostgresStore
) -> None:
    _, headers = await api_owner(store, "flow")
    path = "/v1/jobs/by-name/flow-put"
    created = await ok(await client.put(path, json=spec(), headers=headers), 201)
    again = await ok(await client.put(path, json=spec(), headers=headers))
    assert again["updated_at"] == created["updated_at"] and again["target"]["flow"] == FLOW
    changed = await ok(await client.put(path, json=spec({**FLOW, "key": "other"}), headers=headers))
    assert changed["target"]["flow"]["key"] == "other" and changed["updated_at"] != created["updated_at"]
    dropped = await ok(await client.put(path, json=spec(None), headers=headers))
    assert "flow" not in dropped["target"]


@pytest.mark.parametrize(
    "case",
    [
        ({**FLOW, "rate_per_s": 0}, 422, "invalid_value", "target.flow.rate_per_s"),
        ({**FLOW, "rate_per_s": 10001}, 422, "invalid_value", "target.flow.rate_per_s"),
        ({**FLOW, "parallelism": 0}, 422, "invalid_value", "target.flow.parallelism"),
        ({**FLOW, "parallelism": 10001}, 422, "invalid_value", "target.flow.parallelism"),
        ({**FLOW, "key": ""}, 422, "invalid_value", "target.flow.key"),
        ({**FLOW, "key": "x" * 101}, 422, "invalid_value", "target.flow.key"),
        ({**FLOW, "key": "a\nb"}, 422, "invalid_value", "target.flow.key"),
        ({**FLOW, "burst": 3}, 422, "unknown_field", "target.flow.burst"),
        ({"key": "k", "rate_per_s": 1}, 422, "missing_field", "target.flow.parallelism"),
        ({**FLOW, "parallelism": 1.5}, 400, "wrong_type", "target.flow.parallelism"),
        ({**FLOW, "rate_per_s": "5"}, 400, "wrong_type", "target.flow.rate_per_s"),
        ("billing-api", 400, "wrong_type", "target.flow"),
    ],
)
async def test_bad_flows_are_refused_naming_the_field(
    client: Client, store: PostgresStore, case: tuple[Any, int, str, str]
) -> None:
    flow, status, code, field = case
    _, headers = await api_owner(store, "flow")
    error = await refused(await client.post("/v1/jobs", json=spec(flow), headers=headers), status)
    assert (error["code"], error["field"]) == (code, field)
    job = await ok(await client.post("/v1/jobs", json=spec(None), headers=headers), 201)
    target = {"type": "webhook", "url": URL, "flow": flow}
    error = await refused(
        await client.patch(f"/v1/jobs/{job['id']}", json={"target": target}, headers=headers), status
    )
    assert (error["code"], error["field"]) == (code, field)
