"""/openapi.json is a valid OpenAPI 3.1 document that describes exactly the /v1 routes served.

The document is fetched from a live server (what clients see), validated with
openapi_spec_validator, compared with the aiohttp router in both directions, and real answers
are checked against its schemas with a 2020-12 JSON Schema validator.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from openapi_spec_validator import OpenAPIV31SpecValidator

from duetime.api.app import create_app
from duetime.core.ssrf import AddressPolicy
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
    assert len(routed) == 18


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
    assert len(operation_ids) == 18
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
    api_key, _ = await store.create_api_key(f"owner-{uuid.uuid4().hex[:12]}")
    headers = {"Authorization": f"Bearer {api_key}"}
    specs = [
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
    ]
    job_schema, page_schema = _schema_validator(document, "Job"), _schema_validator(document, "JobPage")
    spec_schema = _schema_validator(document, "JobSpec")
    error_schema, run_page = _schema_validator(document, "Error"), _schema_validator(document, "RunPage")
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
    page_schema.validate(await (await client.get("/v1/jobs?limit=1", headers=headers)).json())
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
    assert not error_schema.is_valid({"error": {"code": "Not Snake", "message": "x"}})
