"""Queue targets: one message on a NATS JetStream subject or a Redis stream, acknowledged.

A publish counts only once the broker has acknowledged it (the JetStream PubAck, the XADD reply),
so "succeeded" means the message is stored, not merely written to a socket. Neither client is
allowed to retry on its own: retries happen in exactly one layer, the scheduler, and a client
that silently re-sent an XADD would put a second message on the stream. JetStream still gets
``Nats-Msg-Id`` = the Idempotency-Key, so a redelivery of one occurrence inside the stream's
duplicate window is dropped by the broker itself.

Connections are made on first use and shared by every delivery; one that breaks is thrown away
and made again on the next delivery, so a broker restart costs a few retryable failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

import hiredis
import nats
import nats.errors
import nats.js.errors
import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from duetime.core import signing
from duetime.core.model import Broker, Outcome, QueueTarget
from duetime.core.runpath import Delivery, Verdict, redis_field
from duetime.core.topics import TopicPolicy
from duetime.workers.tracing import TRACEPARENT

log = logging.getLogger(__name__)

NATS_MSG_ID = "Nats-Msg-Id"

# Redis stream field names: part of the contract, documented in docs/targets.md.
FIELD_PAYLOAD = "payload"
FIELD_IDEMPOTENCY_KEY = "idempotency_key"
FIELD_JOB_ID = "duetime_job_id"
FIELD_SCHEDULED_FOR = "duetime_scheduled_for"
FIELD_ATTEMPT = "duetime_attempt"
FIELD_FENCING_TOKEN = "duetime_fencing_token"
FIELD_EVENT = "duetime_event"  # failure events only
# A run's context (core.runpath.RunContext): its header names in snake case (redis_field), e.g.
# duetime_previous_scheduled_for; the spec version is in every run's entry.
FIELD_SPEC_VERSION = redis_field(signing.SPEC_VERSION)

# Redis answers that say "not now" rather than "never": a failover, a full server, a reload.
_REDIS_TRANSIENT = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,
    redis_errors.OutOfMemoryError,
    redis_errors.TryAgainError,
    redis_errors.ClusterDownError,
)


def message_headers(d: Delivery) -> dict[str, str]:
    """The contract's headers for a queue message (no signature: the broker is the operator's)."""
    key = signing.delivery_key(d.job_id, d.scheduled_for, d.event)
    headers = {
        signing.IDEMPOTENCY_KEY: key,
        signing.JOB_ID: d.job_id,
        signing.SCHEDULED_FOR: signing.format_occurrence(d.scheduled_for),
        signing.ATTEMPT: str(d.attempt),
        signing.FENCING_TOKEN: str(d.fencing_token),
    }
    if d.context is not None:
        headers.update(d.context.headers())
    if d.event is not None:
        headers[signing.EVENT] = d.event
    if d.traceparent is not None:
        headers[TRACEPARENT] = d.traceparent
    return headers


def redis_fields(d: Delivery, body: bytes) -> dict[str, bytes | str]:
    """The stream entry's fields for ``d`` (the contract's, docs/targets.md), in the order
    ``xadd_command`` writes them."""
    fields: dict[str, bytes | str] = {
        FIELD_PAYLOAD: body,
        FIELD_IDEMPOTENCY_KEY: signing.delivery_key(d.job_id, d.scheduled_for, d.event),
        FIELD_JOB_ID: d.job_id,
        FIELD_SCHEDULED_FOR: signing.format_occurrence(d.scheduled_for),
        FIELD_ATTEMPT: str(d.attempt),
        FIELD_FENCING_TOKEN: str(d.fencing_token),
    }
    if d.context is not None:
        fields.update((redis_field(name), value) for name, value in d.context.headers())
    if d.event is not None:
        fields[FIELD_EVENT] = d.event
    if d.traceparent is not None:
        fields[TRACEPARENT] = d.traceparent
    return fields


def xadd_command(key: str, d: Delivery, body: bytes) -> bytes:
    """``XADD key * <fields>`` for ``d``, packed as the bytes Redis reads (RESP), in C (hiredis).

    The same fields as ``redis_fields``, without the dict: a burst packs a few hundred thousand of
    these, and redis-py's own packing (a Python loop per argument) was a tenth of a node's CPU."""
    occurrence = signing.format_occurrence(d.scheduled_for)
    idempotency_key = f"{d.job_id}:{occurrence}"  # signing.delivery_key, formatted once
    args: tuple[str | bytes, ...] = (
        "XADD",
        key,
        "*",
        FIELD_PAYLOAD,
        body,
        FIELD_IDEMPOTENCY_KEY,
        idempotency_key if d.event is None else f"{idempotency_key}:{d.event}",
        FIELD_JOB_ID,
        d.job_id,
        FIELD_SCHEDULED_FOR,
        occurrence,
        FIELD_ATTEMPT,
        str(d.attempt),
        FIELD_FENCING_TOKEN,
        str(d.fencing_token),
    )
    if d.context is not None:
        args = (*args, *_context_fields(d))
    if d.event is not None:
        args = (*args, FIELD_EVENT, d.event)
    if d.traceparent is not None:
        args = (*args, TRACEPARENT, d.traceparent)
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]  # its stub says a 1-tuple
    return packed


def _context_fields(d: Delivery) -> tuple[str, ...]:
    """A run's context as the stream entry's field names and values, one after the other (the
    fields of ``redis_fields``, snake case). Most runs carry the spec version alone."""
    context = d.context
    assert context is not None
    if context.previous_for is None and context.last_success_for is None and context.folded_from is None:
        return (FIELD_SPEC_VERSION, str(context.spec_version))
    return tuple(part for name, value in context.headers() for part in (redis_field(name), value))


def _redis_key(d: Delivery) -> QueueTarget:
    """The Redis stream target of a delivery on the Redis batch path."""
    target = d.target
    if not isinstance(target, QueueTarget) or target.broker is not Broker.REDIS:
        raise ValueError("a delivery on the Redis batch path must have a Redis stream target")
    return target


def _failed(error: str, *, retryable: bool) -> Verdict:
    return Verdict(Outcome.FAILED, retryable, None, error)


PUBLISHED = Verdict(Outcome.SUCCEEDED, False, None, None)


@dataclass(slots=True)
class _Chunk:
    """XADDs asked for together (one worker's batch, or one run's), already packed: they travel in
    one pipeline and are answered together, one reply (entry id or exception) per command, in
    order. One future per chunk, not one per run."""

    commands: list[bytes]
    reply: asyncio.Future[list[Any]]
    deadline: float

    def answer(self, replies: list[Any]) -> None:
        if not self.reply.done():
            self.reply.set_result(replies)

    def fail(self, exc: BaseException) -> None:
        self.answer([exc] * len(self.commands))


class _RedisBatcher:
    """Concurrent XADDs leave as pipelines: every XADD asked for while one pipeline is on the
    wire goes out in the next one, up to ``max_batch`` commands and ``max_inflight`` pipelines.

    At a midnight burst a thousand workers XADD at once. One command per connection would need a
    thousand connections (the client's pool refuses past its limit) and a round trip each; a
    pipeline of hundreds costs one round trip and one connection. Each run still gets its own
    stream entry and its own reply (entry id or error), so outcomes stay per run. The pipeline is
    not a transaction and is never re-sent: a broken connection fails every command in it, each
    as a retryable failure for the scheduler to retry.

    A pipeline is the packed commands written at once on a connection of the client's pool and
    its replies read back in order (redis-py's ``Pipeline`` did the same with a Python object, a
    packing loop and a read timer per command). Each XADD has a deadline ``timeout_s`` after it
    was asked for; a pipeline waits at most until the earliest deadline among its commands (one
    timer per pipeline, not one per run: the client has no socket timeout of its own), and a
    command whose deadline passed before it could be sent fails with ``TimeoutError`` unsent. A
    pipeline cut short closes its connection (redis-py does so on any error inside a read), so no
    late reply can be read as the answer to a later command.
    """

    def __init__(
        self, client: aioredis.Redis, *, timeout_s: float, max_batch: int = 500, max_inflight: int = 4
    ) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._max_batch = max_batch
        self._slots = asyncio.Semaphore(max_inflight)
        self._pending: deque[_Chunk] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def xadd(self, key: str, fields: dict[str, bytes | str]) -> Any:
        """The entry id; raises the command's own error, or ``TimeoutError`` past the deadline."""
        args = ("XADD", key, "*", *(x for kv in fields.items() for x in kv))
        command: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]  # its stub says a 1-tuple
        (reply,) = await self.send([command])
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def xadd_many(self, commands: list[bytes]) -> list[Any]:
        """Many packed XADDs (``xadd_command``) at once: per command its entry id, or the exception
        it failed with (``TimeoutError`` past the deadline), in order."""
        return await self.send(commands)

    async def send(self, commands: list[bytes]) -> list[Any]:
        loop = asyncio.get_running_loop()
        chunk = _Chunk(commands, loop.create_future(), loop.time() + self._timeout_s)
        self._pending.append(chunk)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="duetime-redis-pipeline")
        # A caller cancelled here cancels its chunk: unsent, it is skipped; sent, its replies are
        # dropped (its outcome is the caller's, e.g. the worker's watchdog).
        return await chunk.reply

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        pending = self._pending
        while pending:
            await self._slots.acquire()
            now = loop.time()
            live: list[_Chunk] = []
            size = 0
            # Whole chunks, up to max_batch commands (a larger chunk goes alone).
            while pending and (not live or size + len(pending[0].commands) <= self._max_batch):
                chunk = pending.popleft()
                if chunk.reply.done():  # the caller was cancelled
                    continue
                if chunk.deadline <= now:
                    chunk.fail(TimeoutError())
                    continue
                live.append(chunk)
                size += len(chunk.commands)
            if not live:
                self._slots.release()
                continue
            task = asyncio.create_task(self._send(live), name="duetime-redis-pipeline-send")
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, chunks: list[_Chunk]) -> None:
        pool: Any = self._client.connection_pool  # redis-py leaves get_connection untyped
        conn: Any = None
        try:
            try:
                async with asyncio.timeout_at(min(c.deadline for c in chunks)):
                    conn = await pool.get_connection()
                    await conn.send_packed_command(
                        b"".join(cmd for c in chunks for cmd in c.commands), check_health=False
                    )
                    read = conn.read_response
                    for chunk in chunks:
                        replies: list[Any] = []
                        for _ in chunk.commands:
                            try:
                                replies.append(await read())
                            except redis_errors.ResponseError as exc:  # this command's own error
                                replies.append(exc)
                        chunk.answer(replies)
            except BaseException as exc:
                failure = exc if isinstance(exc, Exception) else redis_errors.ConnectionError()
                for chunk in chunks:
                    chunk.fail(failure)
                if not isinstance(exc, Exception):
                    raise
        finally:
            # No caller may wait forever: whatever this pipeline did not answer fails as a
            # connection error, which is retried.
            for chunk in chunks:
                chunk.fail(redis_errors.ConnectionError("no reply for this command"))
            if conn is not None:
                await pool.release(conn)
            self._slots.release()

    async def close(self) -> None:
        for task in list(self._sending) + ([self._flusher] if self._flusher else []):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


class QueuePublisher:
    """One lazily made connection per configured broker, shared by all deliveries."""

    def __init__(
        self,
        *,
        nats_url: str | None,
        redis_url: str | None,
        timeout_s: float = 10.0,
        topic_policy: TopicPolicy | None = None,
    ) -> None:
        self._topics = topic_policy if topic_policy is not None else TopicPolicy()
        self._nats_url = nats_url
        self._redis_url = redis_url
        self._timeout_s = timeout_s
        self._nats: Any = None  # nats.aio.client.Client: the package ships no type hints
        self._nats_connecting: asyncio.Task[Any] | None = None
        self._redis: aioredis.Redis | None = None
        self._redis_batcher: _RedisBatcher | None = None
        self._closed = False

    def refused(self, d: Delivery, target: QueueTarget) -> Verdict | None:
        """The final failure of a run whose topic may not be published to (now), else None.

        Registration judged the topic, but the operator may have tightened the rules since, and
        a stored job must never reach Duetime's run queue or another owner's stream."""
        reason = self._topics.refusal(target.broker, target.topic, d.owner)
        if reason is None:
            return None
        return _failed(f"topic_not_allowed: {self._topics.message(target.topic, reason)}", retryable=False)

    async def publish(self, d: Delivery, target: QueueTarget, body: bytes) -> Verdict:
        refused = self.refused(d, target)
        if refused is not None:
            return refused
        if target.broker is Broker.NATS:
            return await self._publish_nats(d, target.topic, body)
        return await self._publish_redis(d, target.topic, body)

    # NATS JetStream ------------------------------------------------------------------------

    async def _nats_client(self) -> Any:
        """The shared client; concurrent first callers share one connection attempt."""
        nc = self._nats
        if nc is not None and not nc.is_closed:
            return nc
        if self._nats_connecting is None or self._nats_connecting.done():
            self._nats_connecting = asyncio.create_task(self._connect_nats(), name="duetime-nats-connect")
        task = self._nats_connecting
        try:
            return await asyncio.shield(task)
        finally:
            if task.done() and not task.cancelled() and task.exception() is not None:
                self._nats_connecting = None

    async def _connect_nats(self) -> Any:
        async def on_error(exc: Exception) -> None:
            log.debug("nats target connection: %s", type(exc).__name__)

        # No automatic reconnect: while reconnecting the client would buffer publishes and
        # answer late. A closed client is replaced on the next delivery instead.
        assert self._nats_url is not None
        nc = await nats.connect(
            self._nats_url,
            connect_timeout=max(1, int(self._timeout_s)),
            allow_reconnect=False,
            # The initial connect has its own retry loop: keep it to one quick second try.
            max_reconnect_attempts=1,
            reconnect_time_wait=0,
            error_cb=on_error,
            name="duetime-worker",
        )
        if self._closed:
            await nc.close()
            raise nats.errors.ConnectionClosedError
        self._nats = nc
        return nc

    async def _publish_nats(self, d: Delivery, subject: str, body: bytes) -> Verdict:
        if self._nats_url is None:
            return _failed("broker not configured (set DUETIME_NATS_URL)", retryable=False)
        headers = message_headers(d)
        headers[NATS_MSG_ID] = headers[signing.IDEMPOTENCY_KEY]
        try:
            async with asyncio.timeout(self._timeout_s):
                nc = await self._nats_client()
                js = nc.jetstream(timeout=self._timeout_s)
                await js.publish(subject, body, headers=headers)
        except nats.js.errors.NoStreamResponseError:
            return _failed(f"no JetStream stream captures subject {subject}: create one", retryable=False)
        except nats.js.errors.APIError as exc:
            code = exc.code or 0
            desc = exc.description or "error"
            return _failed(f"JetStream refused the message ({code}: {desc})", retryable=code >= 500)
        except nats.errors.BadSubjectError:
            return _failed(f"invalid NATS subject {subject!r}", retryable=False)
        except nats.errors.MaxPayloadError:
            return _failed("message larger than the NATS server's max_payload", retryable=False)
        except TimeoutError:
            await self._drop_nats_if_broken()
            error = f"NATS did not acknowledge within {self._timeout_s:g}s"
            return Verdict(Outcome.TIMED_OUT, True, None, error)
        except (OSError, nats.errors.Error) as exc:
            await self._drop_nats_if_broken()
            return _failed(f"NATS unavailable ({type(exc).__name__})", retryable=True)
        return Verdict(Outcome.SUCCEEDED, False, None, None)

    async def _drop_nats_if_broken(self) -> None:
        nc = self._nats
        if nc is not None and not nc.is_connected:
            self._nats = None
            with contextlib.suppress(Exception):
                await nc.close()

    # Redis streams -------------------------------------------------------------------------

    def _redis_pipeline(self) -> _RedisBatcher:
        if self._redis_batcher is None:
            self._redis_batcher = _RedisBatcher(self._redis_client(), timeout_s=self._timeout_s)
        return self._redis_batcher

    def _redis_client(self) -> aioredis.Redis:
        if self._redis is None:
            assert self._redis_url is not None
            # The pool connects on first use and replaces broken connections by itself;
            # ``retries=0`` keeps the client from re-sending an XADD behind our back. No socket
            # timeout: the batcher, the client's only user, bounds every pipeline by its commands'
            # deadlines (a read timer per reply was a few µs per run of a burst).
            self._redis = aioredis.Redis.from_url(
                self._redis_url,
                retry=Retry(NoBackoff(), 0),
                socket_connect_timeout=self._timeout_s,
                socket_timeout=None,
                client_name="duetime-worker",
            )
        return self._redis

    async def _publish_redis(self, d: Delivery, key: str, body: bytes) -> Verdict:
        if self._redis_url is None:
            return _failed("broker not configured (set DUETIME_REDIS_URL)", retryable=False)
        try:
            # The batcher enforces the timeout: one timer per pipeline instead of one per run.
            await self._redis_pipeline().xadd(key, redis_fields(d, body))
        except Exception as exc:
            return self._redis_verdict(key, exc)
        return PUBLISHED

    async def publish_redis_many(self, ds: list[Delivery]) -> list[Verdict]:
        """One verdict per delivery to a Redis stream, in order: the batch path of workers for Redis
        targets (one batcher call for many runs, packed once, no coroutine or future per run)."""
        if self._redis_url is None:
            return [_failed("broker not configured (set DUETIME_REDIS_URL)", retryable=False)] * len(ds)
        targets = [_redis_key(d) for d in ds]
        verdicts: list[Verdict | None] = [self.refused(d, t) for d, t in zip(ds, targets, strict=True)]
        sent = [
            xadd_command(t.topic, d, signing.encode_body(d.payload))
            for d, t, v in zip(ds, targets, verdicts, strict=True)
            if v is None
        ]
        replies = iter(await self._redis_pipeline().xadd_many(sent) if sent else [])
        out: list[Verdict] = []
        for target, refused in zip(targets, verdicts, strict=True):
            if refused is not None:
                out.append(refused)
                continue
            reply = next(replies)
            out.append(
                self._redis_verdict(target.topic, reply) if isinstance(reply, BaseException) else PUBLISHED
            )
        return out

    def _redis_verdict(self, key: str, exc: BaseException) -> Verdict:
        if isinstance(exc, TimeoutError):
            return Verdict(Outcome.TIMED_OUT, True, None, f"Redis did not answer within {self._timeout_s:g}s")
        if isinstance(exc, _REDIS_TRANSIENT):
            return _failed(f"Redis unavailable ({type(exc).__name__})", retryable=True)
        if isinstance(exc, redis_errors.ResponseError):
            # e.g. WRONGTYPE: the key exists and is not a stream. Redis's text names no secrets.
            return _failed(f"Redis refused XADD to {key!r}: {str(exc)[:200]}", retryable=False)
        if isinstance(exc, (OSError, redis_errors.RedisError)):
            return _failed(f"Redis unavailable ({type(exc).__name__})", retryable=True)
        raise exc

    # ---------------------------------------------------------------------------------------

    async def close(self) -> None:
        self._closed = True
        task = self._nats_connecting
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if self._nats is not None:
            with contextlib.suppress(Exception):
                await self._nats.close()
            self._nats = None
        if self._redis_batcher is not None:
            await self._redis_batcher.close()
            self._redis_batcher = None
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
