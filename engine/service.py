"""The engine: claims the next minute of due runs for its shards into a timer wheel, fires each on
its due instant, and fences it into the run queue.

Tasks (all named, started by ``Engine.start``, restarted by the process's supervisor when they
fail, ended by ``stop``): one claim loop per shard it serves, woken by LISTEN/NOTIFY or the poll
interval; the wheel driver; the fencer; the janitor. On stop the engine stops claiming, gives back
every claim it has not fired, and lets the fencer finish its batch: nothing lost, nothing doubled.

``config.shards`` are the shards the engine *may* serve; which of them it serves is set at start
and changed with ``serve()`` (by the membership keeper, from the dealing). Losing a shard is a
stop for that shard alone: its claim loop ends and its unfired claims are given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from duetime.core import jitter
from duetime.core.errors import is_transient
from duetime.core.misfire import CatchUp, FireNow, SkipTo, decide
from duetime.core.runpath import Claim, FencedRun, Leased, Skip
from duetime.engine.clock import Clock, SystemClock
from duetime.engine.wheel import TimerWheel, WheelDriver
from duetime.runqueue import metrics, wire
from duetime.runqueue.inprocess import RunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.ports import DueListener, RunStore
from duetime.supervisor import STORAGE_RETRIES, SUPERVISOR, Backoff, error_kind

log = logging.getLogger("duetime.engine")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    engine_id: str
    shards: tuple[int, ...] = tuple(range(16))
    lookahead_s: float = 60.0
    claim_batch: int = 500
    poll_interval_s: float = 1.0
    lease_s: float = 30.0
    janitor_interval_s: float = 5.0
    fence_batch: int = 500
    run_all_cap: int = 100
    record_cap: int = 100
    idempotency_ttl_s: float = 48 * 3600.0
    # overlap=allow: how far ahead of a busy row's next occurrence it is handed to a row of its
    # own (which the claim loop then claims like any due row); and how often each shard looks.
    overlap_horizon_s: float = 2.0
    overlap_interval_s: float = 0.5
    # Pauses with an "until": how often each shard looks for those that ended (their jobs are
    # resumed then, and claimed right after: an ended pause is at most this late).
    pause_end_interval_s: float = 1.0


class Engine:
    def __init__(
        self,
        store: RunStore,
        queue: RunQueue,
        keeper: LeaseKeeper,
        config: EngineConfig,
        clock: Clock | None = None,
    ) -> None:
        self._store = store
        self._queue = queue
        self._keeper = keeper
        self.config = config
        self._clock = clock or SystemClock()
        self.wheel = TimerWheel(self._clock.now_ms())
        # No early wake-up and spin: under load a spinning driver starves the workers on the same
        # loop; uvloop's timers alone fire within about a millisecond of the due instant.
        # Large hand-over batches: a burst's entries reach the owner lanes within a few slices,
        # so the fairness of the fencer is not undone by the order entries leave the wheel.
        self._driver = WheelDriver(
            self.wheel,
            self._clock,
            self._on_fire,
            early_wake_ms=0.0,
            on_crash=self._driver_crashed,
            batch_size=50_000,
        )
        self._wakeups = {s: asyncio.Event() for s in config.shards}
        # The shards served now (a subset of config.shards) and their claim loops; serve() changes
        # them one call at a time.
        self.serving: frozenset[int] = frozenset(config.shards)
        self._claimers: dict[int, asyncio.Task[None]] = {}
        self._serve_lock = asyncio.Lock()
        # Fired, not yet fenced: one deque per owner lane, and the lanes that have entries in the
        # order they take turns (see _take_fair).
        # Lanes hold wheel items as they fired: entries and bundles (runqueue.wire), split only as
        # the fencer takes them; the counts are of runs.
        self._lanes: dict[int, deque[bytes]] = {}
        self._ring: deque[int] = deque()
        self._fired_count = 0
        self._waiting = 0  # runs in the wheel (len(self.wheel) counts its items)
        self._fire_event = asyncio.Event()
        # A database whose fence failed: when the fencer tries it again, and its backoff.
        self._db_retry_at: dict[int, float] = {}
        self._db_backoff: dict[int, Backoff] = {}
        self._one_database = len({store.database_of(shard) for shard in config.shards}) == 1
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._fencer: asyncio.Task[None] | None = None
        self._listener: DueListener | None = None
        self.crashed: BaseException | None = None
        # Benchmarks set this to see every fire's lateness in ms, exactly (the histogram buckets).
        self.lateness_probe: Callable[[list[int]], None] | None = None
        self.fence_time_s = 0.0
        self.fence_statements = 0
        # Fired entries the fencer has taken off the lanes (fenced or rejected): the janitor keeps
        # this engine's waiting claims only while this moves (see _keep_waiting_claims).
        self.fence_progress = 0
        self._kept_at: tuple[float, int] | None = None
        self._fence_rate: float | None = None
        self._progress_seen = 0
        self._progress_at = time.monotonic()

    @property
    def held_runs(self) -> int:
        """Claims this engine holds: waiting in the wheel, or fired and not yet fenced."""
        return self._waiting + self._fired_count

    @property
    def waiting_runs(self) -> int:
        """Claimed runs waiting in the wheel (bundled or not) for their due instant."""
        return self._waiting

    # ------------------------------------------------------------------ lifecycle

    async def start(self, serving: frozenset[int] | None = None) -> None:
        """Start serving ``serving`` (default: every shard of ``config.shards``)."""
        cfg = self.config
        self.serving = frozenset(cfg.shards) if serving is None else frozenset(serving) & set(cfg.shards)
        # Calls this engine had in flight when it last died have unknown outcomes: finish them as
        # lease_expired (retried by policy) rather than wait for their leases to lapse. Every shard
        # it may serve: its last life may have served others than this one will.
        await self._store.expire_running_of(cfg.engine_id, cfg.shards)
        retaken = await self._store.retake_claims(cfg.engine_id, cfg.shards, lease_s=cfg.lease_s)
        if retaken:
            metrics.RETAKEN.inc(len(retaken))
            log.info("engine %s took back %d claimed runs", cfg.engine_id, len(retaken))
            ours = [r for r in retaken if r.shard in self.serving]
            others = [r for r in retaken if r.shard not in self.serving]
            if others:  # claims of shards dealt to other engines now: theirs to claim
                metrics.RELEASED.inc(await self._release(others))
            await self._admit(ours)
        await self._listen()
        self._driver.start()
        self._fencer = self._spawn(self._fence_loop, "duetime-fencer")
        for shard in sorted(self.serving):
            self._start_claiming(shard)
        self._spawn(self._janitor_loop, "duetime-janitor")

    def _start_claiming(self, shard: int) -> None:
        task = self._spawn(
            lambda: self._claim_loop(shard),
            f"duetime-claim-{shard}",
            keep_going=lambda: shard in self.serving,
        )
        self._claimers[shard] = task
        task.add_done_callback(self._forget_task)

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        """A claim loop that ended because its shard was dealt away leaves the task list."""
        if task in self._tasks and not self._stopping.is_set():
            self._tasks.remove(task)

    async def serve(self, shards: frozenset[int]) -> None:
        """Serve exactly ``shards`` (within ``config.shards``) from now on.

        A gained shard's claim loop starts at once (it claims within one poll). A lost shard is
        handed over as a stop would hand over all of them: its claim loop ends (a claim that
        committed still reaches the wheel), then its claims not yet fired are taken out of the
        wheel and the fencer's lanes and given back, so the engine it was dealt to claims them
        with a fresh lease. Runs already fenced keep going: their leases are held per run.
        """
        async with self._serve_lock:
            if self._stopping.is_set():
                return
            wanted = frozenset(shards) & set(self.config.shards)
            lost, gained = self.serving - wanted, wanted - self.serving
            if not lost and not gained:
                return
            self.serving = wanted
            for shard in sorted(gained):
                self._wakeups[shard].clear()
                self._start_claiming(shard)
            if gained:
                metrics.SHARDS_GAINED.inc(len(gained))
                log.info(
                    "engine %s took on shards %s",
                    self.config.engine_id,
                    ",".join(map(str, sorted(gained))),
                )
            if lost:
                metrics.SHARDS_LOST.inc(len(lost))
                await self._withdraw(lost)
            metrics.SERVING.set(len(wanted))

    async def _withdraw(self, lost: frozenset[int]) -> None:
        loops = [self._claimers.pop(s) for s in lost if s in self._claimers]
        for shard in lost:
            self._wakeups[shard].set()
        if loops:
            _, pending = await asyncio.wait(loops, timeout=10.0)
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # The lost shards' entries out of the wheel (the rest go back in) and out of the lanes.
        # Items (entries and bundles) are one shard's each: a claim batch is one shard's.
        kept: list[bytes] = []
        gone: list[bytes] = []
        for item in self.wheel.drain():
            (gone if wire.entry_shard(item) in lost else kept).append(item)
        self._waiting = sum(map(wire.runs_in, kept))
        if kept:
            self._driver.insert_many(kept)
        for lane in list(self._lanes):
            q = self._lanes[lane]
            if not any(wire.entry_shard(e) in lost for e in q):
                continue
            stay = deque(e for e in q if wire.entry_shard(e) not in lost)
            leaving = [e for e in q if wire.entry_shard(e) in lost]
            gone.extend(leaving)
            self._fired_count -= sum(map(wire.runs_in, leaving))
            if stay:
                self._lanes[lane] = stay
            else:
                del self._lanes[lane]
                self._ring.remove(lane)
        metrics.WHEEL_SIZE.set(self._waiting)
        released = 0
        if gone:
            released = await self._release([wire.unpack_entry(e) for i in gone for e in wire.entries_in(i)])
            metrics.RELEASED.inc(released)
        log.info(
            "engine %s handed over shards %s: gave back %d unfired claims",
            self.config.engine_id,
            ",".join(map(str, sorted(lost))),
            released,
        )

    async def _release(self, items: Sequence[Leased]) -> int:
        released = 0
        for i in range(0, len(items), 1000):
            released += await asyncio.shield(self._store.release_claims(items[i : i + 1000]))
        return released

    def _spawn(
        self,
        body: Callable[[], Awaitable[None]],
        name: str,
        *,
        keep_going: Callable[[], bool] = lambda: True,
    ) -> asyncio.Task[None]:
        """A loop of the engine under the process's supervisor: restarted with backoff if it
        fails (its state is the engine's, so a restart loses nothing), until the engine stops."""
        task = SUPERVISOR.spawn(name, body, keep_going=lambda: not self._stopping.is_set() and keep_going())
        task.add_done_callback(self._task_done)
        self._tasks.append(task)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._stopping.is_set():
            return
        exc = task.exception()
        if exc is not None:
            # A dead side task must stop the process loudly, not leave a half-engine running.
            log.critical("engine task %s died", task.get_name(), exc_info=exc)
            self.crashed = exc

    def _driver_crashed(self, exc: BaseException) -> None:
        log.critical("the timer wheel driver died", exc_info=exc)
        self.crashed = exc

    async def stop(self) -> None:
        """Stop claiming, give back what has not fired, let the fencer finish its batch."""
        self._stopping.set()
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
        # Claim loops and the janitor are not cancelled mid-statement: a claim that committed
        # must reach the wheel so it can be released below. They see the stop at their next
        # check; wake them all, give them a bounded time, and only then cancel.
        for event in self._wakeups.values():
            event.set()
        others = [t for t in self._tasks if t is not self._fencer]
        if others:
            _, pending = await asyncio.wait(others, timeout=10.0)
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._driver.stop()
        self._fire_event.set()
        if self._fencer is not None:
            await self._fencer
        items = self.wheel.drain() + [e for lane in self._lanes.values() for e in lane]
        self._lanes.clear()
        self._ring.clear()
        self._fired_count = 0
        self._waiting = 0
        metrics.WHEEL_SIZE.set(0)
        waiting = [e for item in items for e in wire.entries_in(item)]
        if waiting:
            released = await self._release([wire.unpack_entry(e) for e in waiting])
            metrics.RELEASED.inc(released)
            log.info("engine %s released %d unfired claims", self.config.engine_id, released)

    # ------------------------------------------------------------------ claiming

    async def _listen(self) -> None:
        """LISTEN on every database holding our shards: a job due inside the lookahead reaches
        the wheel within milliseconds of its commit, not at the next poll."""
        self._listener = await self._store.listen_due(self.config.shards, self._on_due)

    def _on_due(self, shard: int) -> None:
        event = self._wakeups.get(shard)
        if event is not None:
            event.set()

    async def _claim_loop(self, shard: int) -> None:
        cfg = self.config
        wake = self._wakeups[shard]
        next_overlap_scan = 0.0
        next_pause_scan = 0.0
        answer_lost = False
        failing = False
        backoff = Backoff(cfg.poll_interval_s, max(cfg.poll_interval_s, 2.0))
        while not self._stopping.is_set() and shard in self.serving:
            wake.clear()
            if not failing and time.monotonic() >= next_overlap_scan:
                next_overlap_scan = time.monotonic() + cfg.overlap_interval_s
                await self._split_overlapping(shard)
            if not failing and time.monotonic() >= next_pause_scan:
                next_pause_scan = time.monotonic() + cfg.pause_end_interval_s
                await self._end_pauses(shard)
            try:
                if answer_lost:
                    rows = await self._take_back(shard)
                    answer_lost = False
                else:
                    rows = await self._store.claim_due(
                        shard,
                        cfg.engine_id,
                        lookahead_s=cfg.lookahead_s,
                        lease_s=cfg.lease_s + self._claim_slack_s(),
                        limit=cfg.claim_batch,
                    )
            except Exception as exc:
                rows = []
                answer_lost = True
                if is_transient(exc):
                    # Its database is away or gave way: one line when it starts, retried with a
                    # backoff of its own (the other shards' loops are not held back).
                    STORAGE_RETRIES.labels("duetime-claim", error_kind(exc)).inc()
                    if not failing:
                        log.warning(
                            "claims on shard %d fail (%s: %s); retrying until they work",
                            shard,
                            type(exc).__name__,
                            exc,
                        )
                    failing = True
                    await asyncio.sleep(backoff.next())
                else:
                    log.exception("claim on shard %d failed; retrying", shard)
                    await asyncio.sleep(cfg.poll_interval_s)
                continue
            if failing:
                failing = False
                backoff.reset()
                log.info("claims on shard %d work again", shard)
            if rows:
                metrics.CLAIM_BATCHES.labels(str(shard)).inc()
                metrics.CLAIMS.labels(str(shard)).inc(len(rows))
                try:
                    await self._admit(rows)
                except Exception:
                    # Some rows may be in the wheel, the rest (a skip write that failed) are
                    # claims held nowhere: take them all back, as after a lost answer.
                    log.exception("admitting %d claims on shard %d failed; taking back", len(rows), shard)
                    answer_lost = True
                    await asyncio.sleep(cfg.poll_interval_s)
                    continue
                if len(rows) == cfg.claim_batch:
                    continue  # more may be due: drain before sleeping
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=cfg.poll_interval_s)

    async def _take_back(self, shard: int) -> list[Claim]:
        """After a claim that failed: take back every claim this engine holds on ``shard``.

        A claim can commit and its answer still be lost (the database restarting between the
        commit and the reply). Those rows are this engine's but not in its wheel, and the
        janitor's keep-alive of this engine's waiting claims would renew their leases for good:
        never fired, never rescued. Taking back gives each of the shard's claimed rows a new
        token and a new entry; the entries already in the wheel for the same rows then fail
        their fence (old token) and drop out, so each run still starts once."""
        retaken = await self._store.retake_claims(
            self.config.engine_id, [shard], lease_s=self.config.lease_s + self._claim_slack_s()
        )
        if retaken:
            metrics.RETAKEN.inc(len(retaken))
            log.info(
                "engine %s took back %d claims on shard %d after a failed claim",
                self.config.engine_id,
                len(retaken),
                shard,
            )
        return retaken

    async def _split_overlapping(self, shard: int) -> None:
        """Before claiming: runs still in flight whose next occurrence is about to come due hand
        it to a row of its own (overlap=allow), which the claim right after picks up."""
        try:
            while (
                n := await self._store.split_overlapping(shard, horizon_s=self.config.overlap_horizon_s)
            ) > 0:
                metrics.OVERLAP_SPLITS.inc(n)
                if n < 500:
                    break
        except Exception:
            log.exception("overlap scan on shard %d failed; the next round retries", shard)

    async def _end_pauses(self, shard: int) -> None:
        """Before claiming: jobs whose pause ended (``until``) are resumed, once whichever engines
        look, and the claim right after takes those that are due (their misfire policy applies)."""
        try:
            while (n := await self._store.end_pauses(shard, limit=500)) > 0:
                metrics.PAUSES_ENDED.inc(n)
                if n < 500:
                    break
        except Exception:
            log.exception("the look for ended pauses on shard %d failed; the next round retries", shard)

    def _claim_slack_s(self) -> float:
        """How much longer than a lease a claim made now should last: the time the fencer's
        statements need for what this engine already holds (waiting in the wheel or fired), at
        most three leases.

        A burst's later claims then do not lapse while the earlier ones are fenced, without a
        write per row to keep them (_keep_waiting_claims covers what outlasts the estimate). The
        rate is the fencer's capacity -- entries per second spent in fence statements, 2,000/s
        before the first one -- not its throughput, which is low whenever little is due: in
        steady operation the slack stays near zero and a dead engine's claims reach the janitor
        as soon as before; after a burst's claims, at most three leases later."""
        held = self.held_runs
        if not held:
            return 0.0
        rate = self.fence_progress / self.fence_time_s if self.fence_time_s > 0 else 2000.0
        return min(held / max(rate, 1.0), 3 * self.config.lease_s)

    async def _admit(self, rows: Sequence[Claim]) -> None:
        """Claimed rows into the wheel; overdue ones first through the misfire policy."""
        batch: list[bytes] = []
        skips: list[Skip] = []
        for row in rows:
            scheduled_for, due_ms = row.scheduled_for, wire.to_ms(row.due_at)
            if row.misfire_spec is not None:
                spec = row.misfire_spec
                decision = decide(
                    spec,
                    row.scheduled_for,
                    row.db_now,
                    due_at=row.due_at,
                    deferred=row.due_at > jitter.due_at(row.job_id, row.scheduled_for, spec),
                    spread=jitter.spread(row.job_id, spec),
                    run_all_cap=self.config.run_all_cap,
                    record_cap=self.config.record_cap,
                )
                if row.due_at < row.db_now - timedelta(seconds=spec.misfire_grace_s):
                    metrics.MISFIRES.labels(spec.misfire.value).inc()
                if isinstance(decision, CatchUp):
                    # The row moves on to its first occurrence not yet due; the backlog starts
                    # now in rows of its own (together, or back to back), claimed right after.
                    metrics.CATCH_UP_RUNS.inc(len(decision.runs))
                    metrics.SKIPPED.inc(len(decision.skipped) + decision.unrecorded)
                    skips.append(
                        Skip(
                            row.job_id,
                            row.shard,
                            row.lease_token,
                            decision.skipped,
                            decision.next_scheduled_for,
                            catch_up=decision.runs,
                            chained=decision.chained,
                        )
                    )
                    continue
                if isinstance(decision, SkipTo):
                    metrics.SKIPPED.inc(len(decision.skipped) + decision.unrecorded)
                    skips.append(
                        Skip(
                            row.job_id,
                            row.shard,
                            row.lease_token,
                            decision.skipped,
                            decision.next_scheduled_for,
                        )
                    )
                    continue
                assert isinstance(decision, FireNow)
                scheduled_for = decision.scheduled_for
                due_ms = wire.to_ms(row.db_now)
            batch.append(
                wire.pack_entry(
                    due_ms,
                    row.job_id,
                    row.lease_token,
                    scheduled_for,
                    row.shard,
                    wire.owner_lane(row.owner),
                )
            )
        if batch:
            self._waiting += len(batch)
            # wakes the driver only if something is earlier
            self._driver.insert_many(wire.bundle(batch))
            metrics.WHEEL_SIZE.set(self._waiting)
        if skips:
            await self._store.skip_missed(skips)
            for shard in {s.shard for s in skips}:
                self._wakeups[shard].set()

    # ------------------------------------------------------------------ firing and fencing

    def _on_fire(self, fired: list[bytes]) -> None:
        now_ms = self._clock.now_ms()
        due_ms, runs_in = wire.entry_due_ms, wire.runs_in
        late: list[int] = []
        for item in fired:
            late.extend([now_ms - due_ms(item)] * runs_in(item))
        metrics.observe_many(metrics.FIRE_LATENESS, [max(ms, 0) / 1000.0 for ms in late])
        if self.lateness_probe is not None:
            self.lateness_probe(late)
        metrics.FIRES.inc(len(late))
        self._queue_fired(fired)
        self._waiting -= len(late)
        metrics.WHEEL_SIZE.set(self._waiting)
        self._fire_event.set()

    def _lane_of(self, entry: bytes) -> int:
        """An item's fence lane: its owner's lane on its shard's database. Lanes are per database
        so that the fencer can pass over a database in trouble and fence the others' runs."""
        return wire.entry_lane(entry) << 8 | self._store.database_of(wire.entry_shard(entry))

    def _queue_fired(self, fired: Sequence[bytes], *, front: bool = False) -> None:
        """Fired items (entries and bundles) into their owner lanes, at the back (or, for a batch
        the fence gave back, at the front, in order)."""
        lanes, ring, lane_of = self._lanes, self._ring, self._lane_of
        runs = 0
        for entry in reversed(fired) if front else fired:
            runs += wire.runs_in(entry)
            lane = lane_of(entry)
            q = lanes.get(lane)
            if q is None:
                q = lanes[lane] = deque()
                ring.append(lane)
            if front:
                q.appendleft(entry)
            else:
                q.append(entry)
        self._fired_count += runs

    def _take_fair(self, limit: int, blocked: frozenset[int] = frozenset()) -> list[bytes]:
        """Up to ``limit`` fired entries, the owner lanes taking equal turns: with one lane this
        is plain FIFO; with owner A's million and owner B's thousand both due, every batch is
        half B's until B's are gone. Lanes of the databases in ``blocked`` (waiting out a failed
        fence) are passed over."""
        out: list[bytes] = []
        lanes, ring = self._lanes, self._ring
        open_lanes = len(ring)
        if blocked:
            open_lanes = sum(1 for lane in ring if lane & 0xFF not in blocked)
        while open_lanes and len(out) < limit:
            quota = max(1, (limit - len(out)) // open_lanes)  # one round: every lane one turn
            for _ in range(len(ring)):
                if len(out) >= limit:
                    break
                lane = ring.popleft()
                if blocked and lane & 0xFF in blocked:
                    ring.append(lane)
                    continue
                q = lanes[lane]
                want = min(quota, limit - len(out))
                while want and q:
                    head, rest = wire.take_from(q[0], want)
                    if rest is None:
                        q.popleft()
                    else:
                        q[0] = rest
                    out.extend(head)
                    want -= len(head)
                if q:
                    ring.append(lane)
                else:
                    del lanes[lane]
                    open_lanes -= 1
        self._fired_count -= len(out)
        return out

    async def _fence_loop(self) -> None:
        """Fired entries → one fence statement per database per batch → the run queue (blocking
        when full).

        A database whose fence failed (down, or giving way) is waited out with a backoff of its
        own: its entries stay at the front of their lanes and the fencer fences the other
        databases' meanwhile, so a primary's outage holds back only its own shards' runs."""
        cfg = self.config
        while True:
            now = time.monotonic()
            blocked = frozenset(db for db, at in self._db_retry_at.items() if at > now)
            if not self._fired_count or (blocked and not self._any_open(blocked)):
                if self._stopping.is_set():
                    return
                self._fire_event.clear()
                # Until the first blocked database is due again (only blocked ones: a database
                # whose retry time has passed is open, and waiting on it would spin).
                wait = min(self._db_retry_at[db] for db in blocked) - now if blocked else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._fire_event.wait(), timeout=wait)
                continue
            if self._stopping.is_set():
                return  # what is left is released by stop()
            raw = self._take_fair(cfg.fence_batch, blocked)
            if not raw:
                continue
            parts: dict[int, list[bytes]] = {}
            if self._one_database:
                parts[self._lane_of(raw[0]) & 0xFF] = raw
            else:
                for entry in raw:
                    parts.setdefault(self._lane_of(entry) & 0xFF, []).append(entry)
            del raw
            if len(parts) == 1:
                [(db, part)] = parts.items()
                await self._fence_part(db, part)
            else:
                await asyncio.gather(*(self._fence_part(db, part) for db, part in parts.items()))
            del parts

    def _any_open(self, blocked: frozenset[int]) -> bool:
        return any(lane & 0xFF not in blocked for lane in self._ring)

    async def _fence_part(self, db: int, raw: list[bytes]) -> None:
        cfg = self.config
        batch = [wire.unpack_entry(e) for e in raw]
        started = time.perf_counter()
        try:
            fenced = await self._store.fence_runs(batch, lease_s=self._keeper.fence_lease_s or cfg.lease_s)
        except Exception as exc:
            backoff = self._db_backoff.setdefault(db, Backoff(0.2, 5.0))
            delay = backoff.next()
            self._db_retry_at[db] = time.monotonic() + delay
            STORAGE_RETRIES.labels("duetime-fencer", error_kind(exc)).inc()
            log.warning(
                "fencing %d runs on database %d failed (%s: %s); retrying it in %.1f s, the other "
                "databases' runs go on",
                len(batch),
                db,
                type(exc).__name__,
                exc,
                delay,
            )
            self._queue_fired(raw, front=True)
            self._fire_event.set()
            return
        if db in self._db_retry_at:
            del self._db_retry_at[db]
            self._db_backoff[db].reset()
        self.fence_time_s += time.perf_counter() - started
        self.fence_statements += 1
        self.fence_progress += len(batch)
        metrics.FENCE_SECONDS.observe(time.perf_counter() - started)
        metrics.FENCED.inc(len(fenced))
        metrics.FENCE_REJECTED.inc(len(batch) - len(fenced))
        await self._hand_over(fenced)
        # Not kept while waiting for the next fire: the batch's runs are the queue's and the
        # workers' now, and are freed once recorded (see WorkerPool._work).
        del raw, batch, fenced

    async def _hand_over(self, fenced: list[FencedRun]) -> None:
        """Track each fenced run's lease and put it in the run queue (waiting while it is full).

        Every lease is kept from the moment its fence returned, not from its put: a put may wait
        for room in the run queue, and a lease must not go unkept while it waits."""
        for run in fenced:
            self._keeper.track(run)
        for run in fenced:
            await self._queue.put(run)

    # ------------------------------------------------------------------ janitor

    async def _janitor_loop(self) -> None:
        cfg = self.config
        rounds = 0
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=cfg.janitor_interval_s)
                return
            # Shard by shard: a shard whose database fails is retried at the next round, and the
            # other shards (on healthy primaries) are kept and rescued meanwhile.
            failed: dict[str, str] = {}
            if self._listener is not None:
                try:
                    await self._listener.keep()
                except Exception as exc:
                    failed["listening"] = f"{type(exc).__name__}: {exc}"
            try:
                await self._keep_waiting_claims(failed)
            except Exception as exc:
                failed["keeping claims"] = f"{type(exc).__name__}: {exc}"
            for shard in sorted(self.serving):
                try:
                    await self._janitor_shard(shard)
                except Exception as exc:
                    failed[f"shard {shard}"] = f"{type(exc).__name__}: {exc}"
            rounds += 1
            if rounds % 720 == 1:
                try:
                    await self._store.purge_idempotency_keys(cfg.idempotency_ttl_s)
                except Exception as exc:
                    failed["idempotency keys"] = f"{type(exc).__name__}: {exc}"
                    rounds = 0  # the next round tries again
            if failed:
                causes = sorted(set(failed.values()))
                log.warning(
                    "janitor round failed for %s (%s); the next one retries",
                    ", ".join(failed),
                    "; ".join(causes)[:500],
                )

    async def _janitor_shard(self, shard: int) -> None:
        while True:
            stats = await self._store.rescue_expired(shard, limit=500)
            if stats.applied:
                metrics.JANITOR_RESCUES.inc(stats.applied)
                self._wakeups[shard].set()
            if stats.applied < 500:
                break
        if await self._store.release_stalled_backfills(shard):
            self._wakeups[shard].set()
        await self._store.complete_drained_jobs(shard)

    async def _keep_waiting_claims(self, failed: dict[str, str] | None = None) -> None:
        """Keep the claims this engine still holds from lapsing while a burst drains.

        A claim's lease runs until its due instant plus ``lease_s``. When more runs are due at one
        instant than the fencer gets through within a lease (a million at midnight), the rest
        lapsed while still waiting in this engine's lanes: the janitor released them, the claim
        loops re-claimed them under new tokens and appended the new entries behind the old ones,
        whose fences were then rejected. Once the backlog ahead of an entry took longer than a
        lease to fence, every entry lapsed before the fencer reached it: the burst was claimed,
        fired and fenced over and over and nothing started (the million-run stall).

        So each janitor round first extends this engine's own claims that would lapse within half
        a lease, by a lease plus the time the fencer needs for the backlog: one write per row per
        extension, and only for rows that outlast their lease. Only while this engine is healthy
        and draining -- not once it has crashed or is stopping, nor when the fencer has taken
        nothing off a non-empty backlog for a whole lease: a stuck engine lets its claims lapse,
        and the janitor (its own or another engine's) rescues them. The fencing token is not
        touched: a fence still has to match the token the row was claimed under.
        """
        cfg = self.config
        now = time.monotonic()
        progress = self.fence_progress
        last, self._kept_at = self._kept_at, (now, progress)
        if last is not None and progress > last[1] and now > last[0]:
            rate = (progress - last[1]) / (now - last[0])
            self._fence_rate = rate if self._fence_rate is None else 0.5 * (self._fence_rate + rate)
        if progress != self._progress_seen or not self._fired_count:
            self._progress_seen, self._progress_at = progress, now
        if self.crashed is not None or self._stopping.is_set():
            return
        backlog = self._fired_count
        if now - self._progress_at > cfg.lease_s:
            log.warning(
                "the fencer took none of %d fired runs in %.0f s; their claims are left to lapse",
                backlog,
                now - self._progress_at,
            )
            return
        backlog_s = 0.0
        if backlog and self._fence_rate:
            backlog_s = min(backlog / self._fence_rate, 10 * cfg.lease_s)
        within_s = max(cfg.lease_s / 2, 2 * cfg.janitor_interval_s)
        extend_s = cfg.lease_s + backlog_s
        kept = 0
        for shard in sorted(self.serving):
            try:
                for _ in range(20):  # at most 100,000 rows per shard and round
                    n = await self._store.keep_waiting_claims(
                        shard, cfg.engine_id, within_s=within_s, extend_s=extend_s, limit=5000
                    )
                    kept += n
                    if n < 5000:
                        break
            except Exception as exc:
                if failed is None:
                    raise
                failed[f"keeping claims on shard {shard}"] = f"{type(exc).__name__}: {exc}"
        if kept:
            metrics.CLAIMS_KEPT.inc(kept)
