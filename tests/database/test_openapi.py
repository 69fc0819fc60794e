"""/openapi.json is a valid OpenAPI 3.1 document that describes exactly the /v1 routes served.

The document is fetched from a live server (what clients see), validated with
openapi_spec_validator, compared with the aiohttp router in both directions, and real answers
are checked against its schemas with a 2020-12 JSON Schema validator.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from openapi_spec_validator import OpenAPIV31SpecValidator

from duetime.api.app import create_app
from duetime.core.model import TargetState
from duetime.core.ssrf import AddressPolicy
from duetime.storage.ports import TargetHealthReport
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap

Client = TestClient[web.Request, web.Application]
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


@pytest.fixture(scope="module")
async def served(pg_dsn: str) -> AsyncIterator[tuple[web.Application, Client, PostgresStore]]:
    store = await PostgresStore.open(ShardMap.single(pg_dsn))
    app = create_app(store, policy=AddressPolicy())
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield app, client, store
    await store.close()


@pytest.fixture(scope="module")
async def document(served: tuple[web.Application, Client, PostgresStore]) -> dict[str, Any]:
    resp = await served[1].get("/openapi.json")
    assert resp.status == 200
    doc: dict[str, Any] = await resp.json()
    return doc


def _schema_validator(document: dict[str, Any], name: str) -> Draft202012Validator:
    """A validator for one component schema, with its $refs resolved inside the document."""
    return Draft202012Validator({**document, "$ref": f"#/components/schemas/{name}"})


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1.")
    errors = [str(e.message) for e in OpenAPIV31SpecValidator(document).iter_errors()]
    assert errors == []


def test_every_v1_route_is_described_and_nothing_else(
    served: tuple[web.Application, Client, PostgresStore], document: dict[str, Any]
) -> None:
    app = served[0]
    routed = {
        (route.resource.canonical, route.method.lower())
        for route in app.router.routes()
        if route.resource is not None and route.resource.canonical.startswith("/v1/")
    }
    described = {
        (path, method) for path, item in document["paths"].items() for method in item if method in METHODS
    }
    assert routed == described
    assert len(routed) == 21  # GET /v1/jobs/{job_id}/changes (issue 30) is the 21st


def test_every_operation_declares_auth_errors_and_its_own_answers(document: dict[str, Any]) -> None:
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["bearer"]["description"],
    }
    assert document["security"] == [{"bearer": []}]
    operation_ids = set()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            operation_ids.add(operation["operationId"])
            statuses = set(operation["responses"])
            assert {"401", "503"} <= statuses, (path, method)
            if "{job_id}" in path:
                assert "404" in statuses, (path, method)
            if "requestBody" in operation:
                assert {"400", "413", "415", "422"} <= statuses, (path, method)
            for status, answer in operation["responses"].items():
                schema = answer["content"]["application/json"]["schema"]
                if int(status) >= 400:
                    assert schema == {"$ref": "#/components/schemas/Error"}, (path, method, status)
    assert len(operation_ids) == 21
    ops = document["paths"]
    assert set(ops["/v1/jobs"]["post"]["responses"]) >= {"200", "201"}
    assert "202" in ops["/v1/jobs/{job_id}/trigger"]["post"]["responses"]
    assert "409" in ops["/v1/jobs/{job_id}/replay"]["post"]["responses"]
    assert "409" in ops["/v1/jobs/{job_id}"]["patch"]["responses"]
    for name in ("JobSpec", "Job", "Run", "Error"):
        assert name in document["components"]["schemas"]


async def test_live_answers_conform_to_the_schemas(
    served: tuple[web.Application, Client, PostgresStore], document: dict[str, Any]
) -> None:
    _, client, store = served
    owner = f"owner-{uuid.uuid4().hex[:12]}"
    api_key, _ = await store.create_api_key(owner)
    headers = {"Authorization": f"Bearer {api_key}"}
    specs: list[dict[str, Any]] = [
        {
            "target": {"type": "webhook", "url": "https://1.1.1.1/x", "headers": {"A": "b"}},
            "schedule": {"cron": "*/10 * * * * *", "timezone": "America/New_York", "dst_gap": "skip"},
            "retry": {"max_attempts": 2},
            "payload": [1, "two", {"three": None}],
        },
        {
            "name": "once",
            "target": {"type": "queue", "broker": "redis", "topic": "stream:jobs"},
            "schedule": {"run_at": "2030-01-01T00:00:00.250+02:00"},
            "misfire": "skip",
        },
        {
            "target": {
                "type": "queue",
                "broker": "nats",
                "topic": "billing.invoices",
                "flow": {"key": "billing-api", "rate_per_s": 2.5, "parallelism": 4},
            },
            "schedule": {"every": "1h"},
            "on_failure": {
                "target": {
                    "type": "webhook",
                    "url": "https://1.1.1.1/f",
                    "flow": {"key": "pager", "rate_per_s": 1, "parallelism": 1},
                }
            },
        },
    ]
    job_schema, page_schema = _schema_validator(document, "Job"), _schema_validator(document, "JobPage")
    spec_schema = _schema_validator(document, "JobSpec")
    error_schema, run_page = _schema_validator(document, "Error"), _schema_validator(document, "RunPage")
    change_page = _schema_validator(document, "ChangePage")
    for spec in specs:
        spec_schema.validate(spec)
        resp = await client.post("/v1/jobs", json=spec, headers=headers)
        assert resp.status == 201
        job = await resp.json()
        job_schema.validate(job)
        paused = await (await client.post(f"/v1/jobs/{job['id']}/pause", headers=headers)).json()
        job_schema.validate(paused)
        runs = await (await client.get(f"/v1/jobs/{job['id']}/runs", headers=headers)).json()
        run_page.validate(runs)
        changes = await (await client.get(f"/v1/jobs/{job['id']}/changes", headers=headers)).json()
        change_page.validate(changes)
        assert [c["action"] for c in changes["items"]] == ["pause", "create"]
    page_schema.validate(await (await client.get("/v1/jobs?limit=1", headers=headers)).json())
    until = datetime(2030, 1, 1, tzinfo=UTC)
    await store.report_target_health(
        "w-openapi",
        [
            TargetHealthReport(owner, "1.1.1.1:443", TargetState.HEALTHY, 8, None, 3, 0, 1),
            TargetHealthReport(owner, "[2001:db8::1]:80", TargetState.BACKING_OFF, 0, until, 9, 9, 0),
        ],
    )
    targets = await (await client.get("/v1/targets?limit=1", headers=headers)).json()
    target_page = _schema_validator(document, "TargetPage")
    target_page.validate(targets)
    target_page.validate(await (await client.get("/v1/targets", headers=headers)).json())
    assert targets["next_cursor"] is not None
    assert not target_page.is_valid({**targets, "items": [{**targets["items"][0], "state": "down"}]})
    for resp in (
        await client.get("/v1/jobs"),
        await client.get(f"/v1/jobs/{uuid.uuid4()}", headers=headers),
        await client.post("/v1/jobs", json={"target": {}}, headers=headers),
        await client.put("/v1/jobs", headers=headers),
    ):
        assert resp.status >= 400
        error_schema.validate(await resp.json())
    # The schemas are strict enough to catch a wrong answer.
    assert not job_schema.is_valid({**job, "state": "running"})
    assert not job_schema.is_valid({**job, "target": {**job["target"], "extra": 1}})
    assert job["target"]["flow"] == {"key": "billing-api", "rate_per_s": 2.5, "parallelism": 4}
    assert not job_schema.is_valid({**job, "target": {**job["target"], "flow": None}})
    assert not job_schema.is_valid({**job, "target": {**job["target"], "flow": {"key": "k"}}})
    assert not spec_schema.is_valid({**specs[2], "target": {**specs[2]["target"], "flow": {"key": ""}}})
    assert not error_schema.is_valid({"error": {"code": "Not Snake", "message": "x"}})


def test_every_call_that_changes_a_job_takes_a_reason(document: dict[str, Any]) -> None:
    """Duetime-Reason (issue 30) on every changing call and on nothing else, each with its 422."""
    taking = set()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            names = {p["name"] for p in operation.get("parameters", [])}
            if "Duetime-Reason" in names:
                taking.add((path, method))
                assert "422" in operation["responses"], (path, method)
    assert taking == {
        ("/v1/jobs", "post"),
        ("/v1/jobs/{job_id}", "patch"),
        ("/v1/jobs/{job_id}", "delete"),
        ("/v1/jobs/by-name/{name}", "put"),
        *((f"/v1/jobs/{{job_id}}/{a}", "post") for a in ("pause", "resume", "trigger", "backfill", "replay")),
        *((f"/v1/jobs/bulk/{a}", "post") for a in ("pause", "resume", "cancel")),
    }


def test_every_operation_lists_every_status_it_can_answer(document: dict[str, Any]) -> None:
    """The statuses any /v1 call can answer are on every operation, 429 included; a body adds the
    body's statuses; create lists 409 (job_limit_reached)."""
    for path, item in document["paths"].items():
        for method, operation in item.items():
            statuses = set(operation["responses"])
            assert {"401", "429", "500", "503"} <= statuses, (path, method)
            if "requestBody" in operation:
                assert {"400", "413", "415", "422"} <= statuses, (path, method)
            assert "Retry-After" in operation["responses"]["429"]["headers"]
    create = document["paths"]["/v1/jobs"]["post"]["responses"]
    assert "job_limit_reached" in create["409"]["description"]
    error = document["components"]["schemas"]["Error"]["properties"]["error"]
    assert "request_id" in error["properties"] and "request_id" not in error["required"]


async def test_the_answers_of_the_limits_are_described(pg_dsn: str, document: dict[str, Any]) -> None:
    """Real 429 and 409 job_limit_reached answers, each a status its operation lists."""
    store = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=2)
    app = create_app(store, policy=AddressPolicy(), owner_rate_per_s=1.0, max_jobs_per_owner=1)
    error_schema = _schema_validator(document, "Error")
    try:
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            api_key, _ = await store.create_api_key(f"limits-{uuid.uuid4().hex[:12]}")
            headers = {"Authorization": f"Bearer {api_key}"}
            spec = {
                "target": {"type": "webhook", "url": "https://1.1.1.1/x"},
                "schedule": {"cron": "0 0 1 1 *"},
            }
            first = await client.post("/v1/jobs", json=spec, headers=headers)
            assert first.status == 201
            second = await client.post("/v1/jobs", json=spec, headers=headers)
            assert second.status == 409
            body = await second.json()
            error_schema.validate(body)
            assert body["error"]["code"] == "job_limit_reached"
            assert "409" in document["paths"]["/v1/jobs"]["post"]["responses"]
            limited = None
            for _ in range(5):
                resp = await client.get("/v1/jobs", headers=headers)
                if resp.status == 429:
                    limited = resp
                    break
            assert limited is not None and limited.headers["Retry-After"].isdigit()
            error_schema.validate(await limited.json())
            assert "429" in document["paths"]["/v1/jobs"]["get"]["responses"]
    finally:
        await store.close()


def test_the_api_doc_does_not_deny_the_rate_limit() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
    assert "does not answer 429" not in text and "does not rate-limit" not in text
    assert "| 429 |" in text and "job_limit_reached" in text


def test_every_v1_operation_lists_429_and_the_owner_limits_are_described() -> None:
    """The per-owner rate and limits answer on every /v1 call (issue 17, item 2)."""
    from duetime.api.openapi import build_openapi
    from duetime.core.validation import SpecLimits

    doc = build_openapi(SpecLimits())
    operations = {
        op["operationId"]: op
        for path, item in doc["paths"].items()
        if path.startswith("/v1/")
        for op in item.values()
    }
    assert operations
    for op_id, op in operations.items():
        assert "429" in op["responses"], op_id
        assert "Retry-After" in op["responses"]["429"]["headers"], op_id
    assert "job_limit_reached" in operations["create_job"]["responses"]["409"]["description"]
    assert "too_many_triggers" in operations["trigger_job"]["responses"]["409"]["description"]
