"""The engine's side of membership: join, heartbeat, read who is live, deal, serve what is dealt.

Every ``interval_s`` (DUETIME_HEARTBEAT_S) the keeper refreshes this engine's heartbeat (with the
shards it serves), reads the whole membership, deals the 16 shards over the live members
(``core.dealing``: every engine gets the same answer) and hands this engine its part
(``Engine.serve``). A member whose heartbeat is older than its lease is dead, so a dead engine's
shards are dealt to the others within one lease plus one heartbeat, and claimed within one poll
after that; a graceful stop leaves the membership first, so its shards move at once.

No election: a moment in which two engines disagree (one has read the membership, the other not
yet) only means a shard is claimed by one engine more or less for a heartbeat, and claims are
``SKIP LOCKED`` under lease tokens either way.

It stands on the ``Membership`` port (storage/ports.py): ``PostgresStore`` in production, the
in-memory store in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import NoReturn

from duetime.core.dealing import Deal, deal
from duetime.core.errors import DuetimeError, is_transient
from duetime.core.ids import SHARDS
from duetime.engine.service import Engine
from duetime.runqueue import metrics
from duetime.storage.ports import EngineIdLock, EngineRecord, Membership, Registration
from duetime.supervisor import SUPERVISOR

log = logging.getLogger("duetime.membership")

# A member dead this long is forgotten; `duetime cluster status` lists the dead until then.
FORGET_AFTER_S = 3600.0


def format_shards(shards: Sequence[int] | frozenset[int]) -> str:
    return ",".join(map(str, sorted(shards))) or "none"


class EngineIdInUse(DuetimeError):
    """Another live process runs under this engine's DUETIME_ENGINE_ID: starting would expire its
    runs in flight (each would be called again while its first call is still running)."""

    code = "engine_id_in_use"


class EngineIdTakenOver(DuetimeError):
    """This process's engine id was registered by another process while this one was silent
    (frozen, cut off): the other has taken its runs back, so this one must stop, not fight."""

    code = "engine_id_taken_over"


class MembershipKeeper:
    def __init__(
        self,
        store: Membership,
        registration: Registration,
        *,
        interval_s: float,
        id_lock: EngineIdLock | None = None,
    ) -> None:
        self._store = store
        self._id_lock = id_lock
        self._id_claimed = False
        self.registration = registration
        self._interval_s = interval_s
        self._engine: Engine | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._reported: frozenset[int] | None = None
        self._warned_replicas: frozenset[int] = frozenset()
        self.last_deal: Deal | None = None
        self._beats = 0
        metrics.SHARD_REPLICAS.set(registration.replicas)

    @property
    def replicas(self) -> int:
        return self.registration.replicas

    async def join(self) -> frozenset[int]:
        """Register (a restart under the same id is the same member) and return the shards dealt
        to this engine by the membership as it is now.

        Refused (``EngineIdInUse``) while another live process holds the id: the id's lock
        (``EngineIdLock``) is held by a process for its whole life, frozen or not, and goes with
        it when it dies, so a restart after a crash goes on at once."""
        await self.claim_id()
        await self._store.join_engine(self.registration)
        # No ERROR for unserved shards yet: engines started together join one by one.
        mine = self._deal(await self._store.list_engines(), self.registration.allowed, report=False)
        self._reported = frozenset()
        return mine

    async def claim_id(self) -> None:
        """Take the engine id's lock, or raise ``EngineIdInUse``: before anything this process
        does as the id's holder (its restart steps expire the runs a dead predecessor had in
        flight). Once is enough; ``join`` calls it too."""
        if self._id_lock is None or self._id_claimed:
            return
        if not await self._id_lock.acquire(within_s=3.0):
            reg = self.registration
            holder = await self._holder()
            where = (
                f" on host {holder.host!r} (started {holder.started_at.isoformat()}, last heartbeat "
                f"{holder.heartbeat_age_s:.1f} s ago)"
                if holder is not None
                else ""
            )
            raise EngineIdInUse(
                f"engine id {reg.engine_id!r} is in use by a live engine{where}: two live engines "
                "under one id would expire each other's runs in flight. Give each engine its own "
                "DUETIME_ENGINE_ID, or stop the other one first"
            )
        self._id_claimed = True

    async def _holder(self) -> EngineRecord | None:
        rid = self.registration.engine_id
        return next((r for r in await self._store.list_engines() if r.engine_id == rid), None)

    async def start(self, engine: Engine) -> None:
        """Report what ``engine`` (started with the dealt shards) serves, then heartbeat."""
        self._engine = engine
        await self._store.set_engine_serving(self.registration, engine.serving)
        self._reported = engine.serving
        metrics.SERVING.set(len(engine.serving))
        self._task = SUPERVISOR.spawn("duetime-membership", self._run)

    async def stop(self) -> None:
        """Stop heartbeating and leave, so the others take this engine's shards at once."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._id_lock is not None:
            await self._id_lock.release()
        try:
            await self._store.leave_engine(self.registration)
        except Exception:
            log.warning(
                "could not leave the membership; the others deal without this engine once its "
                "heartbeat is a lease old"
            )

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self._interval_s)
                return
            try:
                await self.beat()
            except EngineIdTakenOver:
                return  # the engine is marked crashed: the process stops
            except Exception as exc:
                metrics.MEMBERSHIP_FAILURES.inc()
                if not is_transient(exc):
                    log.exception("membership heartbeat failed; serving the same shards until the next one")
                else:
                    log.warning(
                        "membership heartbeat failed (%s: %s); serving the same shards until the next one",
                        type(exc).__name__,
                        exc,
                    )

    async def beat(self) -> None:
        """One heartbeat: refresh, read, deal, serve."""
        assert self._engine is not None
        engine, reg = self._engine, self.registration
        serving = engine.serving
        if self._id_lock is not None and not await self._id_lock.held():
            # The lock's session was lost (the home database restarted, or this process was cut
            # off past the keepalives) and another process took the id meanwhile.
            self._taken_over(
                engine, "another process, while this one had lost its session with the home database"
            )
        if not await self._store.heartbeat_engine(reg, serving):
            holder = await self._holder()
            if holder is not None and holder.incarnation != reg.incarnation:
                # Another process registered under the id while this one was silent (frozen, cut
                # off): fighting over the row would expire its runs again under it.
                self._taken_over(
                    engine,
                    f"an engine on host {holder.host!r} (started {holder.started_at.isoformat()}) "
                    "while this process was silent",
                )
            log.warning("engine id %s was forgotten by the membership; registering again", reg.engine_id)
            await self._store.join_engine(reg)
            self._reported = frozenset()
        else:
            self._reported = serving
        self._beats += 1
        if self._beats % 100 == 1:
            await self._store.forget_dead_engines(FORGET_AFTER_S)
        mine = self._deal(await self._store.list_engines(), reg.allowed)
        await engine.serve(mine)
        if engine.serving != self._reported:
            await self._store.set_engine_serving(reg, engine.serving)
            self._reported = engine.serving

    def _taken_over(self, engine: Engine, by: str) -> NoReturn:
        """Another process holds this engine's id now and has taken back its claims and runs in
        flight: this process stops (the engine is marked crashed), the other goes on."""
        taken = EngineIdTakenOver(
            f"engine id {self.registration.engine_id!r} was taken over by {by}; stopping. Give each "
            "engine its own DUETIME_ENGINE_ID"
        )
        log.critical("%s", taken)
        engine.crashed = taken
        raise taken

    def _deal(
        self, records: list[EngineRecord], allowed: frozenset[int], *, report: bool = True
    ) -> frozenset[int]:
        reg = self.registration
        live = [r for r in records if r.live or r.engine_id == reg.engine_id]
        result = deal([r.member() for r in live], reg.replicas)
        self.last_deal = result
        mine = result.shards_of(reg.engine_id)
        metrics.LIVE_ENGINES.set(len(live))
        counts = [0] * SHARDS
        for r in live:
            served = (
                self._engine.serving
                if self._engine is not None and r.engine_id == reg.engine_id
                else r.serving
            )
            for s in served:
                counts[s] += 1
        for s in range(SHARDS):
            metrics.SHARD_ENGINES.labels(str(s)).set(counts[s])
        if result.unserved and report:
            log.error(
                "shards %s are served by no engine: no live engine may serve them (check --shards / "
                "DUETIME_SHARDS of the engines, or start one that may); their runs wait",
                format_shards(result.unserved),
            )
        other = frozenset(r.replicas for r in live if r.replicas != reg.replicas)
        if other and other != self._warned_replicas:
            log.warning(
                "live engines disagree on DUETIME_SHARD_REPLICAS (%d here, %s elsewhere): they deal "
                "differently until it is the same everywhere",
                reg.replicas,
                ",".join(map(str, sorted(other))),
            )
        self._warned_replicas = other
        return mine & allowed
