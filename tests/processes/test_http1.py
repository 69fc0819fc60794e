"""The webhook client (``workers/http1.py``) against scripted loopback servers: framing, keep-alive,
the pool's limits, and the verdict a worker gives for each way an answer can go wrong.

The servers here write raw bytes, so each answer is exactly the one under test (an aiohttp server
would tidy it up). The verdict texts are those of the aiohttp client the module replaced
(tests/processes/test_dispatch.py holds the rest of them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import ssl
import struct
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from duetime.core import ssrf
from duetime.core.delivery import Delivery
from duetime.core.errors import TargetNotAllowed
from duetime.core.model import Outcome, WebhookTarget
from duetime.core.runpath import Verdict
from duetime.core.signing import new_signing_secret
from duetime.workers import http1, webhook
from duetime.workers.dispatch import Dispatcher
from tests.support.tls import TLS_NAME
from tests.support.wait import until

OPEN = ssrf.AddressPolicy(allow_private=True)
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
Answer = bytes | str | None  # bytes to write; "RESET" / "CLOSE" / "HANG"; None: 200 OK


@dataclass
class Wire:
    """A raw HTTP/1.1 server: ``script(n)`` is the answer to the n-th request (1-based)."""

    script: Callable[[int], Answer]
    port: int = 0
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    open_now: int = 0
    peak: int = 0
    closed_by_client: int = 0
    delay_s: float = 0.0
    close_after_answer: bool = False
    close_idle_after_s: float | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.connections += 1
        self.open_now += 1
        self.peak = max(self.peak, self.open_now)
        try:
            while True:
                try:
                    if self.close_idle_after_s is not None and self.requests:
                        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.close_idle_after_s)
                    else:
                        head = await reader.readuntil(b"\r\n\r\n")
                except TimeoutError:
                    return  # an idle keep-alive connection, closed by the server
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.closed_by_client += 1
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self.requests.append(head + await reader.readexactly(length))
                self.arrived.set()
                answer = self.script(len(self.requests))
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if answer == "RESET":
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                if answer == "CLOSE":
                    return
                if answer == "HANG":
                    await asyncio.sleep(30)
                    return
                writer.write(OK if answer is None else answer)  # type: ignore[arg-type]
                await writer.drain()
                if self.close_after_answer:
                    return
        finally:
            self.open_now -= 1
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    servers: list[tuple[asyncio.Server, Wire]] = []

    async def start(script: Callable[[int], Answer] = lambda _n: None, **kw: Any) -> Wire:
        wire = Wire(script, **kw)
        server = await asyncio.start_server(wire.handle, "127.0.0.1", 0)
        wire.port = server.sockets[0].getsockname()[1]
        servers.append((server, wire))
        return wire

    yield start
    for server, wire in servers:
        server.close()
        for task in wire.tasks:
            task.cancel()
        await asyncio.gather(*wire.tasks, return_exceptions=True)
        await server.wait_closed()


class Loopback:
    """A checked resolver that answers 127.0.0.1 for any name, counting the questions."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_UNSPEC
    ) -> list[http1.ResolveResult]:
        self.asked.append(host)
        return [
            http1.ResolveResult(
                hostname=host,
                host="127.0.0.1",
                port=port,
                family=socket.AF_INET,
                proto=socket.IPPROTO_TCP,
                flags=socket.AI_NUMERICHOST,
            )
        ]


def endpoint(port: int, host: str = "wire.test", tls: bool = False) -> http1.Endpoint:
    return http1.Endpoint(tls=tls, host=host, port=port, authority=f"{host}:{port}", target="/hook")


def request(ep: http1.Endpoint) -> bytes:
    return http1.encode_request("POST", ep, "User-Agent: t\r\n", {"X-N": "1"}, b"{}")


async def call(pool: http1.Http1Pool, ep: http1.Endpoint, timeout_s: float = 5.0) -> http1.Answer:
    return await pool.request(ep, request(ep), timeout_s)


@pytest.fixture
async def pool() -> AsyncIterator[http1.Http1Pool]:
    p = http1.Http1Pool(Loopback(), limit=8)
    yield p
    await p.close()


# --- keep-alive and framing ---------------------------------------------------------------------


async def test_keep_alive_reuse_is_counted(serve: Any, pool: http1.Http1Pool) -> None:
    wire = await serve()
    ep = endpoint(wire.port)
    for _ in range(5):
        assert (await call(pool, ep)).status == 200
    assert (pool.connections_made, wire.connections, len(wire.requests)) == (1, 1, 5)
    assert pool.open_connections == 1


async def test_a_chunked_answer_is_read_whole_and_the_connection_kept(
    serve: Any, pool: http1.Http1Pool
) -> None:
    chunked = (
        b"HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\nRetry-After: 9\r\n\r\n"
    )
    wire = await serve(lambda _n: chunked)
    ep = endpoint(wire.port)
    first, second = await call(pool, ep), await call(pool, ep)
    # A trailer is not a header: its Retry-After is not read.
    assert first == second == http1.Answer(202, None)
    assert wire.connections == 1


async def test_a_body_over_64_kib_is_not_read_whole_and_the_connection_not_kept(
    serve: Any, pool: http1.Http1Pool
) -> None:
    size = 4 * http1.MAX_BODY_READ
    big = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size
    wire = await serve(lambda _n: big)
    ep = endpoint(wire.port)
    for _ in range(2):
        assert (await call(pool, ep)).status == 200
    assert wire.connections == 2


async def test_a_body_of_64_kib_keeps_the_connection(serve: Any, pool: http1.Http1Pool) -> None:
    size = http1.MAX_BODY_READ
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size
    wire = await serve(lambda _n: answer)
    ep = endpoint(wire.port)
    for _ in range(2):
        assert (await call(pool, ep)).status == 200
    assert wire.connections == 1


@pytest.mark.parametrize(
    ("answer", "kept"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 204 No Content\r\n\r\n", True),
    ],
)
async def test_the_server_decides_whether_a_connection_is_kept(
    serve: Any, pool: http1.Http1Pool, answer: bytes, kept: bool
) -> None:
    # The server keeps reading either way: only the client's choice is measured.
    wire = await serve(lambda _n: answer)
    ep = endpoint(wire.port)
    for _ in range(2):
        assert (await call(pool, ep)).status in (200, 204)
    assert wire.connections == (1 if kept else 2)


async def test_a_connection_the_server_closed_while_idle_is_not_handed_out(
    serve: Any, pool: http1.Http1Pool
) -> None:
    wire = await serve(close_idle_after_s=0.1)
    ep = endpoint(wire.port)
    assert (await call(pool, ep)).status == 200
    await until(  # the server closed it; the client saw the FIN
        lambda: pool.open_connections == 0, within=10, what="the idle connection closed", every=0.02
    )
    assert (await call(pool, ep)).status == 200
    assert (wire.connections, len(wire.requests)) == (2, 2)


async def test_a_close_racing_the_request_is_an_error_and_nothing_is_sent_twice(
    serve: Any, pool: http1.Http1Pool
) -> None:
    """The pooled connection's server reads the next request and closes without a word: the call
    fails as 'connection closed before an answer' and the request is not sent again (it may have
    been delivered; only the scheduler retries)."""
    wire = await serve(lambda n: None if n == 1 else "CLOSE")
    ep = endpoint(wire.port)
    assert (await call(pool, ep)).status == 200
    with pytest.raises(http1.ClosedBeforeAnswer):
        await call(pool, ep)
    await asyncio.sleep(0.1)
    assert (wire.connections, len(wire.requests)) == (1, 2)


async def test_interim_answers_are_skipped(serve: Any, pool: http1.Http1Pool) -> None:
    hints = (
        b"HTTP/1.1 103 Early Hints\r\nRetry-After: 1\r\n\r\nHTTP/1.1 429 Slow\r\nContent-Length: 0\r\n\r\n"
    )
    wire = await serve(lambda _n: hints)
    assert await call(pool, endpoint(wire.port)) == http1.Answer(429, None)


async def test_the_first_retry_after_is_read(serve: Any, pool: http1.Http1Pool) -> None:
    answer = b"HTTP/1.1 503 Busy\r\nretry-after: 7\r\nRetry-After: 9\r\nContent-Length: 0\r\n\r\n"
    wire = await serve(lambda _n: answer)
    assert await call(pool, endpoint(wire.port)) == http1.Answer(503, "7")


async def test_the_request_is_written_as_encoded(serve: Any, pool: http1.Http1Pool) -> None:
    wire = await serve()
    ep = endpoint(wire.port)
    await call(pool, ep)
    assert wire.requests == [
        b"POST /hook HTTP/1.1\r\nHost: wire.test:%d\r\nUser-Agent: t\r\nX-N: 1\r\n"
        b"Content-Length: 2\r\n\r\n{}" % wire.port
    ]


async def test_a_timeout_after_the_head_keeps_the_status_and_drops_the_connection(
    serve: Any, pool: http1.Http1Pool
) -> None:
    slow_body = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123"
    wire = await serve(lambda n: slow_body if n == 1 else None)
    ep = endpoint(wire.port)
    assert (await call(pool, ep, timeout_s=0.3)).status == 200
    assert (await call(pool, ep)).status == 200
    assert wire.connections == 2


async def test_a_cancelled_call_closes_its_connection(serve: Any, pool: http1.Http1Pool) -> None:
    wire = await serve(lambda n: "HANG" if n == 1 else None)
    ep = endpoint(wire.port)
    task = asyncio.create_task(call(pool, ep))
    await asyncio.wait_for(wire.arrived.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.open_connections == 0
    assert (await call(pool, ep)).status == 200
    assert wire.connections == 2


# --- calls without a task, and the shared deadlines ---------------------------------------------


async def test_send_on_an_idle_connection_writes_at_once_without_a_task(
    serve: Any, pool: http1.Http1Pool
) -> None:
    wire = await serve()
    ep = endpoint(wire.port)
    assert (await call(pool, ep)).status == 200
    tasks_before = asyncio.all_tasks()
    answer = pool.send(ep, request(ep), 5.0)
    assert asyncio.all_tasks() == tasks_before  # nothing but the future was made
    assert await answer == http1.Answer(200, None)
    assert (pool.connections_made, wire.connections, len(wire.requests)) == (1, 1, 2)


async def test_the_next_call_finds_the_connection_idle_as_soon_as_the_answer_is_in(
    serve: Any, pool: http1.Http1Pool
) -> None:
    """A call started from the previous answer's done callback (as a per-host pump starts them)
    gets the connection that answer freed: the connection is handed back before the callbacks."""
    wire = await serve()
    ep = endpoint(wire.port)
    second: list[asyncio.Future[http1.Answer]] = []
    first = pool.send(ep, request(ep), 5.0)
    first.add_done_callback(lambda _f: second.append(pool.send(ep, request(ep), 5.0)))
    assert (await first).status == 200
    await until(lambda: bool(second), within=5, what="the second call started")
    assert (await second[0]).status == 200
    assert (pool.connections_made, wire.connections) == (1, 1)


async def test_a_burst_to_one_host_opens_one_connection_per_call_in_flight_and_reuses_them(
    serve: Any,
) -> None:
    wire = await serve(delay_s=0.05)
    pool = http1.Http1Pool(Loopback(), limit=64)
    ep = endpoint(wire.port)
    try:
        for _ in range(3):
            answers = await asyncio.gather(*(pool.send(ep, request(ep), 5.0) for _ in range(10)))
            assert {a.status for a in answers} == {200}
    finally:
        await pool.close()
    assert (pool.connections_made, wire.connections, len(wire.requests)) == (10, 10, 30)


async def test_calls_with_one_timeout_each_time_out_at_their_own_deadline(
    serve: Any, pool: http1.Http1Pool
) -> None:
    """One timer watches every call with the same timeout: started 0.2 s apart against a target
    that never answers, each times out no sooner than its own timeout, in the order started."""
    wire = await serve(lambda _n: "HANG")
    ep = endpoint(wire.port)
    loop = asyncio.get_running_loop()
    ended: list[tuple[int, float]] = []

    async def one(i: int) -> None:
        await asyncio.sleep(0.2 * i)
        started = loop.time()
        with pytest.raises(TimeoutError):
            await call(pool, ep, timeout_s=0.5)
        ended.append((i, loop.time() - started))

    await asyncio.gather(*(one(i) for i in range(3)))
    assert [i for i, _ in ended] == [0, 1, 2]
    assert all(took >= 0.49 for _, took in ended), ended


async def test_a_call_that_opened_its_connection_times_out_at_its_own_deadline(serve: Any) -> None:
    """Its deadline was set before a slow connect, so it is earlier than that of a call started
    meanwhile on a pooled connection: it times out first, not with the later one."""
    wire = await serve(lambda n: None if n == 1 else "HANG")

    class SlowForB(Loopback):
        async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_UNSPEC
        ) -> list[http1.ResolveResult]:
            if host == "b.test":
                await asyncio.sleep(0.3)
            return await super().resolve(host, port, family)

    pool = http1.Http1Pool(SlowForB(), limit=4)
    loop = asyncio.get_running_loop()
    ended: list[str] = []
    try:
        a = endpoint(wire.port, "a.test")
        assert (await call(pool, a)).status == 200  # a pooled connection for a.test

        async def one(name: str, ep: http1.Endpoint, timeout_s: float) -> None:
            with pytest.raises(TimeoutError):
                await call(pool, ep, timeout_s)
            ended.append(name)

        b_call = asyncio.create_task(one("b", endpoint(wire.port, "b.test"), 1.0))
        await asyncio.sleep(0.1)
        a_started = loop.time()
        await asyncio.gather(b_call, one("a", a, 1.0))
        assert ended == ["b", "a"]
        assert loop.time() - a_started >= 0.99
    finally:
        await pool.close()


async def test_an_abandoned_send_closes_its_connection_and_nothing_is_sent_again(
    serve: Any, pool: http1.Http1Pool
) -> None:
    wire = await serve(delay_s=0.2)
    ep = endpoint(wire.port)
    answer = pool.send(ep, request(ep), 5.0)
    await asyncio.wait_for(wire.arrived.wait(), 5)
    answer.cancel()
    await until(  # closed when its answer came: the bytes of an abandoned call are never read
        lambda: pool.open_connections == 0,
        within=10,
        what="the abandoned call's connection closed",
        every=0.02,
    )
    assert (await call(pool, ep)).status == 200
    assert (wire.connections, len(wire.requests)) == (2, 2)


async def test_close_while_a_call_connects_fails_it_without_cancelling_its_caller(serve: Any) -> None:
    wire = await serve()

    class Slow(Loopback):
        async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_UNSPEC
        ) -> list[http1.ResolveResult]:
            await asyncio.sleep(0.3)
            return await super().resolve(host, port, family)

    pool = http1.Http1Pool(Slow(), limit=4)
    pending = asyncio.create_task(call(pool, endpoint(wire.port)))
    await asyncio.sleep(0.05)
    await pool.close()
    with pytest.raises(RuntimeError):
        await pending
    assert pool.open_connections == 0


# --- the pool's limits --------------------------------------------------------------------------


async def test_open_connections_stay_within_the_limit(serve: Any) -> None:
    wire = await serve(delay_s=0.1)
    pool = http1.Http1Pool(Loopback(), limit=2)
    try:
        answers = await asyncio.gather(*(call(pool, endpoint(wire.port)) for _ in range(7)))
    finally:
        await pool.close()
    assert {a.status for a in answers} == {200}
    assert wire.peak <= 2
    assert wire.connections == 2


async def test_at_the_limit_an_idle_connection_makes_room_for_another_host(serve: Any) -> None:
    a, b = await serve(), await serve()
    pool = http1.Http1Pool(Loopback(), limit=1)
    try:
        assert (await call(pool, endpoint(a.port))).status == 200
        assert (await call(pool, endpoint(b.port))).status == 200
        assert pool.open_connections == 1
        await until(
            lambda: a.closed_by_client == 1, within=10, what="the idle connection to a closed", every=0.02
        )
    finally:
        await pool.close()
    assert (a.connections, b.connections) == (1, 1)


async def test_idle_connections_expire(serve: Any) -> None:
    wire = await serve()
    pool = http1.Http1Pool(Loopback(), limit=4, idle_timeout_s=0.2)
    try:
        assert (await call(pool, endpoint(wire.port))).status == 200
        assert pool.open_connections == 1
        await until(
            lambda: pool.open_connections == 0 and wire.closed_by_client == 1,
            within=10,
            what="the idle connection expired",
            every=0.02,
        )
    finally:
        await pool.close()


async def test_close_closes_every_connection(serve: Any) -> None:
    wire = await serve()
    pool = http1.Http1Pool(Loopback(), limit=4)
    await asyncio.gather(*(call(pool, endpoint(wire.port)) for _ in range(3)))
    assert pool.open_connections == wire.connections
    await pool.close()
    await until(
        lambda: wire.closed_by_client == wire.connections,
        within=10,
        what="every connection closed",
        every=0.02,
    )
    with pytest.raises(RuntimeError):
        await call(pool, endpoint(wire.port))


async def test_every_new_connection_asks_the_resolver_and_names_are_never_shared(serve: Any) -> None:
    wire = await serve(close_after_answer=True)
    resolver = Loopback()
    pool = http1.Http1Pool(resolver, limit=4)
    try:
        for host in ("a.test", "b.test", "a.test"):
            assert (await call(pool, endpoint(wire.port, host))).status == 200
    finally:
        await pool.close()
    # Every connection was closed by the server, so each call resolved (and was checked) again;
    # the Host header named the URL's host each time.
    assert resolver.asked == ["a.test", "b.test", "a.test"]
    assert [r.split(b"\r\n")[1] for r in wire.requests] == [
        b"Host: %s:%d" % (h, wire.port) for h in (b"a.test", b"b.test", b"a.test")
    ]


async def test_two_names_on_one_address_get_two_connections(serve: Any, pool: http1.Http1Pool) -> None:
    wire = await serve()
    for host in ("a.test", "b.test", "a.test", "b.test"):
        assert (await call(pool, endpoint(wire.port, host))).status == 200
    assert wire.connections == 2


async def test_the_checked_resolver_remembers_a_literal_and_refuses_it_every_time() -> None:
    """An address literal's verdict is a pure function of the text and the policy: an allowed
    one's answer is remembered, a refused one is refused at every new connection."""
    allowing = webhook.CheckedResolver(OPEN)
    strict = webhook.CheckedResolver(ssrf.AddressPolicy())
    for _ in range(3):
        [result] = await allowing.resolve("127.0.0.1", 8080, socket.AF_UNSPEC)
        assert (result["host"], result["port"], result["family"]) == ("127.0.0.1", 8080, socket.AF_INET)
        result["host"] = "10.0.0.1"  # a caller's copy: what is remembered does not change
        with pytest.raises(TargetNotAllowed):
            await strict.resolve("127.0.0.1", 8080, socket.AF_UNSPEC)
    [v6] = await allowing.resolve("::1", 443, socket.AF_UNSPEC)
    assert (v6["host"], v6["family"]) == ("::1", socket.AF_INET6)


# --- TLS ----------------------------------------------------------------------------------------


async def test_tls_keeps_alive_and_verifies_the_name(tls_cert: tuple[Path, Path]) -> None:
    cert, key = tls_cert
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    wire = Wire(lambda _n: None)
    server = await asyncio.start_server(wire.handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    pool = http1.Http1Pool(Loopback(), limit=4, ssl_context=ssl.create_default_context(cafile=str(cert)))
    try:
        for _ in range(3):
            assert (await call(pool, endpoint(port, TLS_NAME, tls=True))).status == 200
        with pytest.raises(http1.CertificateRejected):
            await call(pool, endpoint(port, "other.duetime.invalid", tls=True))
        untrusting = http1.Http1Pool(Loopback(), limit=4)  # the default trust store
        try:
            with pytest.raises(http1.CertificateRejected):
                await call(untrusting, endpoint(port, TLS_NAME, tls=True))
        finally:
            await untrusting.close()
    finally:
        await pool.close()
        server.close()
        await asyncio.sleep(0.1)
        for task in wire.tasks:
            task.cancel()
        await asyncio.gather(*wire.tasks, return_exceptions=True)
    assert (wire.connections, len(wire.requests)) == (1, 3)


# --- what a worker makes of each answer (the verdicts of the aiohttp client, kept) ----------------

INVALID = (Outcome.FAILED, True, None, "invalid answer (ClientResponseError)")
CLOSED = (Outcome.FAILED, True, None, "connection closed before an answer")
H = b"HTTP/1.1 200 OK\r\n"
CATALOGUE: list[tuple[str, Answer, tuple[Outcome, bool, int | None, str | None]]] = [
    ("not HTTP", b"HELLO WORLD\r\n\r\n", INVALID),
    ("a header line without a colon", H + b"Bad Line\r\n\r\n", INVALID),
    ("two Content-Lengths", H + b"Content-Length: 0\r\nContent-Length: 5\r\n\r\nabcde", INVALID),
    ("a header of 20 KB", H + b"X-Big: " + b"a" * 20000 + b"\r\n\r\n", INVALID),
    ("200 headers", H + b"".join(b"X-%d: v\r\n" % i for i in range(200)) + b"\r\n", INVALID),
    ("a close before any answer", "CLOSE", CLOSED),
    ("a reset before any answer", "RESET", CLOSED),
    ("a close inside the head", H + b"Content-Le", CLOSED),
    ("no answer at all", "HANG", (Outcome.TIMED_OUT, True, None, "no answer within 1s")),
    ("a body cut short", H + b"Content-Length: 100\r\n\r\n0123", (Outcome.SUCCEEDED, False, 200, None)),
    ("a body until close", b"HTTP/1.0 201 Created\r\n\r\nto the end", (Outcome.SUCCEEDED, False, 201, None)),
    ("bare LF line ends", b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", (Outcome.SUCCEEDED, False, 200, None)),
    (
        "a folded header",
        H + b"X-A: a\r\n  b\r\nContent-Length: 0\r\n\r\n",
        (Outcome.SUCCEEDED, False, 200, None),
    ),
    ("101", b"HTTP/1.1 101 Switching\r\nUpgrade: x\r\n\r\n", (Outcome.FAILED, False, 101, "HTTP 101")),
    (
        "an unknown status",
        b"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n",
        (Outcome.FAILED, True, 999, "HTTP 999"),
    ),
    ("no reason phrase", b"HTTP/1.1 204\r\n\r\n", (Outcome.SUCCEEDED, False, 204, None)),
]


def delivery(url: str, timeout_s: int = 1) -> Delivery:
    return Delivery(
        job_id=str(uuid.uuid4()),
        scheduled_for=datetime(2026, 12, 1, tzinfo=UTC),
        attempt=1,
        fencing_token=1,
        owner="acme",
        signing_secret=new_signing_secret(),
        payload={"a": 1},
        target=WebhookTarget(url=url, timeout_s=timeout_s),
    )


@pytest.mark.parametrize(("answer", "expected"), [c[1:] for c in CATALOGUE], ids=[c[0] for c in CATALOGUE])
async def test_each_answer_gets_the_verdict_it_had(
    serve: Any, answer: Answer, expected: tuple[Outcome, bool, int | None, str | None]
) -> None:
    wire = await serve(lambda _n: answer, close_after_answer=True)
    d = Dispatcher(policy=OPEN, nats_url=None, redis_url=None)
    await d.start()
    try:
        result = await d.deliver(delivery(f"http://127.0.0.1:{wire.port}/hook"))
    finally:
        await d.close()
    assert (result.outcome, result.retryable, result.status_code, result.error) == expected


@pytest.mark.parametrize(("answer", "expected"), [c[1:] for c in CATALOGUE], ids=[c[0] for c in CATALOGUE])
async def test_a_call_begun_without_a_task_gets_the_same_verdicts(
    serve: Any, answer: Answer, expected: tuple[Outcome, bool, int | None, str | None]
) -> None:
    wire = await serve(lambda _n: answer, close_after_answer=True)
    client = webhook.new_client(OPEN, total_concurrency=4)
    try:
        d = delivery(f"http://127.0.0.1:{wire.port}/hook")
        assert isinstance(d.target, WebhookTarget)
        started = webhook.begin(client, policy=OPEN, d=d, target=d.target, body=b"{}", now=datetime.now(UTC))
        assert isinstance(started, webhook.Started)
        await asyncio.wait([started.answer])
        v = started.verdict()
    finally:
        await client.close()
    assert (v.outcome, v.retryable, v.status_code, v.error) == expected


async def test_begin_answers_a_refusal_at_once_and_resolves_a_literal_host_in_a_task(serve: Any) -> None:
    wire = await serve()
    client = webhook.new_client(ssrf.AddressPolicy(), total_concurrency=4)
    try:
        d = delivery(f"http://127.0.0.1:{wire.port}/hook")
        assert isinstance(d.target, WebhookTarget)
        refused = webhook.begin(
            client, policy=ssrf.AddressPolicy(), d=d, target=d.target, body=b"{}", now=datetime.now(UTC)
        )
        assert isinstance(refused, Verdict)
        assert refused.error is not None and refused.error.startswith("target_not_allowed")
        # Looks like an address, is not one to the guard: checked (and refused) at every call.
        odd = WebhookTarget(url=f"http://999.1.1.1:{wire.port}/hook")
        started = webhook.begin(
            client, policy=ssrf.AddressPolicy(), d=d, target=odd, body=b"{}", now=datetime.now(UTC)
        )
        assert isinstance(started, webhook.Started)
        await asyncio.wait([started.answer])
        v = started.verdict()
        assert v.outcome is Outcome.FAILED
        assert v == await webhook.call(
            client, policy=ssrf.AddressPolicy(), d=d, target=odd, body=b"{}", now=datetime.now(UTC)
        )
    finally:
        await client.close()
    assert wire.requests == []


async def test_the_request_a_worker_sends(serve: Any) -> None:
    """Request line and Host as aiohttp wrote them (yarl's encoding of the path and query, the
    port only when not the default), then the client's own headers, the job's, the contract's."""
    wire = await serve()
    d = Dispatcher(policy=OPEN, nats_url=None, redis_url=None)
    await d.start()
    try:
        target = WebhookTarget(url=f"http://LOCALHOST:{wire.port}/a b?q=1#frag", headers={"X-Job": "é"})
        result = await d.deliver(dataclasses.replace(delivery("http://unused"), target=target))
    finally:
        await d.close()
    assert result.outcome is Outcome.SUCCEEDED, result.error
    [raw] = wire.requests
    head, body = raw.split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[:5] == [
        b"POST /a%20b?q=1 HTTP/1.1",
        b"Host: localhost:%d" % wire.port,
        b"User-Agent: Duetime-Webhook/1",
        b"Accept: */*",
        "X-Job: é".encode(),
    ]
    assert lines[-1] == b"Content-Length: %d" % len(body)
    assert body == b'{"a":1}'
    names = [line.split(b":")[0].lower() for line in lines[1:]]
    assert len(names) == len(set(names))
    assert b"accept-encoding" not in names  # the body is dropped, never decoded
