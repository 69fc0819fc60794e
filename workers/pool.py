"""Workers: take fenced runs off the run queue, call their targets, record the outcomes.

Outcomes are written by one completer in batches (one transaction per database per batch, the
history in the same transaction). A run stays tracked by the lease keeper until its outcome is
durable, so a database hiccup during completion costs a retry of the write, never the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import cast

from duetime.core.errors import StorageUnavailable, is_transient
from duetime.core.model import Broker, Outcome, TargetState, WebhookTarget
from duetime.core.runpath import AttemptReport, CallResult, Delivery, FencedRun, Verdict
from duetime.core.signing import idempotency_key
from duetime.core.targethealth import HealthPolicy, Signal, signal_of
from duetime.runqueue import metrics
from duetime.runqueue.databases import by_database
from duetime.runqueue.inprocess import RunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.dbclock import DB_CLOCK
from duetime.storage.ports import EventOutbox, FlowAsk, FlowControl, RunStore, SigningKeys, TargetHealth
from duetime.supervisor import STORAGE_RETRIES, SUPERVISOR, Backoff, error_kind
from duetime.workers import tracing
from duetime.workers.dispatch import Dispatcher
from duetime.workers.hostqueues import FlowKey, HostQueues, Start, default_burst
from duetime.workers.targets import CallTracker
from duetime.workers.webhook import Started

log = logging.getLogger("duetime.workers")

WATCHDOG_S = 300
FLOW_HOLD_S = 10.0  # a worker's flow slots lapse this long after its last ask (it died)
FLOW_TICK_S = 0.1  # asks for flow grants at most this far apart while runs wait for them
FLOW_MIN_GAP_S = 0.02
REPORT_BATCH = 2000
RETURN_BATCH = 1000  # runs given back unused at shutdown, per statement
WATCHDOG_TICK_S = 1.0  # how often calls started without a task are checked against the watchdog
_REDIS_HOST = f"broker:{Broker.REDIS.value}"
_BAD_URL_HOST = "invalid-url:0"


class SecretCache:
    """Owners' signing secrets, read once a minute at most: a burst must not query per run.

    What is cached is the owner's keys with the end of the previous secret's grace, not the list
    of secrets to sign with: the grace is checked against the clock at every call, so a call made
    after it ended never carries the old secret's signature, whatever the cache's age. A rotation
    reaches a worker within ``ttl_s``; the grace should be longer than that.

    The secrets live in the home database. While it cannot be read, a cached entry is used for up
    to ``stale_s`` past its ``ttl_s`` (an hour by default): the home primary's outage then holds
    back no call of an owner whose secret this worker has read in the last hour, and a rotation
    made just before the outage reaches the worker once the database is back. Past that, a call
    is not signed with a secret that may have been revoked: it waits for the database.
    """

    def __init__(self, store: RunStore | EventOutbox, ttl_s: float = 60.0, stale_s: float = 3600.0) -> None:
        self._store = store
        self._ttl = ttl_s
        self._stale = stale_s
        # owner -> (fresh until, read at, keys): monotonic seconds
        self._cache: dict[str, tuple[float, float, SigningKeys]] = {}
        # One read per owner in flight: at a burst's first second (and at every expiry) a
        # thousand workers miss together, and they share one query instead of queueing a
        # thousand behind the pool.
        self._loading: dict[str, asyncio.Future[SigningKeys]] = {}

    async def get(self, owner: str) -> tuple[str, ...]:
        """The secrets that sign a call made now: the current one first."""
        return (await self._keys(owner)).valid_at(datetime.now(UTC))

    def cached(self, owner: str, now: datetime) -> tuple[str, ...] | None:
        """``get`` without waiting, from a fresh entry only: None when the secrets must be read
        (the caller then takes the path that can wait for the database)."""
        hit = self._cache.get(owner)
        if hit is None or hit[0] <= time.monotonic():
            return None
        return hit[2].valid_at(now)

    async def _keys(self, owner: str) -> SigningKeys:
        hit = self._cache.get(owner)
        if hit is not None and hit[0] > time.monotonic():
            return hit[2]
        loading = self._loading.get(owner)
        if loading is None:
            loading = self._loading[owner] = asyncio.ensure_future(self._load(owner))
            loading.add_done_callback(lambda f: self._loaded(owner, f))
        return await asyncio.shield(loading)

    def _loaded(self, owner: str, fut: asyncio.Future[SigningKeys]) -> None:
        if self._loading.get(owner) is fut:
            del self._loading[owner]
        if not fut.cancelled():
            fut.exception()  # retrieved here too, in case every waiter was cancelled

    async def _load(self, owner: str) -> SigningKeys:
        try:
            keys = await self._store.signing_keys(owner)
        except Exception as exc:
            hit = self._cache.get(owner)
            now = time.monotonic()
            if hit is not None and is_transient(exc) and hit[1] + self._ttl + self._stale > now:
                # Used again for a few seconds before the next try: calls must not each wait for
                # a database that is away.
                self._cache[owner] = (now + min(5.0, self._ttl), hit[1], hit[2])
                log.warning("signing secrets unreadable (%s); using the cached ones for %s", exc, owner)
                return hit[2]
            raise
        if keys is None:
            raise LookupError(f"owner {owner!r} has no signing secret")
        now = time.monotonic()
        self._cache[owner] = (now + self._ttl, now, keys)
        return keys


class Completer:
    """Buffers attempt reports and writes them in batches of up to ``batch`` every few ms.

    ``writers`` batches are written at once (one transaction each; their rows are locked in job id
    order, so two writers cannot deadlock), which keeps the database busy while this process
    builds the next batch. Workers wait in ``room()`` while ``max_pending`` reports are buffered:
    a target that takes runs faster than their outcomes are recorded must not pile up outcomes
    (memory, and leases whose heartbeats grow with them) without bound.
    """

    def __init__(
        self,
        store: RunStore,
        keeper: LeaseKeeper,
        *,
        batch: int = 500,
        linger_s: float = 0.005,
        writers: int = 2,
        max_pending: int = 5000,
        on_recorded: Callable[[list[AttemptReport]], None] | None = None,
    ) -> None:
        self._store = store
        self._keeper = keeper
        # Told once a batch is durable (applied or found stale): a broker message is acked only then.
        self._on_recorded = on_recorded
        self._batch = batch
        self._linger = linger_s
        self._writers = writers
        self._max_pending = max_pending
        self._buffer: deque[AttemptReport] = deque()
        self._event = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._backoff = Backoff(0.1, 5.0)

    def add(self, report: AttemptReport) -> None:
        self._buffer.append(report)
        if len(self._buffer) >= self._max_pending:
            self._room.clear()
        if len(self._buffer) >= self._batch or len(self._buffer) == 1:
            self._event.set()

    async def room(self) -> None:
        """Return once fewer than ``max_pending`` reports wait to be written."""
        if not self._room.is_set():
            await self._room.wait()

    def has_room(self) -> bool:
        return self._room.is_set()

    def pending(self) -> int:
        return len(self._buffer)

    def start(self) -> None:
        self._tasks = [SUPERVISOR.spawn(f"duetime-completer-{i}", self._run) for i in range(self._writers)]

    async def stop(self) -> None:
        self._stopping = True
        self._event.set()
        for task in self._tasks:
            await task

    def _take(self) -> list[AttemptReport]:
        buffer = self._buffer
        batch = [buffer.popleft() for _ in range(min(self._batch, len(buffer)))]
        if len(buffer) < self._max_pending:
            self._room.set()
        return batch

    def _put_back(self, reports: list[AttemptReport]) -> None:
        """Reports not written go back to the front, in order: nothing is dropped on an error."""
        self._buffer.extendleft(reversed(reports))
        if len(self._buffer) >= self._max_pending:
            self._room.clear()

    async def _run(self) -> None:
        """One writer. Restartable: a batch it holds goes back to the buffer on any error, so the
        supervisor can start it again without losing an outcome."""
        while True:
            if not self._buffer:
                if self._stopping:
                    self._event.set()  # the other writers see the stop too
                    return
                self._event.clear()
                await self._event.wait()
                continue
            if len(self._buffer) < self._batch and not self._stopping:
                await asyncio.sleep(self._linger)
                if not self._buffer:
                    continue  # another writer took them
            batch = self._take()
            if self._buffer:
                self._event.set()  # more for the other writers
            self._keeper.settling([r.job_id for r in batch])
            try:
                retry = await self._write(batch)
            except BaseException:
                self._put_back(batch)  # a bug or a cancel: the supervisor restarts us, nothing lost
                raise
            if retry:
                # The database of these was away or gave way: written again after a pause that
                # grows while it stays so (the other databases' reports are recorded meanwhile).
                self._put_back(retry)
                await asyncio.sleep(self._backoff.next())
            else:
                self._backoff.reset()
            del batch  # recorded: not kept alive while this writer waits for the next batch

    async def _write(self, batch: list[AttemptReport]) -> list[AttemptReport]:
        """Write ``batch`` one database at a time, side by side: one primary's trouble holds back
        only its own reports. Returns the reports to write again (their database failed for a
        reason that is not theirs)."""
        parts = by_database(self._store, batch)
        if len(parts) == 1:
            # The usual case, awaited directly: the batch is recorded and let go in one step (no
            # loop turn between a gather's end and this writer's, holding it alive meanwhile).
            return await self._write_part(batch)
        results = await asyncio.gather(*(self._write_part(part) for part in parts.values()))
        return [report for again in results for report in again]

    async def _write_part(self, part: list[AttemptReport]) -> list[AttemptReport]:
        try:
            stats = await asyncio.shield(self._store.complete_runs(part))
        except Exception as exc:
            if is_transient(exc):
                STORAGE_RETRIES.labels("duetime-completer", error_kind(exc)).inc()
                log.warning(
                    "recording %d outcomes failed (%s: %s); retrying", len(part), type(exc).__name__, exc
                )
                return part
            return await self._isolate(part, exc)
        metrics.COMPLETIONS.inc(stats.applied)
        if stats.stale:
            metrics.STALE_COMPLETIONS.inc(stats.stale)
        self._recorded(part)
        return []

    async def _isolate(self, part: list[AttemptReport], exc: Exception) -> list[AttemptReport]:
        """An error that is not the database's trouble is one report's own (a value the database
        refuses): halve the part until the report is alone, so the others are recorded. The lone
        report is given up here: its lease is let go, so it lapses and the janitor records the run
        as ``lease_expired`` and retries it by its policy, instead of it blocking every batch."""
        if len(part) > 1:
            half = len(part) // 2
            return await self._write_part(part[:half]) + await self._write_part(part[half:])
        report = part[0]
        metrics.UNWRITABLE_COMPLETIONS.inc()
        log.error(
            "the outcome of job %s (occurrence %s, attempt %d) cannot be recorded (%s: %s); its lease "
            "is left to lapse, and the janitor records it as lease_expired",
            report.job_id,
            report.scheduled_for.isoformat(),
            report.attempt,
            type(exc).__name__,
            exc,
        )
        self._recorded(part)
        return []

    def _recorded(self, batch: list[AttemptReport]) -> None:
        for report in batch:
            self._keeper.untrack(report.job_id, report.lease_token)
        if self._on_recorded is not None:
            self._on_recorded(batch)


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """What a worker pool takes besides its run path: who it is to the cluster (its flow slots
    and target reports are kept under ``worker_id``), how many runs may wait in its host queues,
    its hosts' health policy (None: the defaults, at the dispatcher's per-host concurrency), and
    where flow grants come from and target reports go (None: flow keys are not enforced, nothing
    is reported; a store without a database, in tests)."""

    worker_id: str = "worker"
    max_waiting: int = 20_000
    health: HealthPolicy | None = None
    flows: FlowControl | None = None
    reports: TargetHealth | None = None
    report_every_s: float = 5.0


class WorkerPool:
    """Takes fenced runs off the run queue into a queue per host (workers/hostqueues.py), starts
    each call when its host, its flow key and the worker's share have room, and hands outcomes
    to the completer.

    Three loops and a task per call: the taker moves runs from the run queue into the host
    queues while fewer than ``max_waiting`` wait there (a run waiting for its host holds no call
    slot, so the taker keeps taking while any host has room); the pump starts what may start,
    woken by new runs, ended calls, grants and timers; the flow loop asks the cluster for flow
    keys' grants (workers/pool.py, its flow loop). A fourth reports what this worker sees of target hosts.
    """

    def __init__(
        self,
        store: RunStore,
        queue: RunQueue,
        dispatcher: Dispatcher,
        keeper: LeaseKeeper,
        *,
        concurrency: int = 1024,
        watchdog_s: float = WATCHDOG_S,
        on_recorded: Callable[[list[AttemptReport]], None] | None = None,
        secret_wait_s: float = 300.0,
        options: WorkerOptions | None = None,
    ) -> None:
        o = options or WorkerOptions()
        self._store = store
        self._queue = queue
        self._dispatcher = dispatcher
        self._secret_wait_s = secret_wait_s
        self._keeper = keeper
        self._concurrency = concurrency
        self._watchdog_s = watchdog_s
        self._secrets = SecretCache(store)
        self.completer = Completer(store, keeper, on_recorded=on_recorded)
        self.worker_id = o.worker_id
        self._max_waiting = o.max_waiting
        rate = dispatcher.host_rate_per_s
        burst = dispatcher.host_burst
        self.queues: HostQueues[FencedRun] = HostQueues(
            total=concurrency,
            policy=o.health or HealthPolicy(max_limit=dispatcher.host_concurrency),
            rate_per_s=rate,
            burst=float(burst) if burst is not None else default_burst(rate),
            clock=time.monotonic,
            batch_of=self._batch_of,
            on_state=_state_changed,
        )
        self._flows = o.flows
        self._reports = o.reports
        self._report_every_s = o.report_every_s
        self._tracker = CallTracker()
        self._tasks: list[asyncio.Task[None]] = []
        self._calls: set[asyncio.Task[None]] = set()
        # Webhook calls started without a task (``_begin``): each answer's future -> the
        # monotonic instant past which the watchdog abandons it.
        self._begun: dict[asyncio.Future[object], float] = {}
        self._stopping = False
        self._pump_wake = asyncio.Event()
        self._flow_wake = asyncio.Event()
        self._room = asyncio.Event()  # set while fewer than max_waiting runs wait
        self._room.set()
        self._idle = asyncio.Event()
        # A queue that can hand over the runs queued behind one without waiting (in process and
        # NATS): the taker moves a burst into the host queues in one step.
        self._take_while: Callable[..., list[FencedRun]] | None = getattr(queue, "take_while", None)

    def _batch_of(self, host: str) -> int:
        """A call to Redis carries up to a pipeline of runs (one slot); any other call one run."""
        return REDIS_BATCH if self._pipelined(host) else 1

    def _pipelined(self, host: str) -> bool:
        """Runs to Redis go out a pipeline at a time when the queue hands over runs in bursts."""
        return host == _REDIS_HOST and self._take_while is not None

    def start(self) -> None:
        self.completer.start()
        self._tasks = [
            SUPERVISOR.spawn("duetime-worker-take", self._take_loop),
            SUPERVISOR.spawn("duetime-worker-pump", self._pump_loop),
            SUPERVISOR.spawn("duetime-worker-flow", self._flow_loop),
            SUPERVISOR.spawn("duetime-worker-targets", self._report_loop),
            SUPERVISOR.spawn("duetime-worker-watchdog", self._watchdog_loop),
        ]

    def _busy(self) -> bool:
        return bool(self._queue.qsize() or self.queues.waiting or self.queues.in_flight)

    async def stop(self, grace_s: float) -> None:
        """Drain: runs already fenced are due, so they are called; in-flight calls finish within
        the grace; outcomes are recorded before returning. Anything still unrecorded after the
        grace: a call still running keeps its lease and is rescued by the janitor (recorded as
        lease_expired); a run still waiting for its host was never called and is given back
        unused."""
        if self._busy():
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout=grace_s)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._stopping = True
        for answer in list(self._begun):
            answer.cancel()  # abandoned: unrecorded, so its lease lapses as a task's call's does
        calls = list(self._calls)
        for call in calls:
            call.cancel()
        for call in calls:
            with contextlib.suppress(asyncio.CancelledError):
                await call
        await self._return_unstarted(self.queues.drain())
        await self.completer.stop()
        if self._flows is not None:
            # The slots this worker held go back to the cluster now, not when they lapse.
            needs = self.queues.flow_needs()
            if needs:
                asks = [
                    FlowAsk(n.key.owner, n.key.key, n.flow.rate_per_s, n.flow.parallelism, 0, 0)
                    for n in needs
                ]
                with contextlib.suppress(Exception):
                    await self._flows.take_flow(self.worker_id, asks, hold_s=FLOW_HOLD_S)

    async def _return_unstarted(self, left: list[FencedRun]) -> None:
        """Runs still waiting for their hosts at shutdown were never called: they go back to
        their rows unused (no attempt, no failure count), claimable by any engine at once. What
        cannot be given back (the database is away) keeps its lease, which lapses: the janitor
        then records it as lease_expired and retries it."""
        if not left:
            return
        returned = 0
        try:
            for i in range(0, len(left), RETURN_BATCH):
                part = left[i : i + RETURN_BATCH]
                returned += await self._store.return_unstarted(part)
                for run in part:
                    self._keeper.untrack(run.job_id, run.lease_token)
        except Exception as exc:
            log.warning(
                "%d runs waited for their hosts at shutdown and %d could not be given back (%s); "
                "their leases lapse and the janitor retries them",
                len(left),
                len(left) - returned,
                exc,
            )
            return
        log.info("%d runs waited for their hosts at shutdown; %d given back unused", len(left), returned)

    # ------------------------------------------------------------------ the taker

    async def _take_loop(self) -> None:
        """Runs from the run queue into the host queues, while fewer than ``max_waiting`` wait.

        No run may be named by this frame while it waits (nor by the pump's): whatever an idle
        loop's frame names stays alive, and a run or a batch kept so after a burst kept its spec,
        its delivery and its report with it (the issue-16 RSS growth)."""
        while True:
            if self.queues.waiting >= self._max_waiting:
                self._room.clear()
                await self._room.wait()
                continue
            self._take_ready(await self._queue.get())
            self._pump_wake.set()

    def _take_ready(self, first: FencedRun) -> None:
        """``first`` and the runs queued behind it, as many as there is room for."""
        self._add(first)
        room = self._max_waiting - self.queues.waiting
        if self._take_while is not None:
            for more in self._take_while(_any, max(room, 0)):
                self._add(more)
            return
        while room > 0:
            one = self._queue.get_nowait()
            if one is None:
                return
            self._add(one)
            room -= 1

    def _add(self, run: FencedRun) -> None:
        target = run.spec.parsed.target
        try:
            host = self._dispatcher.host_of(target)
        except ValueError:
            host = _BAD_URL_HOST  # fails at once when called ("invalid webhook URL")
        flow = target.flow if self._flows is not None else None
        self.queues.add(run, owner=run.owner, host=host, flow=flow)
        if flow is not None:
            self._flow_wake.set()

    # ------------------------------------------------------------------ the pump

    async def _pump_loop(self) -> None:
        loop = asyncio.get_running_loop()
        queues = self.queues
        while True:
            self._pump_wake.clear()
            if not self.completer.has_room():
                # Outcomes wait to be written: no call starts until there is room for its own.
                await self.completer.room()
            self._start_calls(loop, queues.pump())
            if queues.waiting < self._max_waiting:
                self._room.set()
            wake = queues.next_wake()
            if wake is None:
                await self._pump_wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._pump_wake.wait(), max(0.0, wake - time.monotonic()))

    def _start_calls(self, loop: asyncio.AbstractEventLoop, starts: list[Start[FencedRun]]) -> None:
        for start in starts:
            try:
                if self._begin(start):
                    continue
            except Exception:  # our bug: the call goes the task's way, which records what it can
                log.exception("starting a call without a task failed; starting it in a task")
            task = loop.create_task(self._run(start))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    async def _run(self, start: Start[FencedRun]) -> None:
        runs = start.items
        try:
            if self._pipelined(start.host):
                reports = await self.call_redis_many(runs)
            else:
                reports = [await self.call(runs[0])]
        except BaseException:
            self._abandoned(start)
            raise
        self._ended(start, reports)

    def _ended(self, start: Start[FencedRun], reports: list[AttemptReport]) -> None:
        """A call (or a Redis pipeline) ended: its slot back to its host, what it said of the host
        to the host's health and the target reports, its outcomes to the completer."""
        self.queues.ended(start, _signal(reports))
        if not start.host.startswith("broker:"):
            now = time.monotonic()
            for report in reports:
                self._tracker.add(report.run.owner, start.host, report.verdict, now)
        for report in reports:
            self.completer.add(report)
        self._pump_wake.set()
        if not self._busy():
            self._idle.set()

    def _abandoned(self, start: Start[FencedRun]) -> None:
        """A call given up at shutdown: its slot back, nothing recorded (its lease lapses)."""
        self.queues.ended(start, Signal.ANSWERED)
        self._pump_wake.set()

    # ------------------------------------------------------------------ calls without a task

    def _begin(self, start: Start[FencedRun]) -> bool:
        """Start a webhook call with no task or coroutine of its own, as the Redis path sends a
        pipeline: the request is written now and the answer's done callback records it. At a
        burst's rate a task per call (with its coroutines and its watchdog timer) cost as much CPU
        as the HTTP exchange itself. False, and the caller runs the call in a task, when this
        path cannot serve it: a queue target, tracing on (a span per call), or the owner's
        signing secrets not cached (reading them may wait for the database)."""
        if start.host.startswith("broker:") or tracing.enabled():
            return False
        run = start.items[0]
        target = run.spec.parsed.target
        if not isinstance(target, WebhookTarget):
            return False
        now = self._dispatcher.now()
        secrets = self._secrets.cached(run.owner, now)
        if secrets is None:
            return False
        delivery = Delivery.of(run, signing_secret=secrets[0], extra_signing_secrets=secrets[1:])
        began = self._dispatcher.begin(delivery, now)
        if isinstance(began, Verdict):  # decided before any request (a refused URL, a bad header)
            report = AttemptReport(run, began, now, now)
            self._count(report)
            asyncio.get_running_loop().call_soon(self._ended, start, [report])
            return True
        answer = cast("asyncio.Future[object]", began.answer)
        self._begun[answer] = time.monotonic() + target.timeout_s + self._watchdog_s
        answer.add_done_callback(functools.partial(self._answered, start, began, now))
        return True

    def _answered(self, start: Start[FencedRun], began: Started, started_at: datetime, _f: object) -> None:
        """The done callback of a call ``_begin`` started."""
        self._begun.pop(cast("asyncio.Future[object]", began.answer), None)
        run = start.items[0]
        if began.answer.cancelled():
            if self._stopping:
                self._abandoned(start)
                return
            limit = began.timeout_s + self._watchdog_s
            log.error("a call to job %s hung past %s s; recorded as timed out", run.job_id, limit)
            error = f"the call did not finish within {limit} s (worker watchdog)"
            verdict = Verdict(Outcome.TIMED_OUT, True, None, error)
        else:
            try:
                verdict = began.verdict()
            except Exception as exc:
                # Our own bug, not the target's: recorded as a retryable failure, as a task's is.
                log.exception("delivery of job %s failed inside the dispatcher", run.job_id)
                verdict = Verdict(Outcome.FAILED, True, None, f"internal error ({type(exc).__name__})")
        report = AttemptReport(run, verdict, started_at, max(self._dispatcher.now(), started_at))
        self._count(report)
        self._ended(start, [report])

    async def _watchdog_loop(self) -> None:
        """The last-resort watchdog of the calls started without a task: one that outlives its
        own timeout by ``watchdog_s`` (a client that never answers) is abandoned and recorded as
        timed out, as ``asyncio.timeout`` does for a call in a task."""
        while True:
            await asyncio.sleep(WATCHDOG_TICK_S)
            now = time.monotonic()
            for answer in [a for a, deadline in self._begun.items() if deadline <= now]:
                answer.cancel()

    @staticmethod
    def _count(report: AttemptReport) -> None:
        v = report.verdict
        metrics.CALLS.labels(v.outcome.value).inc()
        if report.started_at is not None:
            metrics.START_LATENESS.observe(max((report.started_at - report.run.due_at).total_seconds(), 0.0))
            metrics.TARGET_LATENCY.observe((report.finished_at - report.started_at).total_seconds())

    # ------------------------------------------------------------------ flow keys

    async def _flow_loop(self) -> None:
        """Asks the cluster for grants of the flow keys runs wait for, every ``FLOW_TICK_S`` while
        any wait (one round trip for all of them), and gives slots back when none wait."""
        flows = self._flows
        if flows is None:
            return
        backoff = Backoff(0.2, 5.0)
        while True:
            needs = self.queues.flow_needs()
            if not needs:
                self._flow_wake.clear()
                await self._flow_wake.wait()
                continue
            asks = [
                FlowAsk(n.key.owner, n.key.key, n.flow.rate_per_s, n.flow.parallelism, n.want, n.running)
                for n in needs
            ]
            try:
                grants = await flows.take_flow(self.worker_id, asks, hold_s=FLOW_HOLD_S)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                STORAGE_RETRIES.labels("duetime-worker-flow", error_kind(exc)).inc()
                await asyncio.sleep(backoff.next())
                continue
            backoff.reset()
            for grant in grants:
                if grant.granted:
                    self.queues.grant(FlowKey(grant.owner, grant.key), grant.granted)
            self._pump_wake.set()
            self._flow_wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flow_wake.wait(), FLOW_TICK_S)
            await asyncio.sleep(FLOW_MIN_GAP_S)

    # ------------------------------------------------------------------ target health

    async def _report_loop(self) -> None:
        """What this worker sees of its webhook hosts: the state gauge, and every few seconds the
        reports ``GET /v1/targets`` reads (one round trip per batch)."""
        while True:
            await asyncio.sleep(self._report_every_s)
            states = self.queues.host_states()
            counts = {state: 0 for state in TargetState}
            for host, (state, _, _) in states.items():
                if not host.startswith("broker:"):
                    counts[state] += 1
            for state, n in counts.items():
                metrics.TARGET_STATES.labels(state.value).set(n)
            for reason, n in self.queues.waiting_by_reason().items():
                metrics.RUNS_WAITING.labels(reason).set(n)
            reports = self._tracker.reports(states, time.monotonic(), DB_CLOCK.now())
            if self._reports is None or not reports:
                continue
            try:
                for i in range(0, len(reports), REPORT_BATCH):
                    await self._reports.report_target_health(self.worker_id, reports[i : i + REPORT_BATCH])
            except Exception as exc:
                if not is_transient(exc):
                    raise
                STORAGE_RETRIES.labels("duetime-worker-targets", error_kind(exc)).inc()

    async def call_redis_many(self, runs: list[FencedRun]) -> list[AttemptReport]:
        """One attempt each for runs whose target is a Redis stream, sent together. Queue
        messages carry no signature, so no signing secret is read."""
        deliveries = [Delivery.of(run, signing_secret="") for run in runs]
        # A span's description per run only when tracing is on: its idempotency key costs a
        # formatted timestamp per run of a burst.
        infos = [_run_info(d) for d in deliveries] if tracing.enabled() else []
        with tracing.run_spans(infos) as spans:
            if spans is not None:
                deliveries = [
                    replace(d, traceparent=t.traceparent) for d, t in zip(deliveries, spans, strict=True)
                ]
            reports = await self._redis_batch(runs, deliveries)
            for report, span in zip(reports, spans or (), strict=False):
                v = report.verdict
                span.end(v.outcome.value, v.status_code, v.error)
        return reports

    async def _redis_batch(self, runs: list[FencedRun], deliveries: list[Delivery]) -> list[AttemptReport]:
        limit = self._dispatcher.broker_timeout_s + self._watchdog_s
        try:
            async with asyncio.timeout(limit):
                sent = await self._dispatcher.deliver_redis_many(deliveries)
            started_at, finished_at, verdicts = sent.started_at, sent.finished_at, sent.verdicts
        except TimeoutError:
            log.error("a batch of %d Redis runs hung past %s s; recorded as timed out", len(runs), limit)
            started_at = finished_at = DB_CLOCK.now()
            error = f"the call did not finish within {limit} s (worker watchdog)"
            verdicts = [Verdict(Outcome.TIMED_OUT, True, None, error)] * len(runs)
        took = (finished_at - started_at).total_seconds()
        outcomes: dict[Outcome, int] = {}
        reports = []
        for run, v in zip(runs, verdicts, strict=True):
            outcomes[v.outcome] = outcomes.get(v.outcome, 0) + 1
            reports.append(AttemptReport(run, v, started_at, finished_at))
        for outcome, n in outcomes.items():
            metrics.CALLS.labels(outcome.value).inc(n)
        metrics.observe_many(
            metrics.START_LATENESS, [max((started_at - run.due_at).total_seconds(), 0.0) for run in runs]
        )
        metrics.observe_many(metrics.TARGET_LATENCY, [took] * len(runs))
        return reports

    async def _signing_secrets(self, run: FencedRun) -> tuple[str, ...]:
        """The owner's secrets, waiting (with backoff, up to ``secret_wait_s``) while the home
        database cannot be read and no cached copy is left: a call Duetime could not make for its
        own trouble is not an attempt of the target's, so it is not recorded as a failure that
        uses one. The run's lease is kept by the lease keeper meanwhile."""
        backoff = Backoff(0.2, 5.0)
        deadline = time.monotonic() + self._secret_wait_s
        while True:
            try:
                return await self._secrets.get(run.owner)
            except StorageUnavailable as exc:
                if time.monotonic() >= deadline:
                    raise
                STORAGE_RETRIES.labels("duetime-worker-secrets", error_kind(exc)).inc()
                await asyncio.sleep(min(backoff.next(), max(deadline - time.monotonic(), 0.0)))

    async def call(self, run: FencedRun) -> AttemptReport:
        """One attempt of ``run``; with tracing on, inside its span, whose traceparent it sends."""
        if not tracing.enabled():
            return await self._call(run, None)
        info = tracing.RunInfo(
            job_id=str(run.public_id),
            idempotency_key=idempotency_key(str(run.public_id), run.scheduled_for),
            attempt=run.attempt,
            fencing_token=run.lease_token,
            target_type=run.spec.parsed.target.type,
        )
        with tracing.run_spans([info]) as spans:
            assert spans is not None
            report = await self._call(run, spans[0].traceparent)
            v = report.verdict
            spans[0].end(v.outcome.value, v.status_code, v.error)
        return report

    async def _call(self, run: FencedRun, traceparent: str | None) -> AttemptReport:
        spec = run.spec.parsed
        try:
            secrets = await self._signing_secrets(run)
        except (LookupError, StorageUnavailable) as exc:
            verdict = Verdict(Outcome.FAILED, True, None, f"signing secret unavailable: {exc}")
            return AttemptReport(run, verdict, None, DB_CLOCK.now())
        now = DB_CLOCK.now()
        delivery = Delivery.of(
            run, signing_secret=secrets[0], extra_signing_secrets=secrets[1:], traceparent=traceparent
        )
        # A last-resort watchdog: the dispatcher has its own timeouts, so this only fires when a
        # call hangs where nothing else would notice (a client library that never answers). A
        # worker that waits forever would fill the run queue and stall the engine's fencer.
        own = (
            spec.target.timeout_s
            if isinstance(spec.target, WebhookTarget)
            else self._dispatcher.broker_timeout_s
        )
        limit = own + self._watchdog_s
        try:
            async with asyncio.timeout(limit):
                result = await self._dispatcher.call(delivery)
        except TimeoutError:
            log.error("a call to job %s hung past %s s; recorded as timed out", run.job_id, limit)
            error = f"the call did not finish within {limit} s (worker watchdog)"
            result = CallResult(Verdict(Outcome.TIMED_OUT, True, None, error), now, DB_CLOCK.now())
        report = AttemptReport.of(run, result)
        self._count(report)
        return report


def _run_info(d: Delivery) -> tracing.RunInfo:
    return tracing.RunInfo(
        job_id=d.job_id,
        idempotency_key=idempotency_key(d.job_id, d.scheduled_for),
        attempt=d.attempt,
        fencing_token=d.fencing_token,
        target_type="queue",
    )


REDIS_BATCH = 500  # one pipeline's worth (workers/queues.py _RedisBatcher max_batch)


def _any(run: FencedRun) -> bool:
    return True


def _signal(reports: list[AttemptReport]) -> Signal:
    """What a call said of its host; a batch (one pipeline) says "overloaded" only if all of it
    did (one connection, one answer)."""
    if len(reports) == 1:
        return signal_of(reports[0].verdict)
    if all(signal_of(r.verdict) is Signal.OVERLOADED for r in reports):
        return Signal.OVERLOADED
    return Signal.ANSWERED


def _state_changed(host: str, before: TargetState, after: TargetState) -> None:
    metrics.TARGET_STATE_CHANGES.labels(after.value).inc()
    if after is TargetState.BACKING_OFF:
        log.warning("target %s backs off: its calls keep timing out or being refused; its runs wait", host)
    elif before is TargetState.BACKING_OFF:
        log.info("target %s answers again: %s", host, after.value)
