"""Membership of the engines in PostgreSQL: who is in the cluster, what each may serve, and whether
its heartbeat is recent enough for it to count as live.

It lives on the **home database** (shard 0's, where owners and API keys are): one place every
process already reaches, even when the shards are spread over several primaries, so every engine
reads the same membership and deals the same way. "Live" is decided by the database's clock
(``now() - heartbeat_at`` against the member's own ``DUETIME_LEASE_S``), never by an engine's.

``MembershipPart`` is the ``Membership`` port of ``PostgresStore`` (storage/ports.py has the
records it reads and writes); ``PostgresEngineIdLock`` is its ``EngineIdLock``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import asyncpg

from duetime.core.errors import DuetimeError, StorageUnavailable
from duetime.storage.ports import EngineRecord, Registration
from duetime.storage.postgres.pools import StoreBase
from duetime.storage.postgres.sessions import SessionBounds, connect
from duetime.storage.queries import Q


class MembershipMissing(DuetimeError):
    """The home database has no membership table: the schema predates it."""

    code = "schema_outdated"


@asynccontextmanager
async def _translated() -> AsyncIterator[None]:
    try:
        yield
    except asyncpg.UndefinedTableError as exc:
        raise MembershipMissing(
            "the database has no engine membership table; run `duetime migrate` with this release"
        ) from exc
    except (OSError, asyncpg.exceptions.InterfaceError, TimeoutError) as exc:
        raise StorageUnavailable("the home database is unreachable; membership is unknown") from exc
    except asyncpg.PostgresError as exc:
        state = getattr(exc, "sqlstate", "") or ""
        if state.startswith(("08", "57", "53")):
            raise StorageUnavailable("the home database is unavailable; membership is unknown") from exc
        raise


def _shards(values: Iterable[int]) -> list[int]:
    return sorted(values)


class MembershipPart(StoreBase):
    """The membership statements of ``PostgresStore``, on the pool of the home database."""

    async def join_engine(self, reg: Registration) -> None:
        async with _translated():
            await self.home_pool.execute(
                Q["join_engine"],
                reg.engine_id,
                reg.host,
                _shards(reg.allowed),
                float(reg.lease_s),
                reg.replicas,
                reg.incarnation,
            )

    async def heartbeat_engine(self, reg: Registration, serving: Iterable[int]) -> bool:
        """Refresh this process's heartbeat; False when the row is not ours any more (another
        process registered under the same id, or the row was forgotten)."""
        async with _translated():
            row = await self.home_pool.fetchval(
                Q["heartbeat_engine"], reg.engine_id, reg.incarnation, _shards(serving)
            )
        return row is not None

    async def set_engine_serving(self, reg: Registration, serving: Iterable[int]) -> None:
        async with _translated():
            await self.home_pool.execute(
                Q["set_engine_serving"], reg.engine_id, reg.incarnation, _shards(serving)
            )

    async def leave_engine(self, reg: Registration) -> None:
        """A graceful stop: the others deal without this engine at their next heartbeat."""
        async with _translated():
            await self.home_pool.execute(Q["leave_engine"], reg.engine_id, reg.incarnation)

    async def list_engines(self) -> list[EngineRecord]:
        """Every member, live or dead, by id."""
        async with _translated():
            rows = await self.home_pool.fetch(Q["list_engines"])
        return [
            EngineRecord(
                engine_id=r["engine_id"],
                host=r["host"],
                allowed=frozenset(r["allowed"]),
                serving=frozenset(r["serving"]),
                lease_s=r["lease_s"],
                replicas=r["replicas"],
                incarnation=r["incarnation"],
                started_at=r["started_at"],
                heartbeat_at=r["heartbeat_at"],
                heartbeat_age_s=max(r["heartbeat_age_s"], 0.0),
                live=r["live"],
            )
            for r in rows
        ]

    async def forget_dead_engines(self, older_than_s: float) -> int:
        async with _translated():
            status: str = await self.home_pool.execute(Q["forget_dead_engines"], float(older_than_s))
        return int(status.rsplit(" ", 1)[-1])

    def engine_id_lock(self, engine_id: str) -> PostgresEngineIdLock:
        """The id's lock on a connection of its own to the home database, under the store's
        session bounds (its keepalives tell a dead holder's session from a frozen one's)."""
        return PostgresEngineIdLock(self.shard_map.home, self.bounds, engine_id)


class PostgresEngineIdLock:
    """The lock that makes an engine id one live process's (``lock_engine_id``): held on a
    connection of its own to the home database for as long as the process runs.

    ``acquire`` tries for a short while (a killed predecessor's session ends a moment after its
    death). ``held`` answers whether the lock is still this process's: after the connection was
    lost (the home database restarted, the network cut), it connects again and takes the lock
    again; False when another process has it meanwhile, and this one must stop."""

    def __init__(self, dsn: str, bounds: SessionBounds, engine_id: str) -> None:
        self._dsn = dsn
        self._bounds = bounds
        self._engine_id = engine_id
        self._conn: asyncpg.Connection | None = None

    async def _try(self) -> bool:
        async with _translated():
            if self._conn is None or self._conn.is_closed():
                self._conn = await connect(self._dsn, self._bounds)
            got = bool(await self._conn.fetchval(Q["lock_engine_id"], self._engine_id))
            if not got:
                await self._conn.close()
                self._conn = None
            return got

    async def acquire(self, within_s: float) -> bool:
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            if await self._try():
                return True
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.1)

    async def held(self) -> bool:
        """Whether this process still holds the id (raises StorageUnavailable while the home
        database cannot be asked)."""
        conn = self._conn
        if conn is not None and not conn.is_closed():
            try:
                async with _translated():
                    await conn.fetchval(Q["engine_id_lock_alive"])
                return True
            except StorageUnavailable:
                with contextlib.suppress(Exception):
                    await conn.close()
                self._conn = None
        return await self._try()

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(Exception):
                await conn.fetchval(Q["unlock_engine_id"], self._engine_id)
            with contextlib.suppress(Exception):
                await conn.close()
