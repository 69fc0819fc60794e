"""NOTIFY hints: wake the engines of a shard when a row there becomes due soon.

A hint, sent after commit and coalesced: one NOTIFY statement per database carries every shard
that became due-soon since the last one. A lost hint costs at most one poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta

import asyncpg

from duetime.core.lifecycle import RowPlan
from duetime.core.model import JobState
from duetime.storage.postgres.sessions import SessionBounds, connect
from duetime.storage.queries import Q
from duetime.storage.shardmap import ShardMap

log = logging.getLogger("duetime.storage")

NOTIFY_CHANNEL = "duetime_due"


class Hints:
    """The pending hints of one store and the one task that sends them."""

    def __init__(self, shard_map: ShardMap, pools: dict[str, asyncpg.Pool], horizon_s: float) -> None:
        self._shard_map = shard_map
        self._pools = pools
        self._notify_horizon = timedelta(seconds=horizon_s)
        self._notify_pending: set[int] = set()
        self._notify_task: asyncio.Task[None] | None = None

    def due_soon(self, shard: int, plan: RowPlan, now: datetime) -> None:
        """Wake the engines of this shard when the row is due inside their lookahead.

        A hint, sent after commit and coalesced: one NOTIFY statement carries every shard that
        became due-soon since the last one, so registering thousands of jobs a second does not
        put a NOTIFY (and its commit-time queue lock) in every transaction. A lost hint costs at
        most one poll interval.
        """
        if (
            plan.state == JobState.SCHEDULED
            and plan.next_run_at is not None
            and plan.next_run_at <= now + self._notify_horizon
        ):
            self._notify_pending.add(shard)
            if self._notify_task is None or self._notify_task.done():
                self._notify_task = asyncio.get_running_loop().create_task(self._send_notifies())

    def wake(self, shards: Iterable[int]) -> None:
        """Wake the engines of these shards: a run there became due now."""
        for shard in shards:
            self._notify_pending.add(shard)
        if self._notify_pending and (self._notify_task is None or self._notify_task.done()):
            self._notify_task = asyncio.get_running_loop().create_task(self._send_notifies())

    async def _send_notifies(self) -> None:
        while self._notify_pending:
            pending, self._notify_pending = self._notify_pending, set()
            by_db: dict[str, list[str]] = {}
            for shard in pending:
                by_db.setdefault(self._shard_map.dsn_for(shard), []).append(str(shard))
            for dsn, shards in by_db.items():
                try:
                    await self._pools[dsn].execute(Q["notify_due"], shards)
                except Exception as exc:  # a hint; the poll interval covers a lost one
                    log.debug("NOTIFY failed: %s", exc)

    async def close(self) -> None:
        """Wait for the hints already taken to be sent."""
        if self._notify_task is not None:
            await self._notify_task


class DueConnections:
    """The LISTEN connections of one engine, one per database holding its shards.

    A connection is lost with its database (a restart, a failover, a network cut) and LISTEN does
    not survive that: ``keep`` (called by the engine's janitor every round) listens again on the
    databases whose connection is gone, and wakes their shards' claim loops, since hints sent
    while nobody listened are lost. Until then the poll interval covers them."""

    def __init__(
        self,
        shard_map: ShardMap,
        shards: Sequence[int],
        wake: Callable[[int], None],
        bounds: SessionBounds,
    ) -> None:
        self._wake = wake
        self._bounds = bounds
        self._held = {
            dsn: [s for s in held if s in set(shards)]
            for dsn, held in shard_map.databases().items()
            if set(held) & set(shards)
        }
        self._conns: dict[str, asyncpg.Connection] = {}
        self._tried: set[str] = set()
        self.relistened = 0

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            shard = int(payload)
        except ValueError:
            return
        self._wake(shard)

    async def keep(self) -> None:
        """LISTEN again where the connection was lost (or never made)."""
        for dsn, shards in self._held.items():
            conn = self._conns.get(dsn)
            if conn is not None and not conn.is_closed():
                continue
            first = dsn not in self._tried  # the listen at start: nothing was missed yet
            try:
                conn = await connect(dsn, self._bounds)
                await conn.add_listener(NOTIFY_CHANNEL, self._on_notify)
            except (OSError, asyncpg.PostgresError, asyncpg.exceptions.InterfaceError, TimeoutError):
                if dsn not in self._tried:
                    log.warning("LISTEN on %s failed; relying on polling until it works", dsn.split("@")[-1])
                self._tried.add(dsn)
                continue
            self._conns[dsn] = conn
            if not first:
                self.relistened += 1
                log.info("LISTEN on %s again", dsn.split("@")[-1])
                for shard in shards:
                    self._wake(shard)
            self._tried.add(dsn)

    async def close(self) -> None:
        for conn in self._conns.values():
            with contextlib.suppress(Exception):
                await conn.close()
        self._conns.clear()


async def listen_due(
    shard_map: ShardMap, shards: Sequence[int], wake: Callable[[int], None], bounds: SessionBounds
) -> DueConnections:
    """LISTEN on every database holding one of ``shards``: a job due inside the lookahead reaches
    the wheel within milliseconds of its commit, not at the next poll. A database that cannot be
    listened on is logged and left to polling (and to ``keep``)."""
    listener = DueConnections(shard_map, shards, wake, bounds)
    await listener.keep()
    return listener
