"""A lean HTTP/1.1 client for webhook calls: asyncio transports, keep-alive pool, httptools parser.

Why not aiohttp's ``ClientSession``: a webhook call needs one request and a status, yet a profile
of a worker's call path (``loadtest/webhook_bench.py``) put aiohttp's request machinery (request
and response objects, connector bookkeeping, payload registry, header preparation, its parser
callbacks) at 40-45 % of the client CPU of every call. This module does only what a webhook call
needs: one ``transport.write`` of the request, the answer parsed in C by ``httptools`` (llhttp),
and a connection handed back to the pool when it can carry another request.

What it keeps, because the call path's guarantees rest on it (docs/targets.md):

* SSRF. Every NEW connection asks the resolver it was given (the webhook module's checked
  resolver, ``core.ssrf.resolve_checked``) and connects only to an address it returned, so a name
  cannot be re-pointed between check and connect (DNS rebinding). A host written as an address is
  resolved through it too: nothing here skips the check. A pooled connection stays on the address
  it was checked for. The pool key is (scheme, host name, port, TLS context): a connection is
  never shared between host names.
* TLS. Certificate and host name verification stay on: ``create_connection(ssl=ctx,
  server_hostname=host)`` with the operator's context (an internal CA) or the default one.
* No surprises. No redirects (the status is handed back as it is), no cookies, no proxy from the
  environment, no decompression (``Accept-Encoding`` is not sent; the body is dropped anyway).
* Never a silent resend. A request is written once. A pooled connection whose peer closed it
  while idle is not handed out (checked before reuse), but a close that races with our write
  ends the call as ``ClosedBeforeAnswer``: the request may have been delivered, so only the
  scheduler, with the job's retry policy, may send it again.
* Bounded. ``timeout_s`` covers connect, send and the status line with headers; at most
  ``MAX_BODY_READ`` of a body is read and dropped, and the status decides from the moment the
  headers are in. Open connections (busy and idle) never exceed ``limit``; idle ones are closed
  after ``idle_timeout_s``.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypedDict, cast

import aiohappyeyeballs
import httptools

MAX_BODY_READ = 64 * 1024
# The status line and headers of an answer: beyond these the answer is refused, so a target
# cannot make a worker buffer without bound (llhttp itself sets no limit). aiohttp's limits were
# 8190 bytes a field and 128 fields; the section as a whole is capped here too.
MAX_HEAD_BYTES = 64 * 1024
MAX_FIELD_BYTES = 8190
MAX_FIELDS = 128
IDLE_TIMEOUT_S = 15.0  # as aiohttp's keepalive_timeout: a worker does not hold idle sockets forever
HAPPY_EYEBALLS_DELAY_S = 0.25  # as aiohttp: a stalled IPv6 path does not eat the call's timeout


class ResolveResult(TypedDict):
    """One checked address for a host name (the fields aiohttp's resolvers return, kept so the
    checked resolver reads the same)."""

    hostname: str
    host: str
    port: int
    family: int
    proto: int
    flags: int


class Resolver(Protocol):
    """Where a new connection's addresses come from: only addresses the SSRF guard allowed."""

    def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = ...
    ) -> Awaitable[list[ResolveResult]]: ...


class HttpError(Exception):
    """A call that produced no usable answer; the subclasses say which way it failed."""


class ConnectFailed(HttpError):
    """No connection: the last address's error (refused, unreachable, a TLS error other than the
    certificate), as the caller's verdict reports it."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class CertificateRejected(HttpError):
    """The TLS handshake refused the target's certificate (trust or host name)."""


class ClosedBeforeAnswer(HttpError):
    """The connection closed or was reset before the status line and headers were in."""


class InvalidAnswer(HttpError):
    """What came back is not an HTTP/1.x answer we accept (or its head is too large)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a URL's requests go and how they are written, computed once per URL.

    ``host`` is the name as resolved and verified (ASCII, IDNA-encoded; a trailing dot run
    folded to one, as aiohttp did); ``authority`` is the ``Host`` header (with the port when not
    the scheme's default); ``target`` is the path and query as sent.
    """

    tls: bool
    host: str
    port: int
    authority: str
    target: str


class Answer(NamedTuple):
    """The status and the one header the caller reads; the body was read (up to the limit) and
    dropped."""

    status: int
    retry_after: str | None


_PoolKey = tuple[bool, str, int]


class _Deadlines:
    """The exchanges in flight that have one same timeout, and one timer for all of them.

    A deadline is a call's start plus its timeout, and starts only move forward, so the order
    the exchanges were started in is their deadlines' order: one timer, armed for the first,
    expires every exchange due when it fires and is armed again for the new first. An exchange
    that ends is only removed (a dict deletion). Arming and cancelling a uvloop timer for every
    request cost ~3 µs of a call; this costs a timer per timeout's length.

    The one exchange that can start out of order is the first on a new connection (its deadline
    was set before the connect): it is listed like the others, but watched by a timer of its own
    (``_Connection.timer``). The shared timer is never late for the others: an entry listed out
    of order is due before some entry listed ahead of it, so the scan, which stops at the first
    entry not yet due, never stops at it while a later one is due.
    """

    __slots__ = ("calls", "last", "timer")

    def __init__(self) -> None:
        # Each exchange's answer future -> its connection, in the order they started.
        self.calls: dict[asyncio.Future[Answer], _Connection] = {}
        self.last = 0.0  # the latest deadline registered in order
        self.timer: asyncio.TimerHandle | None = None


class _Connection(asyncio.Protocol):
    """One connection and the parser of the answer in progress.

    The parser's callbacks only set fields; the answer's future is resolved once, when the answer
    is complete, when enough of its body was read, when the deadline passed, or when the
    connection failed or closed. The connection goes back to the pool (or is closed) in that same
    step, before the future's waiters run: the next call to the host finds it idle at once.
    """

    def __init__(self, pool: Http1Pool, key: _PoolKey) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        # Set by the pool once the connection is its own (after connect): a protocol made for a
        # failed attempt never gives back a slot it did not take.
        self.holds_slot = False
        self.idle_since = 0.0
        self.parser = httptools.HttpResponseParser(self)
        # Answers aiohttp's parser took: bare LF line ends and header values llhttp finds
        # malformed (obs-fold, odd bytes). Only header *values* and line ends are relaxed, which
        # the status and the dropped body do not depend on; the body's framing stays strict.
        self.parser.set_dangerous_leniencies(lenient_headers=True, lenient_optional_cr_before_lf=True)
        # The answer in progress: its future, deadline and where that deadline is watched.
        self.waiter: asyncio.Future[Answer] | None = None
        self.deadline = 0.0
        self.deadlines: _Deadlines | None = None
        self.timer: asyncio.TimerHandle | None = None
        self._reset_answer()

    def _reset_answer(self) -> None:
        self.status = 0
        self.retry_after: str | None = None
        self.head_done = False
        self.interim = False
        self.complete = False
        self.keep_alive = False
        self.body_read = 0
        self.head_bytes = 0
        self.fields = 0
        self.failure: HttpError | None = None

    # --- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio's, but they are read-write ones.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            # Bytes nobody asked for (on an idle connection, after the answer we read, or for a
            # call its caller gave up): the connection's framing can no longer be trusted.
            self._finish(False)
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # A 101 answer: its headers are in, what follows is not HTTP. The status decides.
            self.complete = True
        except httptools.HttpParserError as exc:
            if not self.head_done:
                self.failure = InvalidAnswer(str(exc))
            # After the headers, the status already decided; only this connection is lost.
            self._finish(False)
            return
        if self.complete:
            self._finish(self.keep_alive)
        elif self.body_read > MAX_BODY_READ:
            self._finish(False)
        elif not self.head_done:
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                self.failure = InvalidAnswer("answer head too large")
                self._finish(False)

    def eof_received(self) -> bool:
        self.closed = True  # never handed out again, even before connection_lost runs
        self._lost()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        self._lost()

    # --- httptools callbacks -------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:
            return  # a chunked body's trailer: not read, as aiohttp did not
        self.fields += 1
        if self.fields > MAX_FIELDS or len(name) + len(value) > MAX_FIELD_BYTES:
            raise InvalidAnswer("answer header too large")
        if self.retry_after is None and len(name) == 11 and name.lower() == b"retry-after":
            self.retry_after = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            # An interim answer (103 Early Hints): skipped, as aiohttp did; the real one follows.
            self.interim = True
            self.retry_after = None
            self.fields = 0
            return
        self.status = status
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body_read += len(body)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        self.complete = True
        # Read now: once this callback returns, llhttp's flags are those of the next message.
        self.keep_alive = self.parser.should_keep_alive() and self.status != 101

    # --- the pool's side -----------------------------------------------------------------------

    def _lost(self) -> None:
        """The peer closed (or reset): a request waiting for its head fails; one whose head is in
        keeps its status (the rest of the body does not matter)."""
        if self.waiter is not None:
            if not self.head_done and self.failure is None:
                self.failure = ClosedBeforeAnswer("connection closed before an answer")
            self._finish(False)

    def start(
        self, request: bytes, deadline: float, timeout_s: float, waiter: asyncio.Future[Answer]
    ) -> None:
        """Write ``request`` once; its answer (or failure) resolves ``waiter`` by ``deadline``."""
        pool = self.pool
        if waiter.done():
            # Its caller gave up while this connection was being opened: nothing was sent, and
            # the new connection serves the next call.
            pool._release(self, self.usable())
            return
        transport = self.transport
        if transport is None or not self.usable():
            # Closed by the peer since it was opened (before this task ran again): nothing sent.
            self.close()
            waiter.set_exception(ClosedBeforeAnswer("connection closed before an answer"))
            return
        self._reset_answer()
        self.waiter = waiter
        self.deadline = deadline
        deadlines = pool._deadlines.get(timeout_s)
        if deadlines is None:
            deadlines = pool._deadlines[timeout_s] = _Deadlines()
        self.deadlines = deadlines
        deadlines.calls[waiter] = self
        if deadline >= deadlines.last:
            deadlines.last = deadline
            if deadlines.timer is None:
                deadlines.timer = pool.loop.call_at(deadline, pool._expire, deadlines)
        else:
            self.timer = pool.loop.call_at(deadline, self._deadline)
        transport.write(request)

    def _finish(self, reusable: bool) -> None:
        """The answer is in, or the call is over without one: hand the connection back (or close
        it), then resolve the waiter with the status, or with why there is none."""
        waiter = self.waiter
        if waiter is None:
            return
        self.waiter = None
        if self.deadlines is not None:
            self.deadlines.calls.pop(waiter, None)
            self.deadlines = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if waiter.done():
            # Cancelled by its caller (worker shutdown): the answer's framing is lost with it.
            self.close()
            return
        self.pool._release(self, reusable and self.usable())
        if self.failure is not None:
            waiter.set_exception(self.failure)
        elif self.head_done:
            waiter.set_result(Answer(self.status, self.retry_after))
        else:
            waiter.set_exception(TimeoutError())

    def _deadline(self) -> None:
        self.timer = None
        self._finish(False)

    def usable(self) -> bool:
        transport = self.transport
        return not self.closed and transport is not None and not transport.is_closing()

    def close(self) -> None:
        self.closed = True
        self.pool._forget(self)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class Http1Pool:
    """Keep-alive HTTP/1.1 connections for one worker's webhook calls, shared by every target.

    ``request`` is the call: one attempt, never retried here. ``send`` is the same without a
    coroutine: it starts the call at once on an idle pooled connection (no task; a task only to
    open a new connection) and returns the answer's future. ``close`` closes every connection
    (the dispatcher's close at shutdown).
    """

    def __init__(
        self,
        resolver: Resolver,
        *,
        limit: int,
        ssl_context: ssl.SSLContext | None = None,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self._resolver = resolver
        self._limit = limit
        # The operator's context (internal CA) replaces the default trust store; verification of
        # the certificate and of the host name is on in both. The default one is made at the
        # first https call (loading the trust store takes milliseconds).
        self._ssl = ssl_context
        self._idle_timeout_s = idle_timeout_s
        self._idle: dict[_PoolKey, list[_Connection]] = {}
        self._all: set[_Connection] = set()
        self._open = 0  # connections open or being opened: never above limit
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self._deadlines: dict[float, _Deadlines] = {}  # per timeout_s
        self._connecting: dict[asyncio.Future[Answer], asyncio.Task[None]] = {}
        self._closed = False
        self.connections_made = 0  # new connections so far (keep-alive reuse is calls minus these)

    @property
    def open_connections(self) -> int:
        return self._open

    async def request(self, endpoint: Endpoint, request: bytes, timeout_s: float) -> Answer:
        """Send ``request`` (the whole message, as ``encode_request`` wrote it) and return the
        answer's status. Raises ``TimeoutError`` when no status line and headers arrived within
        ``timeout_s`` (connect included), an ``HttpError`` for the other failures, and whatever
        the resolver raises (the SSRF guard's refusal, a name that does not resolve). Cancelled,
        it closes the call's connection at once (the answer's framing is lost)."""
        waiter = self.send(endpoint, request, timeout_s)
        try:
            return await waiter
        except asyncio.CancelledError:
            self._abandon(waiter, timeout_s)
            raise

    def send(self, endpoint: Endpoint, request: bytes, timeout_s: float) -> asyncio.Future[Answer]:
        """``request`` without the coroutine: the call is started and its answer's future
        returned, resolved as ``request`` would return or raise.

        On an idle pooled connection the request is written before this returns, and nothing but
        the future is made for it (no task). A caller that cancels the future abandons the call:
        its connection is closed when the answer or the deadline comes (``request`` closes it at
        once); a connection being opened for it is kept for the next call."""
        if self._closed:
            raise RuntimeError("Http1Pool.send() after close()")
        loop = self.loop
        waiter: asyncio.Future[Answer] = loop.create_future()
        deadline = loop.time() + timeout_s
        key = (endpoint.tls, endpoint.host, endpoint.port)
        conn = self._take_idle(key)
        if conn is not None:
            conn.start(request, deadline, timeout_s, waiter)
        else:
            self._connecting[waiter] = loop.create_task(
                self._connect_and_start(
                    endpoint, request, key=key, deadline=deadline, timeout_s=timeout_s, waiter=waiter
                )
            )
        return waiter

    async def _connect_and_start(
        self,
        endpoint: Endpoint,
        request: bytes,
        *,
        key: _PoolKey,
        deadline: float,
        timeout_s: float,
        waiter: asyncio.Future[Answer],
    ) -> None:
        try:
            async with asyncio.timeout_at(deadline):
                conn = await self._open_connection(endpoint, key)
        except asyncio.CancelledError:
            if not waiter.done():
                waiter.cancel()
            raise
        except Exception as exc:  # the resolver's, the connect's, the timeout's: the call's result
            if not waiter.done():
                waiter.set_exception(exc)
            return
        finally:
            self._connecting.pop(waiter, None)
        conn.start(request, deadline, timeout_s, waiter)

    def _abandon(self, waiter: asyncio.Future[Answer], timeout_s: float) -> None:
        """``waiter``'s caller was cancelled: stop opening its connection, or close the one it is
        on, and give the slot back."""
        task = self._connecting.pop(waiter, None)
        if task is not None:
            task.cancel()
            return
        deadlines = self._deadlines.get(timeout_s)
        conn = None if deadlines is None else deadlines.calls.get(waiter)
        if conn is not None:
            conn._finish(False)

    def _expire(self, deadlines: _Deadlines) -> None:
        """A timeout's timer fired: end every exchange now due, arm it for the next one."""
        deadlines.timer = None
        # A millisecond's slack: libuv's timers count in milliseconds and may fire a fraction
        # early, which must not re-arm the timer for the same instant.
        now = self.loop.time() + 0.001
        due = []
        for conn in deadlines.calls.values():
            if conn.deadline > now:
                break
            due.append(conn)
        for conn in due:
            conn._finish(False)
        if deadlines.calls and not self._closed:
            first = next(iter(deadlines.calls.values()))
            deadlines.timer = self.loop.call_at(first.deadline, self._expire, deadlines)

    def _take_idle(self, key: _PoolKey) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        oldest_kept = self.loop.time() - self._idle_timeout_s
        while idle:
            conn = idle.pop()  # the most recently used: the others may expire
            if conn.usable() and conn.idle_since > oldest_kept:
                return conn
            conn.close()
        return None

    async def _open_connection(self, endpoint: Endpoint, key: _PoolKey) -> _Connection:
        while self._open >= self._limit:
            if self._evict_one():
                continue
            waiter: asyncio.Future[None] = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled or timed out: pass the turn on
                raise
            if self._closed:
                raise RuntimeError("Http1Pool closed")
            conn = self._take_idle(key)
            if conn is not None:
                return conn
        self._open += 1
        try:
            conn = await self._connect(endpoint, key)
        except BaseException:
            self._open -= 1
            self._wake()
            raise
        self.connections_made += 1
        if conn.closed:  # the peer closed it before this task ran again
            self._open -= 1
            self._wake()
        else:
            conn.holds_slot = True
            self._all.add(conn)
        return conn

    async def _connect(self, endpoint: Endpoint, key: _PoolKey) -> _Connection:
        """Resolve through the checked resolver and connect to one of its addresses, trying them
        as aiohttp's connector did (happy eyeballs; after a failure, the rest again): the error
        reported is the last one's."""
        hosts = await self._resolver.resolve(endpoint.host, endpoint.port, socket.AF_UNSPEC)
        context: ssl.SSLContext | None = None
        if endpoint.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        server_hostname = endpoint.host.rstrip(".") if endpoint.tls else None
        if len(hosts) == 1:
            # One address (a literal, or a name with one answer): connected to as it is, there
            # is nothing to interleave. The loop's own connect reads a numeric host without a
            # lookup (AI_NUMERICHOST: never a DNS query), where a socket handed to sock_connect
            # (happy eyeballs) was looked up again in uvloop's thread pool.
            h = hosts[0]
            try:
                _transport, conn = await self.loop.create_connection(
                    lambda: _Connection(self, key),
                    host=h["host"],
                    port=h["port"],
                    family=h["family"],
                    flags=socket.AI_NUMERICHOST,
                    ssl=context,
                    server_hostname=server_hostname,
                )
            except ssl.CertificateError:
                raise CertificateRejected(endpoint.host) from None
            except OSError as exc:  # ssl.SSLError included: a failed handshake for another reason
                if exc.errno is None and isinstance(exc, TimeoutError):
                    raise
                raise ConnectFailed(exc) from None
            return conn
        addr_infos: list[aiohappyeyeballs.AddrInfoType] = []
        for h in hosts:
            address: tuple[str, int] | tuple[str, int, int, int]
            if h["family"] == socket.AF_INET6:
                address = (h["host"], h["port"], 0, 0)
            else:
                address = (h["host"], h["port"])
            addr_infos.append((h["family"], socket.SOCK_STREAM, socket.IPPROTO_TCP, "", address))
        last: HttpError | None = None
        while addr_infos:
            try:
                sock = await aiohappyeyeballs.start_connection(
                    addr_infos, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY_S, loop=self.loop
                )
                _transport, conn = await self.loop.create_connection(
                    lambda: _Connection(self, key), sock=sock, ssl=context, server_hostname=server_hostname
                )
                return conn
            except ssl.CertificateError:
                last = CertificateRejected(endpoint.host)
            except OSError as exc:  # ssl.SSLError included: a failed handshake for another reason
                if exc.errno is None and isinstance(exc, TimeoutError):
                    raise
                last = ConnectFailed(exc)
            aiohappyeyeballs.pop_addr_infos_interleave(addr_infos, None)
        assert last is not None
        raise last

    def _release(self, conn: _Connection, reusable: bool) -> None:
        if not reusable or self._closed:
            conn.close()
            return
        conn.idle_since = self.loop.time()
        idle = self._idle.get(conn.key)
        if idle is None:
            idle = self._idle[conn.key] = []
        idle.append(conn)
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(self._idle_timeout_s / 3, self._sweep)
        self._wake()  # a request for another host waiting at the limit may close it for a slot

    def _forget(self, conn: _Connection) -> None:
        """A connection closed: give back its slot (once) and let a waiting request open one."""
        if conn.holds_slot:
            conn.holds_slot = False
            self._open -= 1
            self._all.discard(conn)
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _evict_one(self) -> bool:
        """At the limit, close the longest idle connection of any host to make room."""
        oldest: _Connection | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest.idle_since):
                oldest = idle[0]
        if oldest is None:
            return False
        self._idle[oldest.key].pop(0)
        oldest.close()
        return True

    def _sweep(self) -> None:
        """Close the connections idle longer than the idle timeout (and drop the dead ones)."""
        self._sweeper = None
        oldest_kept = self.loop.time() - self._idle_timeout_s
        for key, idle in list(self._idle.items()):
            kept = []
            for conn in idle:
                if conn.usable() and conn.idle_since > oldest_kept:
                    kept.append(conn)
                else:
                    conn.close()
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]
        if self._idle and not self._closed:
            self._sweeper = self.loop.call_later(self._idle_timeout_s / 3, self._sweep)

    async def close(self) -> None:
        """Close every connection, idle or busy (a busy call ends as ``ClosedBeforeAnswer``)."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for deadlines in self._deadlines.values():
            if deadlines.timer is not None:
                deadlines.timer.cancel()
                deadlines.timer = None
        for answer, task in list(self._connecting.items()):
            if not answer.done():
                answer.set_exception(RuntimeError("Http1Pool closed"))
            task.cancel()
        self._idle.clear()
        for conn in list(self._all):
            conn.close()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        await asyncio.sleep(0)  # let the transports run their connection_lost


def encode_request(
    method: str, endpoint: Endpoint, default_head: str, headers: dict[str, str], body: bytes
) -> bytes:
    """The whole request in one buffer (one write): request line, ``Host``, ``default_head``
    (the client's own headers, already CRLF-terminated), ``headers`` in their order, and
    ``Content-Length``. A character UTF-8 cannot carry (a lone surrogate, which registration
    refuses) is left out, as aiohttp's header writer did."""
    lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    head = (
        f"{method} {endpoint.target} HTTP/1.1\r\nHost: {endpoint.authority}\r\n{default_head}"
        f"{lines}Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("utf-8", "ignore") + body
