"""What a black-box probe of a running node found (issue 17), each through a real `duetime api`
process: the answer over HTTP, and for the slow-client items the behaviour of a raw socket."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.faults.harness import NodeProc, node_env

METRICS_TOKEN = "metrics-" + uuid.uuid4().hex
PROBE_ENV = {
    "DUETIME_LOG_LEVEL": "INFO",
    "DUETIME_HTTP_HEADER_TIMEOUT_S": "1",
    "DUETIME_HTTP_BODY_TIMEOUT_S": "1",
    "DUETIME_METRICS_TOKEN": METRICS_TOKEN,
    "DUETIME_TOPIC_POLICY": "owner_prefix",
    "DUETIME_NATS_RUN_SUBJECT": "acme.sched",
    "DUETIME_MAX_PENDING_TRIGGERS": "3",
    "DUETIME_MAX_JOB_BYTES_PER_OWNER": "300000",
}


@pytest.fixture(scope="module")
async def api(pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NodeProc]:
    log = tmp_path_factory.mktemp("probe") / "api.log"
    log.touch()
    proc = NodeProc(node_env(pg_dsn, **PROBE_ENV), "api", log)
    try:
        await proc.ready()
        yield proc
    finally:
        await proc.stop()


OWNER = f"probe-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
async def key(pg_dsn: str) -> str:
    store = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=1)
    try:
        return (await store.create_api_key(OWNER))[0]
    finally:
        await store.close()


async def _call(
    api: NodeProc, key: str, method: str, path: str, body: Any = None, **headers: str
) -> tuple[int, Any, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method, api.url + path, json=body, headers={"Authorization": f"Bearer {key}", **headers}
        ) as resp,
    ):
        return resp.status, resp.headers, await resp.json(content_type=None)


def _cron(**schedule: Any) -> dict[str, Any]:
    return {
        "target": {"type": "webhook", "url": "https://example.com/hook", "headers": {"X-Token": "s3cret"}},
        "schedule": {"cron": "0 3 * * *", **schedule},
    }


# --- item 7: a schedule that can never fire within the horizon ----------------------------------


async def test_a_start_at_past_the_horizon_is_refused_on_post_and_patch(api: NodeProc, key: str) -> None:
    status, _, body = await _call(api, key, "POST", "/v1/jobs", _cron(start_at="9999-01-01T00:00:00Z"))
    assert status == 422, body
    assert body["error"]["code"] == "cron_never_fires"
    assert body["error"]["field"] == "schedule.start_at"
    status, _, job = await _call(api, key, "POST", "/v1/jobs", _cron())
    assert status == 201, job
    status, _, body = await _call(
        api,
        key,
        "PATCH",
        f"/v1/jobs/{job['id']}",
        {"schedule": {"cron": "0 3 * * *", "start_at": "9999-01-01T00:00:00Z"}},
    )
    assert status == 422 and body["error"]["code"] == "cron_never_fires", body
    status, _, still = await _call(api, key, "GET", f"/v1/jobs/{job['id']}")
    assert still["state"] == "scheduled" and still["next_run_at"] == job["next_run_at"]


# --- item 8: header secrets do not follow the URL to another origin -----------------------------


async def test_a_patch_to_another_origin_must_resend_secret_headers(api: NodeProc, key: str) -> None:
    status, _, job = await _call(api, key, "POST", "/v1/jobs", _cron())
    assert status == 201, job
    path = f"/v1/jobs/{job['id']}"
    for url in (
        "https://evil.example.org/hook",
        "http://example.com/hook",
        "https://example.com:8443/hook",
    ):
        target = {"type": "webhook", "url": url, "headers": {"X-Token": "<redacted>"}}
        status, _, body = await _call(api, key, "PATCH", path, {"target": target})
        assert status == 422, (url, body)
        assert body["error"]["code"] == "invalid_header"
        assert body["error"]["field"] == "target.headers.X-Token"
        assert "resend" in body["error"]["message"].lower()
    # The same origin keeps the stored secret; a new origin with the value sent again is fine.
    same = {"type": "webhook", "url": "https://EXAMPLE.com:443/other", "headers": {"X-Token": "<redacted>"}}
    status, _, body = await _call(api, key, "PATCH", path, {"target": same})
    assert status == 200, body
    moved = {"type": "webhook", "url": "https://other.example.org/h", "headers": {"X-Token": "new"}}
    status, _, body = await _call(api, key, "PATCH", path, {"target": moved})
    assert status == 200, body


# --- item 3: slow clients, declared lengths, disconnects (raw sockets) -------------------------


async def _open(api: NodeProc) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(api.url)
    assert parts.hostname is not None and parts.port is not None
    return await asyncio.open_connection(parts.hostname, parts.port)


async def _closed_after(reader: asyncio.StreamReader, within: float) -> tuple[float, bytes]:
    """Seconds until the server closed the connection, and what it sent before closing."""
    started = time.monotonic()
    data = b""
    async with asyncio.timeout(within):
        while chunk := await reader.read(65536):
            data += chunk
    return time.monotonic() - started, data


async def _metric_500s(api: NodeProc) -> float:
    headers = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    async with aiohttp.ClientSession() as http, http.get(api.url + "/metrics", headers=headers) as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("duetime_api_requests_total{") and 'status="500"' in line
    )


async def test_a_connection_that_sends_nothing_is_closed(api: NodeProc) -> None:
    reader, writer = await _open(api)
    took, data = await _closed_after(reader, within=8)
    writer.close()
    assert took < 5 and data == b""


async def test_a_connection_that_sends_half_its_headers_is_closed(api: NodeProc) -> None:
    reader, writer = await _open(api)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: a")
    await writer.drain()
    for _ in range(3):  # a byte now and then must not keep it open
        await asyncio.sleep(0.4)
        writer.write(b"a")
    took, data = await _closed_after(reader, within=8)
    writer.close()
    assert took < 5, took
    assert b"200 OK" not in data


async def test_an_idle_keep_alive_connection_is_closed(api: NodeProc) -> None:
    reader, writer = await _open(api)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    took, data = await _closed_after(reader, within=8)
    writer.close()
    assert data.startswith(b"HTTP/1.1 200"), data[:100]
    assert took < 5


async def test_a_declared_length_over_the_limit_is_refused_before_the_body(api: NodeProc, key: str) -> None:
    reader, writer = await _open(api)
    writer.write(
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\n".encode()
        + b"Content-Length: 1000000000000\r\n\r\n{"
    )
    await writer.drain()
    started = time.monotonic()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    assert time.monotonic() - started < 0.9, "answered before any body timeout"
    assert head.startswith(b"HTTP/1.1 413"), head
    _, rest = await _closed_after(reader, within=5)
    writer.close()
    assert b"body_too_large" in rest


async def test_a_stalled_body_is_answered_408_and_a_disconnect_is_not_a_500(api: NodeProc, key: str) -> None:
    before = await _metric_500s(api)
    offset = api.log.stat().st_size
    request = (
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\n".encode()
        + b'Content-Length: 100\r\n\r\n{"target"'
    )
    reader, writer = await _open(api)
    writer.write(request)
    await writer.drain()
    took, data = await _closed_after(reader, within=8)
    writer.close()
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"request_timeout" in data and took < 5
    for _ in range(5):  # clients that give up half-way through their body
        reader, writer = await _open(api)
        writer.write(request)
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()
    await asyncio.sleep(0.5)
    assert await _metric_500s(api) == before
    log = api.log.read_bytes()[offset:].decode(errors="replace")
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


# --- item 5: a parser rejection logs one line, no header values -------------------------------


async def test_an_over_long_authorization_header_never_reaches_the_log(api: NodeProc) -> None:
    offset = api.log.stat().st_size
    secret_tail = "Q" * 12000
    reader, writer = await _open(api)
    writer.write(
        f"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer dt_{secret_tail}\r\n\r\n".encode()
    )
    await writer.drain()
    _, data = await _closed_after(reader, within=8)
    writer.close()
    assert data.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), data[:200]
    # the answer is the API's fixed error body, with nothing of the request in it
    assert b"QQQQ" not in data and b'"code":"malformed_request"' in data, data[:400]
    await asyncio.sleep(0.3)
    log = api.log.read_bytes()[offset:].decode(errors="replace")
    assert "QQQQQQQQ" not in log and "Traceback" not in log, log[-2000:]
    rejected = [line for line in log.splitlines() if "rejected" in line]
    assert len(rejected) == 1 and "WARNING" in rejected[0], log[-2000:]


# --- item 9: headers, /metrics, duplicates ------------------------------------------------------


async def test_answers_name_no_server_software_and_authenticated_ones_are_not_cached(
    api: NodeProc, key: str
) -> None:
    async with aiohttp.ClientSession() as http:
        for path, headers in (
            ("/healthz", {}),
            ("/v1/jobs", {"Authorization": f"Bearer {key}"}),
            ("/v1/jobs", {}),
        ):
            async with http.get(api.url + path, headers=headers) as resp:
                assert "aiohttp" not in resp.headers.get("Server", "").lower(), resp.headers
                assert "python" not in resp.headers.get("Server", "").lower()
                if path.startswith("/v1"):
                    assert resp.headers.get("Cache-Control") == "no-store", (path, resp.status)
    reader, writer = await _open(api)  # an answer of the HTTP parser itself
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
    await writer.drain()
    _, data = await _closed_after(reader, within=8)
    writer.close()
    assert b" 400 " in data.split(b"\r\n", 1)[0] and b"aiohttp" not in data.lower(), data[:300]


async def test_metrics_need_the_operators_token(api: NodeProc) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(api.url + "/metrics") as resp:
            assert resp.status == 401
        async with http.get(api.url + "/metrics", headers={"Authorization": "Bearer wrong"}) as resp:
            assert resp.status == 401
        for scheme in ("Bearer", "bearer", "BEARER"):  # the scheme is case-insensitive
            headers = {"Authorization": f"{scheme} {METRICS_TOKEN}"}
            async with http.get(api.url + "/metrics", headers=headers) as resp:
                assert resp.status == 200 and "duetime_api_requests" in await resp.text()


async def test_a_duplicated_authorization_header_or_query_parameter_answers_400(
    api: NodeProc, key: str
) -> None:
    reader, writer = await _open(api)
    writer.write(
        f"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Authorization: Bearer dt_other\r\nConnection: close\r\n\r\n".encode()
    )
    await writer.drain()
    _, data = await _closed_after(reader, within=8)
    writer.close()
    assert data.startswith(b"HTTP/1.1 400"), data[:300]
    assert b"duplicate_header" in data
    status, _, body = await _call(api, key, "GET", "/v1/jobs?limit=1&limit=1000")
    assert status == 400 and body["error"]["code"] == "duplicate_parameter", body
    assert body["error"]["field"] == "limit"


async def _raw_create(api: NodeProc, key: str, *idempotency_lines: bytes) -> tuple[int, Any]:
    """POST /v1/jobs over a raw socket, with Idempotency-Key header lines exactly as given (an
    HTTP client would trim or refuse them)."""
    body = json.dumps(_cron(), separators=(",", ":")).encode()
    head = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    ).encode()
    reader, writer = await _open(api)
    writer.write(head + b"".join(line + b"\r\n" for line in idempotency_lines) + b"\r\n" + body)
    await writer.drain()
    _, data = await _closed_after(reader, within=8)
    writer.close()
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2] or b"null")


async def test_an_idempotency_key_sent_with_spaces_at_either_end_is_refused(api: NodeProc, key: str) -> None:
    """The parser trims a header's value, so a key sent as ' k ' used to be taken as 'k' (the
    contract: 422 when it has leading or trailing spaces as sent; two such headers are 400)."""
    tag = uuid.uuid4().hex[:8]
    for line in (
        f"Idempotency-Key:  lead-{tag}".encode(),
        f"Idempotency-Key: trail-{tag} ".encode(),
        f"Idempotency-Key: tab-{tag}\t".encode(),
        f"idempotency-key:   both-{tag}  ".encode(),
    ):
        status, body = await _raw_create(api, key, line)
        assert status == 422, (line, body)
        assert (
            body["error"]["code"] == "invalid_idempotency_key" and body["error"]["field"] == "Idempotency-Key"
        )
    # the usual spellings still work: one space or none after the colon, spaces inside the key
    status, body = await _raw_create(api, key, f"Idempotency-Key: in side {tag}".encode())
    assert status == 201, body
    again, replayed = await _raw_create(api, key, f"Idempotency-Key:in side {tag}".encode())
    assert again == 200 and replayed["id"] == body["id"]
    status, body = await _raw_create(
        api, key, f"Idempotency-Key: a-{tag}".encode(), f"Idempotency-Key: b-{tag}".encode()
    )
    assert status == 400 and body["error"]["code"] == "duplicate_header", body


async def test_metrics_can_move_to_a_listener_of_their_own(pg_dsn: str, tmp_path: Any) -> None:
    log = tmp_path / "api.log"
    log.touch()
    proc = NodeProc(node_env(pg_dsn, DUETIME_METRICS_PORT="0"), "api", log)
    try:
        await proc.ready()
        text = ""
        for _ in range(100):
            text = log.read_text(errors="replace")
            if "metrics on " in text:
                break
            await asyncio.sleep(0.05)
        metrics_url = text.split("metrics on ", 1)[1].split()[0]
        async with aiohttp.ClientSession() as http:
            async with http.get(proc.url + "/metrics") as resp:
                assert resp.status == 404
            async with http.get(metrics_url) as resp:
                assert resp.status == 200 and "duetime_api_requests" in await resp.text()
    finally:
        await proc.stop()


# --- item 1: queue topics ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("broker", "topic"),
    [
        ("nats", "duetime.runs.0"),
        ("nats", "acme.sched.3"),  # this node's own run queue prefix
        ("nats", "_INBOX.abc"),
        ("nats", "$JS.API.STREAM.LIST"),
        ("nats", "$SYS.REQ.SERVER.PING"),
        ("nats", "$KV.bucket.k"),
        ("redis", "__keyspace@0__:x"),
        ("redis", "__keyevent@0__:set"),
        ("redis", "duetime:idem:k"),
        ("nats", "another-owner.events"),  # DUETIME_TOPIC_POLICY=owner_prefix
        ("redis", "another-owner.stream"),
    ],
)
async def test_forbidden_topics_answer_422_on_post_and_patch(
    api: NodeProc, key: str, broker: str, topic: str
) -> None:
    spec = {"target": {"type": "queue", "broker": broker, "topic": topic}, "schedule": {"cron": "0 3 * * *"}}
    status, _, body = await _call(api, key, "POST", "/v1/jobs", spec)
    assert status == 422, body
    assert body["error"]["code"] == "topic_not_allowed" and body["error"]["field"] == "target.topic"
    ok = {
        "target": {"type": "queue", "broker": broker, "topic": f"{OWNER}.mine"},
        "schedule": {"cron": "0 3 * * *"},
    }
    status, _, job = await _call(api, key, "POST", "/v1/jobs", ok)
    assert status == 201, job
    status, _, body = await _call(api, key, "PATCH", f"/v1/jobs/{job['id']}", {"target": spec["target"]})
    assert status == 422 and body["error"]["code"] == "topic_not_allowed", body


# --- item 2: limits that limit -------------------------------------------------------------------


async def test_queued_triggers_of_one_job_are_capped_with_409(api: NodeProc, key: str) -> None:
    # A run due now that nothing serves (an api-only node): every trigger after the first queues.
    status, _, job = await _call(api, key, "POST", "/v1/jobs", _cron())
    assert status == 201, job
    path = f"/v1/jobs/{job['id']}/trigger"
    answers = [await _call(api, key, "POST", path) for _ in range(8)]
    statuses = [a[0] for a in answers]
    assert statuses.count(202) == 4, statuses  # one run now, then 3 queued
    assert set(statuses[4:]) == {409}, statuses
    body = answers[-1][2]
    assert body["error"]["code"] == "too_many_triggers", body
    assert "3" in body["error"]["message"]


async def test_stored_bytes_per_owner_are_capped_with_409(pg_dsn: str, api: NodeProc) -> None:
    store = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=1)
    try:
        big_key = (await store.create_api_key(f"bytes-{uuid.uuid4().hex[:8]}"))[0]
    finally:
        await store.close()
    spec = {**_cron(), "payload": {"blob": "x" * 60000}}
    statuses = []
    for _ in range(12):
        status, _, body = await _call(api, big_key, "POST", "/v1/jobs", spec)
        statuses.append(status)
        if status == 409:
            assert body["error"]["code"] == "job_bytes_limit_reached", body
            break
    assert statuses[-1] == 409 and 2 <= statuses.count(201) <= 6, statuses


async def test_a_stored_job_whose_topic_became_forbidden_fails_unpublished_with_the_reason(
    own_db: str, tmp_path: Any
) -> None:
    """Registered before the operator turned on owner_prefix: the worker asks again at publish."""
    import nats

    from duetime.core.model import Broker, JobSpec, OneOffSchedule, QueueTarget

    nats_url = "nats://127.0.0.1:4222"
    store = await PostgresStore.open(ShardMap.single(own_db), pool_size=1)
    try:
        owner = f"tenant-{uuid.uuid4().hex[:6]}"
        api_key = (await store.create_api_key(owner))[0]
        topic = f"someone-else.{uuid.uuid4().hex[:6]}"
        spec = JobSpec(
            target=QueueTarget(broker=Broker.NATS, topic=topic),
            schedule=OneOffSchedule(run_at=datetime.now(UTC)),
        )
        job, _ = await store.create_job(owner, spec)  # the store does not judge topics: the API did
    finally:
        await store.close()
    nc = await nats.connect(nats_url)
    seen: list[Any] = []

    async def record(msg: Any) -> None:
        seen.append(msg)

    await nc.subscribe(topic, cb=record)
    log = tmp_path / "run.log"
    log.touch()
    env = node_env(own_db, DUETIME_TOPIC_POLICY="owner_prefix", DUETIME_NATS_URL=nats_url)
    proc = NodeProc(env, "run", log)
    try:
        await proc.ready()
        runs: list[Any] = []
        for _ in range(200):
            status, _, page = await _call(proc, api_key, "GET", f"/v1/jobs/{job.id}/runs")
            runs = page["items"] if status == 200 else []
            if runs:
                break
            await asyncio.sleep(0.1)
        assert len(runs) == 1, runs
        assert runs[0]["outcome"] == "failed"
        assert runs[0]["error"].startswith("topic_not_allowed:") and f"{owner}." in runs[0]["error"]
        status, _, final = await _call(proc, api_key, "GET", f"/v1/jobs/{job.id}")
        assert final["state"] == "dead", final  # refused for good: no retry
        await nc.flush()
        assert seen == []
    finally:
        await proc.stop()
        await nc.close()
