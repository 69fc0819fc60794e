"""The dispatcher against real targets: a loopback HTTP receiver, Redis and NATS JetStream.

Set DUETIME_TEST_REDIS / DUETIME_TEST_NATS to point these tests at other brokers.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import secrets
import socket
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from duetime.core import ssrf
from duetime.core.delivery import Delivery
from duetime.core.errors import TargetNotAllowed
from duetime.core.model import Broker, Outcome, QueueTarget, WebhookMethod, WebhookTarget
from duetime.core.signing import encode_body, new_signing_secret, verify_signature
from duetime.workers.dispatch import CallResult, Dispatcher
from duetime.workers.webhook import CheckedResolver
from tests.support.tls import TLS_NAME

REDIS_URL = os.environ.get("DUETIME_TEST_REDIS", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("DUETIME_TEST_NATS", "nats://127.0.0.1:4222")
ALLOW_PRIVATE = ssrf.AddressPolicy(allow_private=True, allow_cidrs=())
DENY_PRIVATE = ssrf.AddressPolicy()
SCHEDULED_FOR = datetime(2026, 12, 1, 0, 0, 0, 250000, tzinfo=UTC)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, list[str]]
    body: bytes
    peer: tuple[str, int]


@dataclass
class Receiver:
    base: str
    port: int
    seen: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    state: dict[str, Receiver] = {}

    async def record(request: web.Request) -> Receiver:
        rec = state["r"]
        headers: dict[str, list[str]] = {}
        for name, value in request.headers.items():
            headers.setdefault(name.lower(), []).append(value)
        peer = request.transport.get_extra_info("peername") if request.transport else ("", 0)
        rec.seen.append(Seen(request.method, request.path, headers, await request.read(), peer[:2]))
        return rec

    async def ok(request: web.Request) -> web.Response:
        await record(request)
        return web.Response(status=200, text="ok")

    async def status(request: web.Request) -> web.Response:
        await record(request)
        code = int(request.match_info["code"])
        headers = {"Location": "/ok"} if 300 <= code < 400 else {}
        return web.Response(status=code, headers=headers)

    async def big(request: web.Request) -> web.Response:
        await record(request)
        return web.Response(status=200, body=b"x" * (1024 * 1024))

    async def slow(request: web.Request) -> web.Response:
        rec = await record(request)
        # Outlives the caller's 1 s timeout; released at teardown so shutdown is quick.
        try:
            await asyncio.wait_for(rec.release.wait(), timeout=10)
        except TimeoutError:
            pass
        return web.Response(status=200)

    async def concurrent(request: web.Request) -> web.Response:
        rec = await record(request)
        rec.in_flight += 1
        rec.peak = max(rec.peak, rec.in_flight)
        try:
            await asyncio.sleep(0.2)
        finally:
            rec.in_flight -= 1
        return web.Response(status=204)

    app = web.Application()
    app.router.add_route("*", "/ok", ok)
    app.router.add_route("*", "/status/{code}", status)
    app.router.add_route("*", "/big", big)
    app.router.add_route("*", "/slow", slow)
    app.router.add_route("*", "/concurrent", concurrent)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    rec = Receiver(base=f"http://127.0.0.1:{port}", port=port)
    state["r"] = rec
    yield rec
    rec.release.set()
    await runner.cleanup()


@pytest.fixture
async def dispatcher() -> AsyncIterator[Dispatcher]:
    d = Dispatcher(policy=ALLOW_PRIVATE, nats_url=NATS_URL, redis_url=REDIS_URL)
    await d.start()
    yield d
    await d.close()


def delivery(target: WebhookTarget | QueueTarget, payload: Any = None, **kw: Any) -> Delivery:
    fields: dict[str, Any] = {
        "job_id": str(uuid.uuid4()),
        "scheduled_for": SCHEDULED_FOR,
        "attempt": 1,
        "fencing_token": 7,
        "owner": "acme",
        "signing_secret": new_signing_secret(),
        "payload": payload,
        "target": target,
    }
    fields.update(kw)
    return Delivery(**fields)


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def assert_times(result: CallResult) -> None:
    assert result.started_at.tzinfo is not None
    assert result.started_at <= result.finished_at


# --- webhooks -----------------------------------------------------------------------------------


async def test_webhook_receives_the_contract(receiver: Receiver, dispatcher: Dispatcher) -> None:
    payload = {"hello": "wörld", "n": [1, 2.5, None]}
    job_headers = {
        "X-Custom": "from-the-job",
        "idempotency-key": "forged",
        "Webhook-Signature": "v1,forged",
        "Duetime-Attempt": "99",
        "Content-Type": "text/plain",
    }
    target = WebhookTarget(url=f"{receiver.base}/ok", headers=job_headers, timeout_s=5)
    d = delivery(target, payload, attempt=3, fencing_token=12345)
    result = await dispatcher.deliver(d)

    assert (result.outcome, result.retryable, result.status_code, result.error) == (
        Outcome.SUCCEEDED,
        False,
        200,
        None,
    )
    assert_times(result)
    [seen] = receiver.seen
    assert (seen.method, seen.path) == ("POST", "/ok")
    assert seen.body == encode_body(payload)
    assert json.loads(seen.body) == payload
    h = {name: values[0] for name, values in seen.headers.items()}
    assert all(len(values) == 1 for values in seen.headers.values()), seen.headers
    key = f"{d.job_id}:2026-12-01T00:00:00.25Z"
    assert h["idempotency-key"] == key
    assert h["duetime-job-id"] == d.job_id
    assert h["duetime-scheduled-for"] == "2026-12-01T00:00:00.25Z"
    assert h["duetime-attempt"] == "3"
    assert h["duetime-fencing-token"] == "12345"
    assert h["webhook-id"] == key
    assert abs(int(h["webhook-timestamp"]) - datetime.now(UTC).timestamp()) < 300
    assert h["content-type"] == "application/json"
    assert h["x-custom"] == "from-the-job"
    assert h["host"] == f"127.0.0.1:{receiver.port}"
    assert verify_signature(d.signing_secret, h, seen.body)
    assert not verify_signature(new_signing_secret(), h, seen.body)


async def test_put_with_null_payload(receiver: Receiver, dispatcher: Dispatcher) -> None:
    target = WebhookTarget(url=f"{receiver.base}/ok", method=WebhookMethod.PUT)
    d = delivery(target, None)
    result = await dispatcher.deliver(d)
    assert result.outcome is Outcome.SUCCEEDED
    [seen] = receiver.seen
    assert (seen.method, seen.body) == ("PUT", b"null")
    assert verify_signature(d.signing_secret, {k: v[0] for k, v in seen.headers.items()}, seen.body)


async def test_keep_alive_connection_is_reused(receiver: Receiver, dispatcher: Dispatcher) -> None:
    target = WebhookTarget(url=f"{receiver.base}/ok")
    for _ in range(3):
        assert (await dispatcher.deliver(delivery(target))).outcome is Outcome.SUCCEEDED
    assert len({s.peer for s in receiver.seen}) == 1


async def test_invalid_job_header_is_final_and_not_sent(receiver: Receiver, dispatcher: Dispatcher) -> None:
    target = WebhookTarget(url=f"{receiver.base}/ok", headers={"X-Inject": "a\r\nX-Evil: 1"})
    result = await dispatcher.deliver(delivery(target))
    assert (result.outcome, result.retryable) == (Outcome.FAILED, False)
    assert result.error == "job header 'X-Inject' is not a valid HTTP header"
    assert "X-Evil" not in (result.error or "")
    assert receiver.seen == []


@pytest.mark.parametrize(
    ("code", "outcome", "retryable"),
    [
        (200, Outcome.SUCCEEDED, False),
        (204, Outcome.SUCCEEDED, False),
        (301, Outcome.FAILED, False),
        (400, Outcome.FAILED, False),
        (404, Outcome.FAILED, False),
        (408, Outcome.FAILED, True),
        (429, Outcome.FAILED, True),
        (500, Outcome.FAILED, True),
        (503, Outcome.FAILED, True),
    ],
)
async def test_status_mapping(
    receiver: Receiver, dispatcher: Dispatcher, code: int, outcome: Outcome, retryable: bool
) -> None:
    result = await dispatcher.deliver(delivery(WebhookTarget(url=f"{receiver.base}/status/{code}")))
    assert (result.outcome, result.retryable, result.status_code) == (outcome, retryable, code)
    assert (result.error is None) == (outcome is Outcome.SUCCEEDED)
    if code == 301:
        assert result.error is not None
        assert "redirect refused" in result.error
    # Redirects are not followed: the receiver saw exactly the one request.
    assert [s.path for s in receiver.seen] == [f"/status/{code}"]


async def test_large_answer_is_read_only_partly(receiver: Receiver, dispatcher: Dispatcher) -> None:
    result = await dispatcher.deliver(delivery(WebhookTarget(url=f"{receiver.base}/big")))
    assert (result.outcome, result.status_code) == (Outcome.SUCCEEDED, 200)


async def test_timeout(receiver: Receiver, dispatcher: Dispatcher) -> None:
    result = await dispatcher.deliver(delivery(WebhookTarget(url=f"{receiver.base}/slow", timeout_s=1)))
    assert (result.outcome, result.retryable, result.status_code) == (Outcome.TIMED_OUT, True, None)
    assert result.error == "no answer within 1s"
    assert len(receiver.seen) == 1


async def test_connection_refused(dispatcher: Dispatcher) -> None:
    port = free_port()
    result = await dispatcher.deliver(delivery(WebhookTarget(url=f"http://127.0.0.1:{port}/x")))
    assert (result.outcome, result.retryable, result.status_code) == (Outcome.FAILED, True, None)
    assert result.error is not None
    assert result.error == f"cannot connect to 127.0.0.1:{port}: connection refused"


async def test_unresolvable_name_is_retryable(dispatcher: Dispatcher) -> None:
    result = await dispatcher.deliver(delivery(WebhookTarget(url="http://no-such-host.invalid/x")))
    assert (result.outcome, result.retryable) == (Outcome.FAILED, True)
    assert result.error == "name resolution failed for no-such-host.invalid"


@pytest.fixture
async def canary() -> AsyncIterator[tuple[int, list[int]]]:
    """A listener that only counts connections: it must see none from a refused call."""
    connections: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield port, connections
    server.close()
    await server.wait_closed()


async def _deliver_once(policy: ssrf.AddressPolicy, url: str) -> CallResult:
    """One webhook call to ``url`` by a dispatcher of its own under ``policy`` (a new session:
    nothing pooled from an earlier call)."""
    d = Dispatcher(policy=policy, nats_url=None, redis_url=None)
    await d.start()
    try:
        return await d.deliver(delivery(WebhookTarget(url=url)))
    finally:
        await d.close()


@pytest.mark.parametrize(
    ("policy", "host"),
    [
        # Refused by the static URL check (a loopback literal, an always-local name).
        (DENY_PRIVATE, "127.0.0.1"),
        (DENY_PRIVATE, "localhost"),
        # Passes the static check (::1 is allowed and "localhost" may mean ::1), but the
        # call-time resolution also answers 127.0.0.1: refused inside the connector.
        (ssrf.AddressPolicy(allow_cidrs=(ipaddress.IPv6Network("::1/128"),)), "localhost"),
    ],
)
async def test_ssrf_refused_at_call_time(
    canary: tuple[int, list[int]], policy: ssrf.AddressPolicy, host: str
) -> None:
    port, connections = canary
    result = await _deliver_once(policy, f"http://{host}:{port}/hook")
    assert (result.outcome, result.retryable, result.status_code) == (Outcome.FAILED, False, None)
    assert result.error is not None
    assert result.error.startswith("target_not_allowed:")
    assert connections == []


async def test_a_remembered_url_verdict_is_per_policy(canary: tuple[int, list[int]]) -> None:
    """The guard's verdict on a URL is remembered per (URL, policy): the same loopback URL that
    an open policy called is refused, without a connection, under a closed one (and the other
    way round), in the same process."""
    port, connections = canary
    url = f"http://127.0.0.1:{port}/hook"
    results = []
    for policy in (ALLOW_PRIVATE, DENY_PRIVATE, ALLOW_PRIVATE, DENY_PRIVATE):
        results.append(await _deliver_once(policy, url))
        if policy is DENY_PRIVATE:
            assert results[-1].error is not None
            assert results[-1].error.startswith("target_not_allowed:")
    # The open policy reached the canary (it closes at once: a retryable failure); the closed
    # one never connected.
    assert len(connections) == 2
    assert [r.retryable for r in results] == [True, False, True, False]


async def test_a_name_is_checked_again_for_each_new_connection(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Remembering a URL's verdict remembers nothing about its name's answers: a session's new
    connection resolves and checks the name again, so an answer re-pointed at a metadata address
    after an earlier call (DNS rebinding) is refused."""
    answers = [ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv4Address("169.254.169.254")]
    policy = ssrf.AddressPolicy(allow_cidrs=(ipaddress.IPv4Network("127.0.0.0/8"),))

    async def checked(host: str, port: int, p: ssrf.AddressPolicy) -> list[ssrf.IPAddress]:
        ip = answers.pop(0)
        reason = ssrf.refusal_reason(ip)
        if reason is not None and not p.permits(ip):
            raise TargetNotAllowed(f"{host} resolves to {ip}, {reason}")
        return [ip]

    monkeypatch.setattr(ssrf, "resolve_checked", checked)
    url = f"http://rebind.duetime.invalid:{receiver.port}/ok"
    results = []
    for _ in range(2):
        results.append(await _deliver_once(policy, url))
    assert results[0].outcome is Outcome.SUCCEEDED, results[0].error
    assert (results[1].outcome, results[1].retryable) == (Outcome.FAILED, False)
    assert results[1].error is not None
    assert "169.254.169.254" in results[1].error
    assert answers == []
    assert len(receiver.seen) == 1


async def test_connection_goes_to_the_checked_address(
    receiver: Receiver, dispatcher: Dispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name no real resolver knows reaches the receiver only via the checked answer."""
    calls: list[tuple[str, int]] = []
    real = ssrf.resolve_checked

    async def checked(host: str, port: int, policy: ssrf.AddressPolicy) -> list[ssrf.IPAddress]:
        calls.append((host, port))
        if host == "rebound.duetime.invalid":
            return [ipaddress.IPv4Address("127.0.0.1")]
        return await real(host, port, policy)

    monkeypatch.setattr(ssrf, "resolve_checked", checked)
    url = f"http://rebound.duetime.invalid:{receiver.port}/ok"
    result = await dispatcher.deliver(delivery(WebhookTarget(url=url)))
    assert result.outcome is Outcome.SUCCEEDED, result.error
    assert calls == [("rebound.duetime.invalid", receiver.port)]
    [seen] = receiver.seen
    # The URL's name is kept for the Host header (and would be for TLS SNI).
    assert seen.headers["host"] == [f"rebound.duetime.invalid:{receiver.port}"]


@pytest.fixture
async def tls_receiver(tls_cert: tuple[Path, Path]) -> AsyncIterator[tuple[int, ssl.SSLContext, list[str]]]:
    """An HTTPS receiver on 127.0.0.1 that records the SNI name each handshake asked for."""
    cert, key = tls_cert
    server_names: list[str] = []

    def on_sni(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        server_names.append(name or "")

    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    server_ctx.sni_callback = on_sni

    async def ok(request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/ok", ok)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx).start()
    client_ctx = ssl.create_default_context(cafile=str(cert))
    yield runner.addresses[0][1], client_ctx, server_names
    await runner.cleanup()


async def test_https_keeps_sni_and_name_verification(
    tls_receiver: tuple[int, ssl.SSLContext, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connecting to the checked address must not turn TLS into 'verify against an IP'."""
    port, client_ctx, server_names = tls_receiver

    async def checked(host: str, port: int, policy: ssrf.AddressPolicy) -> list[ssrf.IPAddress]:
        return [ipaddress.IPv4Address("127.0.0.1")]

    monkeypatch.setattr(ssrf, "resolve_checked", checked)
    d = Dispatcher(policy=ALLOW_PRIVATE, nats_url=None, redis_url=None, ssl_context=client_ctx)
    await d.start()
    try:
        good = await d.deliver(delivery(WebhookTarget(url=f"https://{TLS_NAME}:{port}/ok")))
        wrong = await d.deliver(delivery(WebhookTarget(url=f"https://other.duetime.invalid:{port}/ok")))
    finally:
        await d.close()
    assert (good.outcome, good.status_code) == (Outcome.SUCCEEDED, 200), good.error
    assert server_names[0] == TLS_NAME
    # The certificate does not name the other host: verification is on and uses the URL's name.
    assert (wrong.outcome, wrong.retryable) == (Outcome.FAILED, True)
    assert wrong.error == "TLS certificate of other.duetime.invalid not accepted"


async def test_checked_resolver_returns_only_allowed_addresses() -> None:
    allowed = await CheckedResolver(ALLOW_PRIVATE).resolve("localhost", 8080, socket.AF_UNSPEC)
    assert allowed
    assert all(ipaddress.ip_address(r["host"]).is_loopback for r in allowed)
    assert {r["port"] for r in allowed} == {8080}
    assert {r["hostname"] for r in allowed} == {"localhost"}
    v4 = await CheckedResolver(ALLOW_PRIVATE).resolve("127.0.0.1", 80, socket.AF_INET)
    assert [(r["host"], r["family"]) for r in v4] == [("127.0.0.1", socket.AF_INET)]
    with pytest.raises(TargetNotAllowed):
        await CheckedResolver(DENY_PRIVATE).resolve("localhost", 80, socket.AF_UNSPEC)


async def test_concurrency_cap_per_host(receiver: Receiver) -> None:
    d = Dispatcher(policy=ALLOW_PRIVATE, nats_url=None, redis_url=None, host_concurrency=3)
    await d.start()
    try:
        target = WebhookTarget(url=f"{receiver.base}/concurrent")
        results = await asyncio.gather(*(d.deliver(delivery(target)) for _ in range(10)))
    finally:
        await d.close()
    assert {r.outcome for r in results} == {Outcome.SUCCEEDED}
    assert len(receiver.seen) == 10
    assert 1 <= receiver.peak <= 3


# --- queues -------------------------------------------------------------------------------------


@pytest.mark.redis
async def test_redis_stream_message(dispatcher: Dispatcher) -> None:
    key = f"duetime-test-{secrets.token_hex(6)}"
    payload = {"order": 42, "name": "ünïcode"}
    d = delivery(QueueTarget(broker=Broker.REDIS, topic=key), payload, attempt=2, fencing_token=9)
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        result = await dispatcher.deliver(d)
        assert (result.outcome, result.retryable, result.error) == (Outcome.SUCCEEDED, False, None)
        assert_times(result)
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(key)  # type: ignore[assignment]
    finally:
        await client.delete(key)
        await client.aclose()
    [(_id, fields)] = entries
    assert fields == {
        b"payload": encode_body(payload),
        b"idempotency_key": f"{d.job_id}:2026-12-01T00:00:00.25Z".encode(),
        b"duetime_job_id": d.job_id.encode(),
        b"duetime_scheduled_for": b"2026-12-01T00:00:00.25Z",
        b"duetime_attempt": b"2",
        b"duetime_fencing_token": b"9",
    }


@pytest.mark.redis
async def test_redis_wrong_type_is_final(dispatcher: Dispatcher) -> None:
    key = f"duetime-test-{secrets.token_hex(6)}"
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        await client.set(key, "not a stream")
        result = await dispatcher.deliver(delivery(QueueTarget(broker=Broker.REDIS, topic=key)))
    finally:
        await client.delete(key)
        await client.aclose()
    assert (result.outcome, result.retryable) == (Outcome.FAILED, False)
    assert result.error is not None
    assert "WRONGTYPE" in result.error


@pytest.mark.nats
async def test_nats_jetstream_message_and_dedup(dispatcher: Dispatcher) -> None:
    tag = secrets.token_hex(6)
    stream, subject = f"DUETIME_TEST_{tag}", f"duetime.test.{tag}"
    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[subject])
    try:
        payload = {"x": 1}
        d = delivery(QueueTarget(broker=Broker.NATS, topic=subject), payload, fencing_token=5)
        result = await dispatcher.deliver(d)
        assert (result.outcome, result.retryable, result.error) == (Outcome.SUCCEEDED, False, None)
        # A retry of the same occurrence carries the same Nats-Msg-Id: JetStream drops it.
        again = await dispatcher.deliver(
            delivery(d.target, payload, job_id=d.job_id, attempt=2, fencing_token=6)
        )
        assert again.outcome is Outcome.SUCCEEDED
        info = await js.stream_info(stream)
        assert info.state.messages == 1
        sub = await js.pull_subscribe(subject, durable=f"c{tag}", stream=stream)
        [msg] = await sub.fetch(1, timeout=5)
        await msg.ack()
    finally:
        await js.delete_stream(stream)
        await nc.close()
    key = f"{d.job_id}:2026-12-01T00:00:00.25Z"
    assert msg.data == encode_body(payload)
    assert msg.headers is not None
    assert {k: v for k, v in msg.headers.items() if not k.startswith("Nats-Expected")} == {
        "Idempotency-Key": key,
        "Duetime-Job-Id": d.job_id,
        "Duetime-Scheduled-For": "2026-12-01T00:00:00.25Z",
        "Duetime-Attempt": "1",
        "Duetime-Fencing-Token": "5",
        "Nats-Msg-Id": key,
    }


@pytest.mark.nats
async def test_nats_connection_is_made_again_after_it_closed(dispatcher: Dispatcher) -> None:
    subject = f"duetime.nostream.{secrets.token_hex(6)}"
    target = QueueTarget(broker=Broker.NATS, topic=subject)
    first = await dispatcher.deliver(delivery(target))
    assert first.error == f"no JetStream stream captures subject {subject}: create one"
    queues = dispatcher._queues
    old = queues._nats
    assert old is not None
    await old.close()  # as when the server drops us: the client does not reconnect by itself
    second = await dispatcher.deliver(delivery(target))
    assert second.error == first.error
    assert queues._nats is not None
    assert queues._nats is not old
    assert queues._nats.is_connected


@pytest.mark.nats
async def test_nats_subject_without_stream_is_final(dispatcher: Dispatcher) -> None:
    subject = f"duetime.nostream.{secrets.token_hex(6)}"
    result = await dispatcher.deliver(delivery(QueueTarget(broker=Broker.NATS, topic=subject)))
    assert (result.outcome, result.retryable) == (Outcome.FAILED, False)
    assert result.error == f"no JetStream stream captures subject {subject}: create one"


@pytest.mark.parametrize("broker", [Broker.NATS, Broker.REDIS])
async def test_unreachable_broker_is_retryable(broker: Broker) -> None:
    port = free_port()
    d = Dispatcher(
        policy=DENY_PRIVATE,
        nats_url=f"nats://127.0.0.1:{port}",
        redis_url=f"redis://127.0.0.1:{port}/0",
        broker_timeout_s=2.0,
    )
    await d.start()
    try:
        result = await d.deliver(delivery(QueueTarget(broker=broker, topic="duetime.unreachable")))
    finally:
        await d.close()
    assert (result.outcome, result.retryable) == (Outcome.FAILED, True)
    assert result.error is not None
    assert result.error.startswith(f"{'NATS' if broker is Broker.NATS else 'Redis'} unavailable")


@pytest.mark.parametrize(
    ("broker", "variable"), [(Broker.NATS, "DUETIME_NATS_URL"), (Broker.REDIS, "DUETIME_REDIS_URL")]
)
async def test_unconfigured_broker_is_final(broker: Broker, variable: str) -> None:
    d = Dispatcher(policy=DENY_PRIVATE, nats_url=None, redis_url=None)
    await d.start()
    try:
        result = await d.deliver(delivery(QueueTarget(broker=broker, topic="t")))
    finally:
        await d.close()
    assert (result.outcome, result.retryable) == (Outcome.FAILED, False)
    assert result.error == f"broker not configured (set {variable})"


@pytest.mark.parametrize(
    ("broker", "topic"),
    [(Broker.NATS, "duetime.runs.0"), (Broker.NATS, "_INBOX.x"), (Broker.REDIS, "__keyspace@0__:x")],
)
async def test_a_forbidden_topic_fails_for_good_without_a_publish(broker: Broker, topic: str) -> None:
    """A job stored before its topic became forbidden (issue 17, item 1): checked again at publish."""
    nc = await nats.connect(NATS_URL)
    seen: list[Any] = []

    async def record(msg: Any) -> None:
        seen.append(msg)

    sub = await nc.subscribe(">" if broker is Broker.NATS else "never.matches", cb=record)
    r = aioredis.Redis.from_url(REDIS_URL)
    before = await r.exists(topic)
    d = Dispatcher(policy=ALLOW_PRIVATE, nats_url=NATS_URL, redis_url=REDIS_URL)
    await d.start()
    try:
        results = [await d.deliver(delivery(QueueTarget(broker=broker, topic=topic)))]
        if broker is Broker.REDIS:
            batch = await d.deliver_redis_many([delivery(QueueTarget(broker=broker, topic=topic))])
            verdicts = batch.verdicts
            assert verdicts[0].error is not None and "topic_not_allowed" in verdicts[0].error
        await nc.flush()
        await asyncio.sleep(0.2)
    finally:
        await d.close()
        await sub.unsubscribe()
        await nc.close()
    for result in results:
        assert result.outcome is Outcome.FAILED and not result.retryable
        assert result.error is not None and result.error.startswith("topic_not_allowed:"), result.error
    assert [m for m in seen if m.subject == topic] == []
    assert await r.exists(topic) == before
    await r.aclose()


async def test_the_owner_rule_is_applied_at_publish() -> None:
    from duetime.core.topics import TopicPolicy, TopicRule

    d = Dispatcher(
        policy=ALLOW_PRIVATE,
        nats_url=NATS_URL,
        redis_url=REDIS_URL,
        topic_policy=TopicPolicy(rule=TopicRule.OWNER_PREFIX),
    )
    await d.start()
    try:
        other = await d.deliver(delivery(QueueTarget(broker=Broker.NATS, topic="bob.events"), owner="alice"))
    finally:
        await d.close()
    assert other.outcome is Outcome.FAILED and not other.retryable
    assert other.error is not None and "alice." in other.error
