"""The run queue across processes: NATS JetStream between "due" and "running".

One subject per logical shard (``<prefix>.<shard>``), one work-queue stream capturing them all, one
durable pull consumer shared by every worker. Each message is a bundle of the fenced runs of one
shard an engine published together, up to ``wire.BUNDLE_RUNS`` (a lone run in ``runqueue.wire``'s
format 1), with ``Nats-Msg-Id = <job id>:<lease token>`` of its first run (and ``+<runs>`` for a
bundle) so a publish retried after a lost PubAck is dropped by the stream's duplicate window. A
run is in one bundle for its token: a retry publishes the same bundle again.

The queue is never the source of truth; PostgreSQL is. Who may call a run is decided by the row:

* the engine fences (claimed → running) and publishes; until a worker takes the run, the engine
  keeps its lease alive (``PublishedLeaseKeeper``) — for at most ``DUETIME_QUEUE_WAIT_MAX_S``, so a
  message the broker lost is retried by the janitor once its lease lapses;
* a worker *takes* a run before calling it (``take_runs``: the row must still be running under the
  message's token and be held by the engine that published it; the worker becomes the holder).
  A redelivered or duplicated message finds the holder changed and is terminated, never called;
* the worker heartbeats what it took, records the outcome through the batching completer, and
  acks the message only once that write is durable.

So a run is called twice only when its lease lapsed (a worker died or stalled mid-call): the
janitor records ``lease_expired``, the retry gets a higher fencing token, the same Idempotency-Key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from prometheus_client import Counter, Gauge, Histogram

from duetime.core.errors import is_transient
from duetime.core.runpath import AttemptReport, FencedRun, Lease, Leased, Published
from duetime.runqueue import metrics, wire
from duetime.runqueue.databases import each_database
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.ports import RunStore
from duetime.supervisor import STORAGE_RETRIES, SUPERVISOR, error_kind

log = logging.getLogger("duetime.natsqueue")

CONSUMER = "duetime-workers"

PUBLISHED = Counter("duetime_nats_published_total", "Runs published to the run queue (PubAck received)")
PUBLISHED_MESSAGES = Counter(
    "duetime_nats_published_messages_total", "Messages (bundles of runs) published to the run queue"
)
PUBLISH_RETRIES = Counter(
    "duetime_nats_publish_retries_total", "Publishes retried after an error or a missing PubAck"
)
TAKEN = Counter("duetime_nats_taken_total", "Runs a worker took over from the run queue")
DROPPED = Counter(
    "duetime_nats_dropped_total",
    "Messages terminated without a call: stale (lease already taken over or finished) or unreadable",
)
ACKED = Counter("duetime_nats_acked_total", "Messages acked after the outcomes of their runs were recorded")
QUEUE_WAIT_ABANDONED = Counter(
    "duetime_queue_wait_abandoned_total",
    "Published runs no worker took within DUETIME_QUEUE_WAIT_MAX_S; their leases are left to lapse",
)
_STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
PUBLISH_SECONDS = Histogram(
    "duetime_nats_publish_seconds", "Publishing one batch of runs until every PubAck", buckets=_STAGE_BUCKETS
)
TAKE_SECONDS = Histogram(
    "duetime_nats_take_seconds", "One take statement (a fetched batch) in PostgreSQL", buckets=_STAGE_BUCKETS
)
STREAM_PENDING = Gauge(
    "duetime_nats_pending_runs",
    "Runs in the stream not yet delivered to any worker: the consumer's num_pending (messages)"
    " times the runs per message this worker received lately",
)
STREAM_ACK_PENDING = Gauge(
    "duetime_nats_ack_pending_runs",
    "Runs delivered to workers and not yet acked: the consumer's num_ack_pending (messages) times"
    " the runs per message this worker received lately",
)


def stream_name(prefix: str) -> str:
    """``duetime.runs`` → ``DUETIME_RUNS`` (stream names may not contain dots)."""
    return prefix.upper().replace(".", "_")


def subject_for(prefix: str, shard: int) -> str:
    return f"{prefix}.{shard}"


async def connect(url: str, name: str) -> NatsClient:
    """Reconnect forever: a broker restart must cost lateness, not the process."""

    async def on_error(exc: Exception) -> None:
        log.warning("NATS: %s", exc)

    client: list[NatsClient] = []  # the client, once made: a callback must tell a close from a loss

    async def on_disconnect() -> None:
        # nats-py calls this on our own close() too; only a lost connection is worth a warning.
        if client and client[0].is_closed:
            log.info("NATS connection closed")
        else:
            log.warning("NATS connection lost; reconnecting")

    async def on_reconnect() -> None:
        log.info("NATS connection re-established")

    nc: NatsClient = await nats.connect(
        url,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=5,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
    )
    client.append(nc)
    return nc


async def ensure_stream(js: JetStreamContext, prefix: str, *, ack_wait_s: float) -> str:
    """Create the work-queue stream and the shared durable consumer when missing (idempotent:
    every engine and worker calls it at start)."""
    name = stream_name(prefix)
    config = StreamConfig(
        name=name,
        subjects=[f"{prefix}.*"],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        duplicate_window=120.0,
    )
    try:
        await js.stream_info(name)
    except nats.js.errors.NotFoundError:
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError:
            await js.stream_info(name)  # created by another process at the same moment
    consumer = ConsumerConfig(
        durable_name=CONSUMER,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait_s,
        max_deliver=-1,
        max_ack_pending=-1,
        max_waiting=4096,
    )
    try:
        await js.add_consumer(name, consumer)
    except nats.js.errors.BadRequestError as exc:
        # An existing consumer with other settings (e.g. a different ack wait) keeps working.
        log.warning("run consumer %s exists with other settings (%s); using it as it is", CONSUMER, exc)
    return name


# ---------------------------------------------------------------------------------- engine side


class NatsRunPublisher(InProcessRunQueue):
    """The engine's run queue with DUETIME_RUN_QUEUE=nats: the fencer puts fenced runs into a bounded
    local buffer (back-pressure as with the in-process queue); one task takes them off it and
    publishes them in batches, awaiting every PubAck and republishing what was not acknowledged."""

    def __init__(
        self,
        *,
        url: str,
        prefix: str,
        publisher: str,
        ack_wait_s: float,
        maxsize: int = 10_000,
        batch: int = 512,
        pub_ack_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(maxsize)
        self._url = url
        self._prefix = prefix
        self._publisher = publisher
        self._ack_wait_s = ack_wait_s
        self._batch = batch
        self._timeout = pub_ack_timeout_s
        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None
        self._task: asyncio.Task[None] | None = None
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()
        # The batch in flight: reply token → its bundle of runs, until its PubAck arrives
        self._awaiting: dict[str, list[FencedRun]] = {}
        self._refused: list[list[FencedRun]] = []
        self._answered = asyncio.Event()
        self._seq = 0
        self._reply_prefix = ""
        # runs in the stream no worker fetched yet, as last counted plus published since
        self._undelivered = 0
        # runs per message of the last batch: the stream counts messages, the bound runs
        self._per_message = 1.0

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def start(self) -> None:
        self._nc = await connect(self._url, f"duetime-engine {self._publisher}")
        self._js = self._nc.jetstream()
        self._stream = await ensure_stream(self._js, self._prefix, ack_wait_s=self._ack_wait_s)
        self._reply_prefix = self._nc.new_inbox()
        await self._nc.subscribe(
            f"{self._reply_prefix}.*", cb=self._on_puback, pending_msgs_limit=self._batch * 4 + 1024
        )
        self._task = SUPERVISOR.spawn("duetime-nats-publisher", self._publish_loop)

    async def put(self, run: FencedRun) -> None:
        self._idle.clear()
        await super().put(run)

    def backlog(self) -> int:
        """Runs fenced and not yet acknowledged by the broker."""
        return self.qsize() + self._busy

    async def close(self, grace_s: float) -> None:
        """Publish what is buffered (within the grace), then close. Anything left unpublished keeps
        its lease until the heartbeats stop; then the janitor retries it."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout=grace_s)
        left = self.backlog()
        if left:
            log.warning("%d fenced runs were not published before shutdown; their leases will lapse", left)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()

    async def _publish_loop(self) -> None:
        while True:
            batch = [await self.get()]
            while len(batch) < self._batch and (run := self.get_nowait()) is not None:
                batch.append(run)
            self._busy = len(batch)
            try:
                await self._room_for(len(batch))
                with PUBLISH_SECONDS.time():
                    messages = await self._publish(batch)
                self._undelivered += len(batch)
                self._per_message = len(batch) / messages
            finally:
                self._busy = 0
            if not self.qsize():
                self._idle.set()

    async def _room_for(self, n: int) -> None:
        """Wait until the stream's runs that no worker fetched yet leave room for ``n`` more: the
        run queue's bound (DUETIME_RUN_QUEUE_MAX) holds for the stream as for the in-process queue.

        Without it an engine fenced and published a whole burst within seconds of T, and every
        run then waited in the broker with its lease kept by the engine: a row write per run per
        heartbeat (three per run in a two-minute drain), competing with the workers' takes for
        the same rows. Held back here, the runs wait in the local buffer and then, unfenced, in
        the wheel, as they do in one process, and are fenced shortly before a worker takes them.
        The count comes from the consumer's ``num_pending`` (shared by every engine), asked only
        when the estimate since the last answer says the bound may be reached; an unanswered
        question lets the batch through (publishing has its own retries). The stream counts
        messages: they are taken as holding as many runs as this engine's last batch did."""
        assert self._js is not None
        while self._undelivered and self._undelivered + n > self._maxsize:
            try:
                info = await self._js.consumer_info(self._stream, CONSUMER, timeout=2)
            except Exception as exc:  # any failure: publish, do not stall the engine
                log.debug("consumer info failed (%s); publishing without the bound", exc)
                return
            self._undelivered = round((info.num_pending or 0) * self._per_message)
            if not self._undelivered or self._undelivered + n <= self._maxsize:
                return
            await asyncio.sleep(0.05)

    async def _on_puback(self, msg: Msg) -> None:
        """A PubAck (or an error, or the server's "no responders") for one message of the batch in
        flight, matched by the last token of its reply subject. Only an answer without an error
        counts: the stream stored the message (or had it already, a duplicate of a retry)."""
        runs = self._awaiting.pop(msg.subject.rpartition(".")[2], None)
        if runs is None:
            return  # an answer to an earlier attempt that timed out: that bundle was published again
        if (msg.headers and msg.headers.get("Status")) or b'"error"' in msg.data:
            log.debug("publish refused: %r", msg.data[:200])
            self._refused.append(runs)
        if not self._awaiting:
            self._answered.set()

    async def _publish(self, runs: list[FencedRun]) -> int:
        """Publish a batch in bundles (``wire.bundles_of``) and wait for their PubAcks together;
        returns how many messages it took.

        One reply subscription (``<inbox>.<n>``) takes the answers to every message of the engine:
        a message costs one core publish and one small callback, where ``publish_async`` cost a
        semaphore wait and two tasks per message (``wait_for`` on the semaphore and on each PubAck
        future). What was not acknowledged within the PubAck timeout (or was refused) is published
        again, the same bundle under the same ``Nats-Msg-Id``: the stream's duplicate window drops
        a copy it had."""
        assert self._nc is not None
        pause = 0.1
        bundles = wire.bundles_of(runs)
        messages = len(bundles)
        while bundles:
            self._awaiting = {}
            self._refused = []
            self._answered.clear()
            failed: list[list[FencedRun]] = []
            for bundle in bundles:
                self._seq += 1
                token = str(self._seq)
                self._awaiting[token] = bundle
                first = bundle[0]
                msg_id = f"{first.job_id}:{first.lease_token}"
                try:
                    await self._nc.publish(
                        subject_for(self._prefix, first.shard),
                        wire.encode_runs(bundle, self._publisher),
                        reply=f"{self._reply_prefix}.{token}",
                        headers={"Nats-Msg-Id": msg_id if len(bundle) == 1 else f"{msg_id}+{len(bundle)}"},
                    )
                except (nats.errors.Error, OSError) as exc:
                    log.debug("publish failed: %s", exc)
                    del self._awaiting[token]
                    failed.append(bundle)
            if self._awaiting:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._answered.wait(), self._timeout)
            failed += [*self._awaiting.values(), *self._refused]
            self._awaiting = {}
            PUBLISHED.inc(sum(len(b) for b in bundles) - sum(len(b) for b in failed))
            PUBLISHED_MESSAGES.inc(len(bundles) - len(failed))
            if not failed:
                return messages
            PUBLISH_RETRIES.inc(len(failed))
            log.warning("%d of %d publishes were not acknowledged; retrying", len(failed), len(bundles))
            bundles = failed
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)
        return messages


class PublishedLeaseKeeper(LeaseKeeper):
    """The engine's heartbeats with DUETIME_RUN_QUEUE=nats: keeps the lease of each run it published
    until a worker takes it over (the row's holder changes) or it finishes, and for no longer than
    ``max_wait_s``: a message the broker lost must not keep its run's lease alive forever.

    A run waiting in the broker costs a row write each time its lease is extended, so the engine
    fences it with a lease of two leases (``fence_lease_s``), the keeper extends it by two leases
    rather than one, and a beat writes only the leases with less than one lease left. So after every beat
    each held lease has at least ``lease_s`` to run, as when every lease was extended by one lease
    at every beat -- the same margin for failed beats -- while a run waiting in the broker is
    written once per lease and a heartbeat, not once per heartbeat. The longer extension costs
    nothing once a worker takes the run (the take sets the lease to ``lease_s`` from then, so a
    dead worker's run is retried as soon as before); it only lets a run whose message the broker
    lost, or whose engine died before the PubAck, wait one lease longer before the janitor
    retries it. docs/guarantees.md ("Run-queue
    leases") has the reasoning."""

    def __init__(
        self, store: RunStore, *, holder: str, lease_s: float, heartbeat_s: float, max_wait_s: float
    ) -> None:
        super().__init__(store, lease_s=lease_s, heartbeat_s=heartbeat_s)
        self._holder = holder
        self._max_wait = max_wait_s
        self._extend_s = 2 * lease_s
        self.fence_lease_s = self._extend_s
        self._since: dict[uuid.UUID, float] = {}
        # when each held lease runs out at the earliest (monotonic): the fence's lease from when it
        # was tracked (right after the fence), an extension's from the instant before its statement
        self._expires: dict[uuid.UUID, float] = {}

    def track(self, run: Leased) -> None:
        # Only the lease is kept, not the run: once published, the run (and its spec text) is the
        # broker's to hold, and a burst may wait there by the hundred thousand.
        super().track(Lease(run.job_id, run.shard, run.lease_token))
        now = time.monotonic()
        self._since[run.job_id] = now
        self._expires[run.job_id] = now + self._extend_s  # the fence's lease (fence_lease_s)

    def _forget(self, job_id: uuid.UUID, token: int) -> None:
        held = self._held.get(job_id)
        if held is not None and held.lease_token == token:
            del self._held[job_id]
            self._since.pop(job_id, None)
            self._expires.pop(job_id, None)

    async def beat(self, *, every: bool = False) -> None:
        """Extend the held leases that need it (all of them when ``every``); forget those a worker
        took or that finished."""
        now = time.monotonic()
        overdue = [j for j, t in self._since.items() if now - t > self._max_wait]
        for job_id in overdue:
            self._forget(job_id, self._held[job_id].lease_token)
        if overdue:
            QUEUE_WAIT_ABANDONED.inc(len(overdue))
            log.warning("%d published runs waited longer than the queue wait limit", len(overdue))
        due_before = now + self._lease_s
        expires = self._expires
        items = [
            lease for lease in self._held.values() if every or expires.get(lease.job_id, 0.0) < due_before
        ]
        # One failing database holds back only its own leases' extension.
        await each_database(self._store, items, self._extend_part, task="duetime-published-lease-keeper")

    async def _extend_part(self, items: list[Leased]) -> None:
        expires = self._expires
        for i in range(0, len(items), 1000):
            chunk = items[i : i + 1000]
            started = time.monotonic()
            kept = await self._store.extend_published(chunk, holder=self._holder, lease_s=self._extend_s)
            metrics.LEASE_EXTENSIONS.inc(len(kept))
            for lease in chunk:
                if lease.job_id in kept:
                    expires[lease.job_id] = started + self._extend_s
                else:
                    self._forget(lease.job_id, lease.lease_token)

    async def drain(self, within_s: float) -> int:
        """Shutdown: keep beating until workers took everything published (or the time is up);
        returns how many were still waiting. Those keep their leases until they lapse, unless a
        worker takes them first."""
        deadline = time.monotonic() + within_s
        while self._held and time.monotonic() < deadline:
            try:
                await self.beat(every=True)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                log.warning("heartbeat failed while draining published runs (%s)", exc)
            if self._held:
                await asyncio.sleep(0.25)
        return len(self._held)


# ---------------------------------------------------------------------------------- worker side


@dataclass(slots=True, eq=False)
class _Held:
    """A message a worker holds runs of: acked once the last of them is recorded."""

    msg: Msg
    since: float
    left: int  # its runs taken and not yet recorded


class NatsRunConsumer(InProcessRunQueue):
    """A worker's run queue with DUETIME_RUN_QUEUE=nats: fetches in batches, never holding more than
    ``concurrency`` runs (requested, called or being recorded) at once, plus less than a bundle;
    takes each run's lease over in PostgreSQL before handing it to the worker coroutines; acks a
    message once the outcomes of all of its runs are recorded.

    Fetching keeps one pull request outstanding at the server (batch = free slots, expiring after
    a second or two) and hands messages on as they arrive: a client-side ``fetch(n)`` that waits to
    fill its batch would add up to its timeout to every run's lateness when runs trickle in.
    """

    def __init__(
        self,
        store: RunStore,
        keeper: LeaseKeeper,
        *,
        url: str,
        prefix: str,
        holder: str,
        lease_s: float,
        ack_wait_s: float,
        concurrency: int,
        fetch_batch: int = 256,
    ) -> None:
        # Never full: the fetch loop asks for no more than the free slots of ``concurrency``.
        super().__init__(maxsize=concurrency + fetch_batch)
        self._store = store
        self._keeper = keeper
        self._url = url
        self._prefix = prefix
        self.holder = holder
        self._lease_s = lease_s
        self._ack_wait_s = ack_wait_s
        self._concurrency = concurrency
        self._fetch_batch = fetch_batch
        # each run held, by (job id, token), with the message it came in (shared by a bundle's runs)
        self._held: dict[tuple[uuid.UUID, int], _Held] = {}
        self._arrived_runs = 0  # upper bound of the runs in ``_arrived`` (bundles count full)
        self._per_message = 1.0  # runs per message lately received (the depth gauges' estimate)
        self._space = asyncio.Event()
        self._arrived: list[Msg] = []
        self._arrival = asyncio.Event()
        self._requested = 0  # messages the outstanding pull request may still deliver
        self._taking = 0
        self._request_over = asyncio.Event()
        self._acks: list[Msg] = []
        self._ack_event = asyncio.Event()
        self._stopping = asyncio.Event()
        self._nc: NatsClient | None = None
        self._fetcher: asyncio.Task[None] | None = None
        self._side: list[asyncio.Task[None]] = []
        self.on_taken: Callable[[int], None] | None = None

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    def held(self) -> int:
        return len(self._held)

    async def start(self) -> None:
        self._nc = await connect(self._url, f"duetime-worker {self.holder}")
        js = self._nc.jetstream()
        stream = await ensure_stream(js, self._prefix, ack_wait_s=self._ack_wait_s)
        self._js = js
        self._stream = stream
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{CONSUMER}"
        self._inbox = self._nc.new_inbox()
        await self._nc.subscribe(
            self._inbox, cb=self._on_message, pending_msgs_limit=self._concurrency * 4 + 1024
        )
        self._fetcher = SUPERVISOR.spawn("duetime-nats-fetch", self._fetch_loop)
        self._side = [
            SUPERVISOR.spawn("duetime-nats-take", self._take_loop),
            SUPERVISOR.spawn("duetime-nats-ack", self._ack_loop),
            SUPERVISOR.spawn("duetime-nats-progress", self._progress_loop),
            SUPERVISOR.spawn("duetime-nats-depth", self._depth_loop),
        ]

    def recorded(self, reports: list[AttemptReport]) -> None:
        """The completer's callback: these outcomes are durable; a message whose runs all are is done."""
        for rep in reports:
            held = self._held.pop((rep.job_id, rep.lease_token), None)
            if held is not None:
                held.left -= 1
                if held.left == 0:
                    self._acks.append(held.msg)
        self._ack_event.set()
        self._space.set()

    async def stop_fetching(self) -> None:
        """SIGTERM: take nothing more; what was taken is still called and recorded. Messages that
        arrive after this (the last pull request may still deliver) are handed back at once."""
        self._stopping.set()
        self._space.set()
        if self._fetcher is not None:
            await self._fetcher

    async def close(self) -> None:
        """After the workers stopped: send the last acks, then close the connection. A message whose
        run was taken but never recorded is left unacked: its lease lapses, the janitor retries it,
        and its redelivery is dropped as stale."""
        self._stopping.set()
        self._ack_event.set()
        for task in self._side:
            task.cancel()
        for task in self._side:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._send_acks()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.flush(timeout=2)
            with contextlib.suppress(Exception):
                await self._nc.close()

    async def _on_message(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status is not None:
            # 404 no messages, 408 request expired, 409 e.g. consumer deleted: the request is over.
            if status not in ("100",):
                self._requested = 0
                self._request_over.set()
            return
        self._requested = max(self._requested - 1, 0)
        if self._requested == 0:
            self._request_over.set()
        self._arrived.append(msg)
        self._arrived_runs += wire.BUNDLE_RUNS
        self._arrival.set()

    async def _fetch_loop(self) -> None:
        assert self._nc is not None
        expires_s = 1.0
        while not self._stopping.is_set():
            free = self._concurrency - len(self._held) - self._arrived_runs - self._taking
            if free <= 0:
                self._space.clear()
                await self._space.wait()
                continue
            # A message holds up to BUNDLE_RUNS runs: ask for as many as certainly fit, and for one
            # when fewer slots are free (so lone runs still come one by one up to the concurrency).
            batch = min(max(free // wire.BUNDLE_RUNS, 1), self._fetch_batch)
            self._requested = batch
            self._request_over.clear()
            request = json.dumps({"batch": batch, "expires": int(expires_s * 1e9)}).encode()
            try:
                await self._nc.publish(self._next_subject, request, reply=self._inbox)
            except (nats.errors.Error, OSError) as exc:
                log.warning("asking NATS for runs failed (%s); retrying", exc)
                self._requested = 0
                await asyncio.sleep(0.5)
                continue
            # Over when fully delivered or the server says so; a request lost with the connection
            # gets no answer, so its expiry (plus a margin) ends it too.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._request_over.wait(), timeout=expires_s + 1.0)
            self._requested = 0

    async def _take_loop(self) -> None:
        while True:
            if not self._arrived:
                self._arrival.clear()
                await self._arrival.wait()
                continue
            msgs, self._arrived = self._arrived, []
            self._arrived_runs = 0
            if self._stopping.is_set():
                for msg in msgs:  # offered to another worker at once, not after the ack wait
                    with contextlib.suppress(Exception):
                        await msg.nak()
                continue
            self._taking = len(msgs) * wire.BUNDLE_RUNS
            try:
                await self._take(msgs)
            finally:
                self._taking = 0
            self._space.set()

    async def _take(self, msgs: list[Msg]) -> None:
        published: list[Published] = []
        theirs: list[tuple[Msg, list[Published]]] = []
        seen: set[tuple[uuid.UUID, int]] = set()
        for msg in msgs:
            try:
                decoded = wire.decode_runs(msg.data)
            except ValueError as exc:
                log.error("dropping a message on %s: %s", msg.subject, exc)
                await self._term(msg)
                continue
            if decoded.unreadable:
                log.error("%d unreadable runs in a message on %s: dropped", decoded.unreadable, msg.subject)
            mine: list[Published] = []
            for message in decoded.runs:
                key = (message.job_id, message.lease_token)
                if key in seen or key in self._held:
                    continue  # a duplicate of a run already taken: never called twice
                seen.add(key)
                mine.append(message)
            if not mine:
                await self._term(msg)
                continue
            published += mine
            theirs.append((msg, mine))
        if theirs:
            self._per_message = 0.8 * self._per_message + 0.2 * (len(published) / len(theirs))
        if not published:
            return
        try:
            with TAKE_SECONDS.time():
                taken = await self._store.take_runs(published, holder=self.holder, lease_s=self._lease_s)
        except Exception as exc:
            if not is_transient(exc):
                raise
            STORAGE_RETRIES.labels("duetime-nats-take", error_kind(exc)).inc()
            log.warning("taking %d runs failed (%s); handing them back", len(published), exc)
            for msg, _ in theirs:
                with contextlib.suppress(Exception):
                    await msg.nak(delay=1.0)
            await asyncio.sleep(0.5)
            return
        now = time.monotonic()
        for msg, mine in theirs:
            runs = [m.run for m in mine if Lease(m.job_id, m.shard, m.lease_token) in taken]
            if not runs:
                await self._term(msg)  # stale: taken by another worker, or over
                continue
            held = _Held(msg, now, len(runs))
            for run in runs:
                self._keeper.track(run)
                self._held[(run.job_id, run.lease_token)] = held
                self.put_nowait(run)
        TAKEN.inc(len(taken))
        if self.on_taken is not None:
            self.on_taken(len(taken))

    async def _term(self, msg: Msg) -> None:
        DROPPED.inc()
        with contextlib.suppress(Exception):
            await msg.term()

    async def _send_acks(self) -> None:
        acks, self._acks = self._acks, []
        for msg in acks:
            try:
                await msg.ack()
            except nats.errors.MsgAlreadyAckdError:
                pass
            except Exception as exc:  # lost with the connection: redelivered later, dropped as stale
                log.debug("ack failed: %s", exc)
        ACKED.inc(len(acks))

    async def _ack_loop(self) -> None:
        while True:
            self._ack_event.clear()
            await self._ack_event.wait()
            await self._send_acks()

    async def _progress_loop(self) -> None:
        """Calls that run long are marked in progress, so NATS does not offer them to another
        worker while they are still ours (that worker would only drop them, but why make it look)."""
        every = max(self._ack_wait_s / 3, 0.2)
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for held in set(self._held.values()):  # a bundle's runs share one
                if now - held.since > every:
                    held.since = now
                    with contextlib.suppress(Exception):
                        await held.msg.in_progress()

    async def _depth_loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                info = await self._js.consumer_info(self._stream, CONSUMER, timeout=2)
                STREAM_PENDING.set(round((info.num_pending or 0) * self._per_message))
                STREAM_ACK_PENDING.set(round((info.num_ack_pending or 0) * self._per_message))
            await asyncio.sleep(5.0)
