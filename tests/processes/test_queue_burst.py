"""Queue targets under a burst: many concurrent publishes from one worker process.

Regression: every XADD took its own connection from redis-py's pool, which refuses a 101st
concurrent connection (``MaxConnectionsError``); with the default 1024 workers and 256 calls per
host, most runs of a burst to a Redis stream failed. XADDs now leave as pipelines.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import uuid
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis

from duetime.core import ssrf
from duetime.core.model import Broker, JobSpec, OneOffSchedule, Outcome, QueueTarget, WebhookTarget
from duetime.core.runpath import AttemptReport, Delivery, FencedRun, RunSpec, Verdict
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.workers.dispatch import BatchResult, Dispatcher
from duetime.workers.pool import WorkerPool
from duetime.workers.queues import PUBLISHED

pytestmark = pytest.mark.redis

REDIS_URL = os.environ.get("DUETIME_TEST_REDIS", "redis://127.0.0.1:6379/0")
SCHEDULED_FOR = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)


def _delivery(target: QueueTarget, n: int) -> Delivery:
    return Delivery(
        job_id=str(uuid.uuid4()),
        scheduled_for=SCHEDULED_FOR,
        attempt=1,
        fencing_token=n,
        owner="burst",
        signing_secret="whsec_" + "A" * 32,
        payload={"n": n},
        target=target,
    )


async def test_redis_burst_of_concurrent_xadds_each_get_their_own_entry() -> None:
    key = f"duetime-test-burst-{secrets.token_hex(6)}"
    target = QueueTarget(broker=Broker.REDIS, topic=key)
    dispatcher = Dispatcher(
        policy=ssrf.AddressPolicy(),
        nats_url=None,
        redis_url=REDIS_URL,
        host_concurrency=1000,
        total_concurrency=1000,
    )
    await dispatcher.start()
    client = aioredis.Redis.from_url(REDIS_URL)
    deliveries = [_delivery(target, n) for n in range(600)]
    try:
        results = await asyncio.gather(*(dispatcher.deliver(d) for d in deliveries))
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(key)  # type: ignore[assignment]
    finally:
        await dispatcher.close()
        await client.delete(key)
        await client.aclose()
    errors = {r.error for r in results if r.outcome is not Outcome.SUCCEEDED}
    assert errors == set()
    assert len(entries) == 600
    assert len({e[0] for e in entries}) == 600
    assert {f[b"duetime_job_id"].decode() for _, f in entries} == {d.job_id for d in deliveries}
    assert {f[b"duetime_fencing_token"] for _, f in entries} == {str(n).encode() for n in range(600)}


async def test_redis_burst_errors_stay_per_run() -> None:
    """One run's refusal (WRONGTYPE) fails that run only, not the pipeline it travelled in."""
    good = f"duetime-test-burst-{secrets.token_hex(6)}"
    bad = f"duetime-test-burst-{secrets.token_hex(6)}"
    client = aioredis.Redis.from_url(REDIS_URL)
    await client.set(bad, "not a stream")
    dispatcher = Dispatcher(policy=ssrf.AddressPolicy(), nats_url=None, redis_url=REDIS_URL)
    await dispatcher.start()
    try:
        targets = [QueueTarget(broker=Broker.REDIS, topic=bad if n % 10 == 0 else good) for n in range(200)]
        results = await asyncio.gather(*(dispatcher.deliver(_delivery(t, n)) for n, t in enumerate(targets)))
        length = await client.xlen(good)
    finally:
        await dispatcher.close()
        await client.delete(good, bad)
        await client.aclose()
    failed = [n for n, r in enumerate(results) if r.outcome is Outcome.FAILED]
    assert failed == list(range(0, 200, 10))
    assert all(not results[n].retryable and "WRONGTYPE" in (results[n].error or "") for n in failed)
    assert length == 180


async def test_redis_that_never_answers_times_out_every_run_of_the_pipeline() -> None:
    """A server that accepts and then says nothing: every XADD of the burst is timed out (and
    retryable) after the broker timeout, none waits for a second one behind a stuck pipeline."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    dispatcher = Dispatcher(
        policy=ssrf.AddressPolicy(),
        nats_url=None,
        redis_url=f"redis://127.0.0.1:{port}/0",
        broker_timeout_s=1.0,
        host_concurrency=1000,
    )
    await dispatcher.start()
    target = QueueTarget(broker=Broker.REDIS, topic="duetime-silent")
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        results = await asyncio.gather(*(dispatcher.deliver(_delivery(target, n)) for n in range(3000)))
        elapsed = loop.time() - started
    finally:
        await dispatcher.close()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
    assert {(r.outcome, r.retryable) for r in results} == {(Outcome.TIMED_OUT, True)}
    assert elapsed < 5.0  # 1 s each, all at once: not 3000 / (500 x 4) rounds of 1 s


def _fenced(target: QueueTarget | WebhookTarget, n: int, owner: str = "burst") -> FencedRun:
    spec = JobSpec(target=target, schedule=OneOffSchedule(SCHEDULED_FOR), payload={"n": n})
    return FencedRun(
        job_id=uuid.uuid4(),
        shard=0,
        owner=owner,
        lease_token=n,
        scheduled_for=SCHEDULED_FOR,
        due_at=SCHEDULED_FOR,
        attempt=1,
        spec=RunSpec.of(spec),
        run_kind="scheduled",
    )


async def test_workers_send_a_redis_burst_in_batches_one_entry_and_one_report_per_run() -> None:
    """The workers' batch path for Redis targets: runs queued behind one another leave together,
    each still its own stream entry with its own outcome; a webhook run in between stays on the
    ordinary path, and a refused key fails only its own runs."""
    good = f"duetime-test-burst-{secrets.token_hex(6)}"
    bad = f"duetime-test-burst-{secrets.token_hex(6)}"
    client = aioredis.Redis.from_url(REDIS_URL)
    await client.set(bad, "not a stream")
    queue = InProcessRunQueue()
    runs = [
        _fenced(QueueTarget(broker=Broker.REDIS, topic=bad if n % 50 == 0 else good), n, f"o{n % 3}")
        for n in range(1, 1201)
    ]
    webhook = _fenced(WebhookTarget(url="https://example.com/hook"), 0)
    for run in [*runs[:600], webhook, *runs[600:]]:
        queue.put_nowait(run)
    dispatcher = Dispatcher(policy=ssrf.AddressPolicy(), nats_url=None, redis_url=REDIS_URL)
    await dispatcher.start()
    pool = WorkerPool(None, queue, dispatcher, None, concurrency=8)  # type: ignore[arg-type]
    reports: list[AttemptReport] = []
    calls: list[FencedRun] = []
    all_in = asyncio.Event()

    async def call(run: FencedRun) -> AttemptReport:  # the webhook's own call is not the point
        calls.append(run)
        now = datetime.now(UTC)
        return AttemptReport(run, Verdict(Outcome.SUCCEEDED, False), started_at=now, finished_at=now)

    def add(report: AttemptReport) -> None:
        reports.append(report)
        if len(reports) == len(runs) + 1:
            all_in.set()

    pool.call = call  # type: ignore[method-assign]
    pool.completer.add = add  # type: ignore[method-assign]
    workers = [asyncio.create_task(pool._take_loop()), asyncio.create_task(pool._pump_loop())]
    try:
        await asyncio.wait_for(all_in.wait(), timeout=60)
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(good)  # type: ignore[assignment]
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await dispatcher.close()
        await client.delete(good, bad)
        await client.aclose()
    assert calls == [webhook]
    by_token = {r.lease_token: r for r in reports if r.job_id != webhook.job_id}
    assert sorted(by_token) == list(range(1, 1201))
    failed = sorted(t for t, r in by_token.items() if r.outcome is Outcome.FAILED)
    assert failed == list(range(50, 1201, 50))
    assert all("WRONGTYPE" in (by_token[t].error or "") and not by_token[t].retryable for t in failed)
    assert len(entries) == 1200 - len(failed)
    assert sorted(int(f[b"duetime_fencing_token"]) for _, f in entries) == [
        t for t in range(1, 1201) if t % 50
    ]


class _HeldDispatcher(Dispatcher):
    """Holds every batch until released: how many runs the workers took is then visible."""

    def __init__(self, workers: int, queue: InProcessRunQueue) -> None:
        super().__init__(policy=ssrf.AddressPolicy(), nats_url=None, redis_url=REDIS_URL)
        self.queue = queue
        self.sizes: list[int] = []
        self.release = asyncio.Event()
        self.all_busy = asyncio.Event()
        self._workers = workers

    async def deliver_redis_many(self, ds: list[Delivery]) -> BatchResult:
        self.sizes.append(len(ds))
        if sum(self.sizes) >= self._workers or not self.queue.qsize():
            self.all_busy.set()  # the pool's bound is in flight, or they took everything
        await self.release.wait()
        now = datetime.now(UTC)
        return BatchResult(now, now, [PUBLISHED] * len(ds))


async def test_batched_workers_keep_runs_in_flight_within_the_pool_concurrency() -> None:
    """Regression: each worker took up to a pipeline's worth (500) off the run queue, so ten
    workers held 5,000 fenced runs where ten calls were meant; a node's memory and held leases
    grew with the fencer's rate instead of being bounded by the queue and the workers."""
    queue = InProcessRunQueue()
    for n in range(1, 2001):
        queue.put_nowait(_fenced(QueueTarget(broker=Broker.REDIS, topic="held"), n))
    dispatcher = _HeldDispatcher(workers=10, queue=queue)
    pool = WorkerPool(None, queue, dispatcher, None, concurrency=10)  # type: ignore[arg-type]
    pool.completer.add = lambda report: None  # type: ignore[method-assign]
    workers = [asyncio.create_task(pool._take_loop()), asyncio.create_task(pool._pump_loop())]
    try:
        await asyncio.wait_for(dispatcher.all_busy.wait(), timeout=30)
        taken = sum(dispatcher.sizes)
    finally:
        dispatcher.release.set()
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    assert taken <= 2 * 10  # the concurrency, plus the one run each worker already holds


async def test_the_batch_path_writes_the_contract_fields_of_each_run() -> None:
    """The batch path packs each XADD itself (``xadd_command``): the entries carry exactly the
    fields of ``redis_fields``, the contract's (docs/targets.md), a run's context, traceparent and
    a failure event's type included when set."""
    from dataclasses import replace
    from datetime import UTC, datetime

    from duetime.core import signing
    from duetime.core.runpath import RunContext
    from duetime.workers.queues import QueuePublisher, redis_fields

    key = f"duetime-test-burst-{secrets.token_hex(6)}"
    target = QueueTarget(broker=Broker.REDIS, topic=key)
    ds = [_delivery(target, n) for n in range(6)]
    ds[1] = replace(ds[1], traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    ds[2] = replace(ds[2], payload={"text": "é ✓", "big": 2**70})
    ds[3] = replace(ds[3], event="job.failing", traceparent=ds[1].traceparent)  # a failure event
    ds[4] = replace(ds[4], context=RunContext(7))
    t = datetime(2026, 12, 1, 3, tzinfo=UTC)
    ds[5] = replace(ds[5], context=RunContext(2, t, t.replace(hour=1), 3, t.replace(hour=0, microsecond=5)))
    publisher = QueuePublisher(nats_url=None, redis_url=REDIS_URL)
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        verdicts = await publisher.publish_redis_many(ds)
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(key)  # type: ignore[assignment]
    finally:
        await publisher.close()
        await client.delete(key)
        await client.aclose()
    assert verdicts == [PUBLISHED] * 6
    got = [{k.decode(): v for k, v in fields.items()} for _, fields in entries]
    want = [
        {
            k: v if isinstance(v, bytes) else v.encode()
            for k, v in redis_fields(d, signing.encode_body(d.payload)).items()
        }
        for d in ds
    ]
    assert got == want
    assert "traceparent" in got[1] and "traceparent" not in got[0]
    assert got[3]["duetime_event"] == b"job.failing"
    assert got[3]["idempotency_key"].endswith(b":job.failing")
    assert got[4]["duetime_spec_version"] == b"7" and "duetime_previous_scheduled_for" not in got[4]
    context = {
        "spec_version",
        "previous_scheduled_for",
        "last_success_scheduled_for",
        "folded_count",
        "folded_from",
    }
    assert {k: v for k, v in got[5].items() if k.removeprefix("duetime_") in context} == {
        "duetime_spec_version": b"2",
        "duetime_previous_scheduled_for": b"2026-12-01T03:00:00Z",
        "duetime_last_success_scheduled_for": b"2026-12-01T01:00:00Z",
        "duetime_folded_count": b"3",
        "duetime_folded_from": b"2026-12-01T00:00:00.000005Z",
    }


class _HoldingProxy:
    """A TCP proxy to the real Redis that can hold back Redis's replies while ``hold`` is set (a
    server that stalls after it executed the commands) and send them late, just before the
    replies that come after them on the same connection."""

    def __init__(self) -> None:
        self.hold = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        host, _, port = REDIS_URL.removeprefix("redis://").partition("/")[0].partition(":")
        redis_r, redis_w = await asyncio.open_connection(host, int(port or 6379))
        self._writers += [client_w, redis_w]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, held: bool) -> None:
            late = b""
            while data := await src.read(65536):
                if held and self.hold:
                    late += data  # held back: sent late, ahead of this connection's next replies
                    continue
                dst.write(late + data)
                late = b""
                await dst.drain()

        for t in (pump(client_r, redis_w, False), pump(redis_r, client_w, True)):
            task = asyncio.create_task(t)
            self._tasks.add(task)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self._writers:
            w.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def test_a_pipeline_cut_short_never_lends_its_late_replies_to_the_next_one() -> None:
    """A pipeline whose replies did not come in time is timed out, and its connection is not used
    again: otherwise the next pipeline would read the stalled one's replies (here: WRONGTYPE
    errors) as its own answers, and runs that were stored would be recorded failed (or the other
    way round)."""
    bad = f"duetime-test-burst-{secrets.token_hex(6)}"
    good = f"duetime-test-burst-{secrets.token_hex(6)}"
    client = aioredis.Redis.from_url(REDIS_URL)
    await client.set(bad, "not a stream")
    proxy = _HoldingProxy()
    await proxy.start()
    dispatcher = Dispatcher(
        policy=ssrf.AddressPolicy(),
        nats_url=None,
        redis_url=f"redis://127.0.0.1:{proxy.port}/0",
        broker_timeout_s=1.0,
    )
    await dispatcher.start()
    try:
        # a connection made (its handshake answered) before Redis stalls
        warm = await dispatcher.deliver_redis_many(
            [_delivery(QueueTarget(broker=Broker.REDIS, topic=good), 9)]
        )
        assert warm.verdicts == [PUBLISHED]
        proxy.hold = True
        stalled = await dispatcher.deliver_redis_many(
            [_delivery(QueueTarget(broker=Broker.REDIS, topic=bad), n) for n in range(5)]
        )
        proxy.hold = False
        after = await dispatcher.deliver_redis_many(
            [_delivery(QueueTarget(broker=Broker.REDIS, topic=good), n) for n in range(5)]
        )
        length = await client.xlen(good)
    finally:
        await dispatcher.close()
        await proxy.close()
        await client.delete(good, bad)
        await client.aclose()
    assert {(v.outcome, v.retryable) for v in stalled.verdicts} == {(Outcome.TIMED_OUT, True)}
    assert after.verdicts == [PUBLISHED] * 5
    assert length == 6
