"""The composition root: builds the parts of a Duetime process from ``Settings`` and runs them
until SIGTERM/SIGINT, then shuts them down in the order that loses nothing.

Shutdown order: stop taking API requests → engine stops claiming and gives back unfired claims →
workers finish what was fenced (within the grace) and record it → heartbeats stop → connections
close. Final writes are shielded from cancellation inside the parts themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from duetime import logs
from duetime._version import __version__
from duetime.api.app import create_app, metrics_app, metrics_handler
from duetime.api.request_id import request_id_middleware
from duetime.api.server import api_runner
from duetime.core.ssrf import AddressPolicy
from duetime.core.targethealth import HealthPolicy
from duetime.core.validation import SpecLimits
from duetime.engine.due_age import DueAgeSampler
from duetime.engine.membership import MembershipKeeper
from duetime.engine.retention import RetentionConfig, RetentionService
from duetime.engine.service import Engine, EngineConfig
from duetime.memory import DrainWatch
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.runqueue.natsqueue import NatsRunPublisher, PublishedLeaseKeeper
from duetime.settings import Settings
from duetime.storage.dbclock import DB_CLOCK, ClockSync
from duetime.storage.ports import Registration, Registry
from duetime.storage.postgres import PostgresStore
from duetime.storage.postgres.sessions import SessionBounds
from duetime.storage.shardmap import ShardMap
from duetime.supervisor import SUPERVISOR
from duetime.workers import tracing
from duetime.workers.dispatch import Dispatcher
from duetime.workers.events import EventSender, EventSenderConfig
from duetime.workers.pool import WorkerOptions, WorkerPool
from duetime.workers.remote import RemoteWorker, worker_id

log = logging.getLogger("duetime")

# `duetime_build_info{version="…"} 1` on every process's /metrics (API, engine, worker, `run`): a
# dashboard joins on it to see which release each process runs, e.g. halfway through an upgrade.
# duetime_build_info is registered in duetime.exposition, beside /metrics itself.


def address_policy(settings: Settings) -> AddressPolicy:
    return AddressPolicy(
        allow_private=settings.webhook_allow_private, allow_cidrs=tuple(settings.webhook_allow_cidrs)
    )


def retention_config(settings: Settings) -> RetentionConfig:
    return RetentionConfig(
        run_retention_s=settings.run_retention_s,
        finished_job_retention_s=settings.finished_job_retention_s,
        batch=settings.retention_batch,
        interval_s=settings.retention_interval_s,
        pause_s=settings.retention_pause_s,
    )


def session_bounds(settings: Settings) -> SessionBounds:
    return SessionBounds(
        statement_timeout_s=settings.db_statement_timeout_s,
        lock_timeout_s=settings.db_lock_timeout_s,
        idle_in_transaction_timeout_s=settings.db_idle_in_transaction_timeout_s,
        connect_timeout_s=settings.db_connect_timeout_s,
        keepalives_idle_s=settings.db_keepalives_idle_s,
    )


def engine_config(settings: Settings) -> EngineConfig:
    return EngineConfig(
        engine_id=settings.engine_id,
        shards=tuple(sorted(settings.shards)),
        lookahead_s=settings.lookahead_s,
        claim_batch=settings.claim_batch,
        poll_interval_s=settings.poll_interval_s,
        lease_s=settings.lease_s,
        janitor_interval_s=settings.janitor_interval_s,
        run_all_cap=settings.misfire_run_all_cap,
        record_cap=settings.max_skipped_recorded,
    )


def tune_gc() -> None:
    """Fewer, larger collections for a node's allocation pattern.

    A burst allocates a few container objects per run (rows, records, reports) that live for a
    few milliseconds to seconds, while the wheel, the lanes and the queues hold hundreds of
    thousands of runs. With the default thresholds (700, 10, 10) every 700 allocations start a
    young collection, the survivors get promoted, and full collections walk the whole heap again
    and again: 2.5 s of full collections per node in a 100,000-run burst (of 3.3 s in the
    collector), measured with gc.callbacks in loadtest/burst.py. Objects made at start-up live as
    long as the process, so they are frozen out of every collection.
    """
    gc.freeze()
    gc.set_threshold(20_000, 20, 100)


def worker_options(s: Settings, store: PostgresStore, wid: str) -> WorkerOptions:
    """What a worker pool takes from the settings besides its concurrency (workers/pool.py)."""
    return WorkerOptions(
        worker_id=wid,
        max_waiting=s.worker_max_waiting,
        health=HealthPolicy(
            max_limit=s.target_concurrency,
            backoff_after=s.target_backoff_after,
            backoff_s=s.target_backoff_s,
            backoff_max_s=s.target_backoff_max_s,
        ),
        flows=store,
        reports=store,
    )


@dataclass
class Node:
    """The parts one process runs: any of api, engine, workers, over one store."""

    settings: Settings
    api: bool = True
    engine: bool = True
    workers: bool = True
    store: PostgresStore | None = None
    url: str | None = None
    _runner: web.AppRunner | None = None
    _metrics_runner: web.AppRunner | None = None
    metrics_url: str | None = None
    _engine: Engine | None = None
    _pool: WorkerPool | None = None
    _keeper: LeaseKeeper | None = None
    _dispatcher: Dispatcher | None = None
    _started: list[str] = field(default_factory=list)
    _publisher: NatsRunPublisher | None = None
    _published: PublishedLeaseKeeper | None = None
    _remote: RemoteWorker | None = None
    _due_age: DueAgeSampler | None = None
    _membership: MembershipKeeper | None = None
    _retention: RetentionService | None = None
    _events: EventSender | None = None
    _drain_watch: asyncio.Task[None] | None = None
    _clock_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        tune_gc()
        if self.workers and not tracing.enabled():
            tracing.configure()  # OTEL_TRACES_EXPORTER; raises TracingUnavailable without the extra
        s = self.settings
        self.store = await PostgresStore.open(
            ShardMap.from_dsns(s.shard_dsns()),
            pool_size=s.db_pool_size,
            notify_horizon_s=max(s.lookahead_s * 2, 120.0),
            bounds=session_bounds(s),
        )
        # One clock for the cluster, the database's: measured before anything is timed by it (an
        # engine fires by it, workers date attempts by it, the store computes retry times by it).
        sync = ClockSync(self.store.db_now, process=s.engine_id, max_uncertainty_s=s.clock_max_uncertainty_s)
        await sync.until_known(within_s=max(s.db_connect_timeout_s, 10.0))
        self._clock_task = SUPERVISOR.spawn("duetime-clock-sync", sync.run)
        policy = address_policy(s)
        if s.run_queue == "nats" and (self.engine or self.workers):
            await self._start_nats_parts(policy)
        elif self.engine or self.workers:
            self._keeper = LeaseKeeper(self.store, lease_s=s.lease_s, heartbeat_s=s.heartbeat_s)
            queue = InProcessRunQueue(s.run_queue_max)
            self._dispatcher = Dispatcher(
                policy=policy,
                nats_url=s.nats_url,
                redis_url=s.redis_url,
                host_concurrency=s.target_concurrency,
                host_rate_per_s=s.target_rate,
                topic_policy=s.topics(),
            )
            await self._dispatcher.start()
            self._pool = WorkerPool(
                self.store,
                queue,
                self._dispatcher,
                self._keeper,
                concurrency=s.worker_concurrency,
                options=worker_options(s, self.store, worker_id()),
            )
            self._pool.start()
            self._keeper.start()
            self._engine = Engine(self.store, queue, self._keeper, engine_config(s), clock=DB_CLOCK)
            await self._start_engine()
        if self.workers and self._dispatcher is not None:
            # Failure events go out where runs go out: every worker process shares the outbox.
            self._events = EventSender(
                self.store,
                self._dispatcher,
                EventSenderConfig(given_up_retention_s=s.run_retention_s),
            )
            self._events.start()
        if self.engine:
            self._due_age = DueAgeSampler(
                self.store,
                s.shards,
                interval_s=max(s.janitor_interval_s, 1.0),
            )
            self._due_age.start()
        if self._engine is not None or self._keeper is not None:
            self._drain_watch = asyncio.create_task(self._watch_drains(), name="duetime-drain-watch")
        app = (
            create_app(
                self.store,
                policy=policy,
                limits=SpecLimits(
                    min_cron_interval_s=s.min_cron_interval_s,
                    run_at_horizon_days=s.run_at_horizon_days,
                    backfill_max_occurrences=s.backfill_max,
                    backfill_pace_per_s=s.backfill_pace_per_s,
                    max_pending_triggers=s.max_pending_triggers,
                ),
                owner_rate_per_s=s.api_owner_rate,
                max_jobs_per_owner=s.max_jobs_per_owner,
                bulk_max=s.bulk_max,
                access_log=s.access_log,
                max_job_bytes_per_owner=s.max_job_bytes_per_owner,
                body_timeout_s=s.http_body_timeout_s,
                topic_policy=s.topics(),
                metrics_token=s.metrics_token,
                serve_metrics=s.metrics_port is None,
                readiness=self._tasks_ready,
            )
            if self.api
            else _ops_app(self.store, self._not_ready, s, access_log=s.access_log)
        )
        timeout_s = s.http_header_timeout_s
        self._runner = api_runner(app, header_timeout_s=timeout_s, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, s.http_host, s.http_port, reuse_port=True)
        await site.start()
        if s.metrics_port is not None:
            self._metrics_runner = api_runner(
                metrics_app(s.metrics_token), header_timeout_s=timeout_s, handle_signals=False
            )
            await self._metrics_runner.setup()
            metrics_site = web.TCPSite(self._metrics_runner, s.metrics_host, s.metrics_port, reuse_port=True)
            await metrics_site.start()
            bound = getattr(metrics_site, "_server", None)
            mport = (
                bound.sockets[0].getsockname()[1] if bound is not None and bound.sockets else s.metrics_port
            )
            mhost = s.metrics_host if ":" not in s.metrics_host else f"[{s.metrics_host}]"
            self.metrics_url = f"http://{mhost}:{mport}"
            log.info("metrics on %s/metrics", self.metrics_url)
        host = s.http_host if ":" not in s.http_host else f"[{s.http_host}]"
        port = s.http_port
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            port = server.sockets[0].getsockname()[1]
        self.url = f"http://{host}:{port}"
        if self.engine:
            self._retention = RetentionService(self.store, retention_config(s))
            self._retention.start()

    async def _start_nats_parts(self, policy: AddressPolicy) -> None:
        """DUETIME_RUN_QUEUE=nats: the engine publishes fenced runs (and keeps their leases until a
        worker takes them); the workers take them from NATS. Either part, or both, per process."""
        s = self.settings
        assert self.store is not None and s.nats_url is not None
        if self.workers:
            self._dispatcher = Dispatcher(
                policy=policy,
                nats_url=s.nats_url,
                redis_url=s.redis_url,
                host_concurrency=s.target_concurrency,
                host_rate_per_s=s.target_rate,
                topic_policy=s.topics(),
            )
            await self._dispatcher.start()
            self._remote = RemoteWorker(
                self.store,
                self._dispatcher,
                nats_url=s.nats_url,
                subject_prefix=s.nats_run_subject,
                lease_s=s.lease_s,
                heartbeat_s=s.heartbeat_s,
                ack_wait_s=s.nats_ack_wait_s,
                concurrency=s.worker_concurrency,
                shutdown_grace_s=s.shutdown_grace_s,
                options=worker_options(s, self.store, "worker"),
            )
            await self._remote.start()
        if self.engine:
            self._publisher = NatsRunPublisher(
                url=s.nats_url,
                prefix=s.nats_run_subject,
                publisher=s.engine_id,
                ack_wait_s=s.nats_ack_wait_s,
                maxsize=s.run_queue_max,
            )
            await self._publisher.start()
            self._published = PublishedLeaseKeeper(
                self.store,
                holder=s.engine_id,
                lease_s=s.lease_s,
                heartbeat_s=s.heartbeat_s,
                max_wait_s=s.queue_wait_max_s,
            )
            self._published.start()
            # The engine id first: the restart step below is for a dead predecessor's runs only.
            await self._membership_keeper().claim_id()
            # Before Engine.start: its own restart step selects without locking, and could finish a
            # run a worker is taking at that moment (then called twice); this one cannot.
            expired = await self.store.expire_published_of(s.engine_id, sorted(s.shards))
            if expired:
                log.info("finished %d runs published by a previous life of this engine", expired)
            self._engine = Engine(
                self.store, self._publisher, self._published, engine_config(s), clock=DB_CLOCK
            )
            await self._start_engine()

    async def _start_engine(self) -> None:
        """Join the membership, start serving the shards dealt to this engine, keep dealing.

        Every engine joins: ``DUETIME_SHARDS``/``--shards`` only restrict what it may serve. A
        multi-process ``duetime run`` gives each process its own share as its allowed set, so there
        each shard stays with one process (its in-process workers are its only ones)."""
        s = self.settings
        assert self._engine is not None
        self._membership = self._membership_keeper()
        dealt = await self._membership.join()
        log.info(
            "engine %s joined the membership; shards dealt to it: %s",
            s.engine_id,
            ",".join(map(str, sorted(dealt))) or "none",
        )
        await self._engine.start(dealt)
        await self._membership.start(self._engine)

    def _membership_keeper(self) -> MembershipKeeper:
        """This engine's membership keeper (made once): it holds the engine id's lock."""
        if self._membership is not None:
            return self._membership
        s = self.settings
        assert self.store is not None
        self._membership = MembershipKeeper(
            self.store,
            Registration(
                engine_id=s.engine_id,
                host=socket.gethostname(),
                allowed=s.shards,
                lease_s=s.lease_s,
                replicas=s.shard_replicas,
                incarnation=uuid.uuid4(),
            ),
            interval_s=s.heartbeat_s,
            id_lock=self.store.engine_id_lock(s.engine_id),
        )
        return self._membership

    def held_runs(self) -> int:
        """Runs this process holds now: claimed (in the wheel or fired, not fenced) and fenced
        but not recorded (the lease keepers track those from the fence to the recording)."""
        held = self._engine.held_runs if self._engine is not None else 0
        for keeper in (self._keeper, self._published):
            if keeper is not None:
                held += len(keeper)
        return held

    async def _watch_drains(self) -> None:
        """Once a burst has drained, give the C allocator's free memory back (duetime.memory)."""
        watch = DrainWatch()
        interval = max(self.settings.janitor_interval_s, 1.0)
        while True:
            await asyncio.sleep(interval)
            try:
                watch.observe(self.held_runs())
            except Exception:  # never worth a node: the next round looks again
                log.exception("drain watch failed")

    def _not_ready(self) -> str | None:
        if (down := SUPERVISOR.not_ready(self.settings.lease_s)) is not None:
            return down
        if self._publisher is not None and not self._publisher.connected:
            return "not connected to NATS"
        if self._remote is not None:
            return self._remote.ready()
        return None

    async def _tasks_ready(self) -> None:
        """/readyz of the API: red while a supervised task of this process has been failing for
        longer than a lease (its part of the run path is not working, whatever else answers)."""
        if (down := SUPERVISOR.not_ready(self.settings.lease_s)) is not None:
            raise RuntimeError(down)

    def crashed(self) -> BaseException | None:
        return self._engine.crashed if self._engine is not None else None

    async def stop(self) -> None:
        s = self.settings
        if self._clock_task is not None:
            self._clock_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._clock_task
        if self._drain_watch is not None:
            self._drain_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain_watch
        if self._runner is not None:
            await self._runner.cleanup()
        if self._due_age is not None:
            await self._due_age.stop()
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
        if self._membership is not None:
            await self._membership.stop()  # leave first: the others take the shards at once
        if self._retention is not None:
            await self._retention.stop()
        if self._engine is not None:
            await self._engine.stop()
        if self._publisher is not None:
            await self._publisher.close(s.shutdown_grace_s)
        if self._published is not None:
            waiting = await self._published.drain(s.shutdown_grace_s)
            if waiting:
                log.warning("%d published runs were not taken by a worker before shutdown", waiting)
            await self._published.stop()
        if self._events is not None:
            await self._events.stop(s.shutdown_grace_s)
        if self._remote is not None:
            await self._remote.stop()
        if self._pool is not None:
            await self._pool.stop(s.shutdown_grace_s)
        if self._keeper is not None:
            await self._keeper.stop()
        if self._dispatcher is not None:
            await self._dispatcher.close()
        if self.store is not None:
            await self.store.close()


def _ops_app(
    store: Registry,
    not_ready: Callable[[], str | None] = lambda: None,
    settings: Settings | None = None,
    *,
    access_log: bool = False,
) -> web.Application:
    """/healthz, /readyz and /metrics for a process that does not serve the API: the same request
    ids, access log and metrics content type as the API's, so one scrape config and one log
    pipeline fit every process."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "version": __version__})

    async def readyz(_: web.Request) -> web.Response:
        try:
            await store.ping()
        except Exception as exc:
            return web.json_response(
                {"error": {"code": "not_ready", "message": f"database unreachable: {exc}"}}, status=503
            )
        reason = not_ready()
        if reason is not None:
            return web.json_response({"error": {"code": "not_ready", "message": reason}}, status=503)
        return web.json_response({"status": "ready"})

    app = web.Application(middlewares=[request_id_middleware(access_log=access_log)])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if settings is None or settings.metrics_port is None:
        app.router.add_get("/metrics", metrics_handler(settings.metrics_token if settings else None))
    return app


async def _serve(node: Node, ready: Callable[[str], None] | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await node.start()
    try:
        assert node.url is not None
        if ready is not None:
            ready(node.url)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            if node.crashed() is not None:
                raise RuntimeError("an engine task died; stopping") from node.crashed()
    finally:
        log.info("shutting down")
        await node.stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


async def run_all(
    settings: Settings, *, dsn_override: str | None = None, ready: Callable[[str], None] | None = None
) -> None:
    """`duetime run`: API, engine for every configured shard and workers, in one process — or,
    with DUETIME_PROCESSES=N, in N processes that each own a share of the shards."""
    if dsn_override is not None:
        settings = settings.with_database(dsn_override)
    if settings.processes <= 1:
        await _serve(Node(settings), ready)
        return
    await _serve_processes(settings, ready)


def split_shards(shards: frozenset[int], parts: int) -> list[frozenset[int]]:
    """Deal the shards out round-robin so every process gets an even share."""
    ordered = sorted(shards)
    groups = [frozenset(ordered[i::parts]) for i in range(parts)]
    return [g for g in groups if g]


def _child_main(settings: Settings, started: Any) -> None:
    """One process of a multi-process `duetime run`: a full node for its shards."""
    import uvloop

    logs.configure(settings.log_level, settings.log_format)
    uvloop.run(_serve(Node(settings), lambda _url: started.set()))


async def _serve_processes(settings: Settings, ready: Callable[[str], None] | None) -> None:
    import multiprocessing as mp
    import os
    import socket

    port = settings.http_port
    if port == 0:  # every process must bind the same port: pick it once here
        with socket.socket() as sock:
            sock.bind((settings.http_host, 0))
            port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = []
    groups = split_shards(settings.shards, settings.processes)
    for i, group in enumerate(groups):
        child = replace(
            settings,
            shards=group,
            http_port=port,
            processes=1,
            engine_id=f"{settings.engine_id}/{i}" if os.environ.get("DUETIME_ENGINE_ID") else "",
        )
        started = ctx.Event()
        proc = ctx.Process(target=_child_main, args=(child, started), name=f"duetime-{i}")
        proc.start()
        procs.append((proc, started))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        for proc, started in procs:
            while not await asyncio.to_thread(started.wait, 0.5):
                if not proc.is_alive():
                    raise RuntimeError(f"{proc.name} exited with {proc.exitcode} while starting")
        host = settings.http_host if ":" not in settings.http_host else f"[{settings.http_host}]"
        if ready is not None:
            ready(f"http://{host}:{port}")
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.5)
            dead = [p for p, _ in procs if not p.is_alive()]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited with {dead[0].exitcode}; stopping the others")
    finally:
        for proc, _ in procs:
            if proc.is_alive():
                proc.terminate()  # SIGTERM: the child shuts down gracefully
        for proc, _ in procs:
            await asyncio.to_thread(proc.join, settings.shutdown_grace_s + 10)
            if proc.is_alive():
                proc.kill()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


async def run_api(settings: Settings, *, ready: Callable[[str], None] | None = None) -> None:
    await _serve(Node(settings, engine=False, workers=False), ready)


async def run_engine(settings: Settings, *, ready: Callable[[str], None] | None = None) -> None:
    """An engine for ``settings.shards``: with the in-process run queue it runs its own workers;
    with DUETIME_RUN_QUEUE=nats it publishes fenced runs for `duetime worker` processes."""
    await _serve(Node(settings, api=False, workers=settings.run_queue != "nats"), ready)


async def run_worker(settings: Settings, *, ready: Callable[[str], None] | None = None) -> None:
    """`duetime worker`: takes runs from the NATS run queue, calls their targets, records outcomes."""
    await _serve(Node(settings, api=False, engine=False), ready)
