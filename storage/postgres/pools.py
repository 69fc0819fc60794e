"""The store's databases: one asyncpg pool per distinct database in the shard map, found by
shard, and the translation of database failures into ``core.errors`` at the seam.

Every part of ``PostgresStore`` builds on ``StoreBase``: the shard map, the pools and the hints
are the only state the parts share.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, ParamSpec, Protocol, TypeVar

import asyncpg

from duetime.core.errors import Contended, StorageUnavailable
from duetime.storage.dbclock import DB_CLOCK
from duetime.storage.postgres.hints import Hints
from duetime.storage.postgres.sessions import SessionBounds
from duetime.storage.shardmap import ShardMap

# SQLSTATE classes that mean "the database is not there or will not take writes now".
_UNAVAILABLE_STATES = ("08", "57", "53", "25006")
# A deadlock, a serialization failure, or a lock not had within ``lock_timeout``: a healthy
# database chose this transaction to give way. It is retried inside the store (``retried``), and
# never reported as an outage.
_CONTENTION_STATES = ("40001", "40P01", "55P03")
CONTENTION_TRIES = 5

T = TypeVar("T")
log = logging.getLogger(__name__)


def is_contention(exc: BaseException) -> bool:
    return (
        isinstance(exc, asyncpg.PostgresError) and (getattr(exc, "sqlstate", "") or "") in _CONTENTION_STATES
    )


async def retried(op: Callable[[], Awaitable[T]], *, tries: int = CONTENTION_TRIES) -> T:
    """``op()``, run again (with a short random pause) when PostgreSQL aborted it as a deadlock or
    a serialization failure; ``op`` must be a whole transaction (or one statement) so a retry
    starts clean. After ``tries`` the error goes to ``translated`` (409 ``concurrent_update``)."""
    for attempt in range(1, tries + 1):
        try:
            return await op()
        except (asyncpg.PostgresError, Contended) as exc:
            # Contended is the same failure after ``translated`` saw it inside ``op``.
            if not (isinstance(exc, Contended) or is_contention(exc)) or attempt == tries:
                raise
            log.debug("retrying after %s (attempt %d of %d)", type(exc).__name__, attempt, tries)
            await asyncio.sleep(random.uniform(0.0, 0.005 * 2**attempt))
    raise AssertionError("unreachable")


P = ParamSpec("P")


def contention_retried(method: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """An owner action, run again whole when PostgreSQL gave it up as a deadlock (``retried``):
    the action opens its own transaction and computes everything from the row it locks."""

    @functools.wraps(method)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        return await retried(lambda: method(*args, **kwargs))

    return wrapper


def utcnow() -> datetime:
    """The store's "now" for what it computes itself (retry times, windows, owner actions): the
    database's clock as this process measured it (storage.dbclock), not this host's."""
    return DB_CLOCK.now()


def _is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, asyncpg.exceptions.DataError):
        return False  # a value we failed to refuse earlier: a bug or bad input, not an outage
    if isinstance(exc, (OSError, asyncpg.exceptions.InterfaceError, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        state = getattr(exc, "sqlstate", "") or ""
        return state.startswith(_UNAVAILABLE_STATES)
    return False


@asynccontextmanager
async def translated() -> AsyncIterator[None]:
    """Database failures become StorageUnavailable at the seam; nothing was acknowledged."""
    try:
        yield
    except (asyncpg.PostgresError, OSError, asyncpg.exceptions.InterfaceError, TimeoutError) as exc:
        if is_contention(exc):
            raise Contended(
                "another change to this job was being written at the same moment and this one "
                "gave way; nothing was changed, send it again"
            ) from exc
        if _is_unavailable(exc):
            raise StorageUnavailable(
                "the job database is unavailable right now; nothing was changed, try again"
            ) from exc
        raise


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "jsonb",
        encoder=lambda v: json.dumps(v, separators=(",", ":")),
        decoder=json.loads,
        schema="pg_catalog",
    )


async def _no_reset(conn: asyncpg.Connection) -> None:
    """We keep no session state (no LISTEN, advisory locks or SET on pooled connections), so the
    default reset query on every release is a wasted round trip per statement."""


async def open_pools(
    shard_map: ShardMap, *, pool_size: int, bounds: SessionBounds | None = None
) -> dict[str, asyncpg.Pool]:
    """One pool per database of the shard map; none is left open when one of them fails."""
    bounds = bounds or SessionBounds()
    pools: dict[str, asyncpg.Pool] = {}
    try:
        async with translated():
            for dsn in shard_map.databases():
                pools[dsn] = await asyncpg.create_pool(
                    dsn,
                    min_size=1,
                    max_size=pool_size,
                    init=_init_connection,
                    max_inactive_connection_lifetime=300,
                    reset=_no_reset,
                    timeout=bounds.connect_timeout_s,
                    command_timeout=bounds.command_timeout_s,
                    server_settings=bounds.server_settings(),
                )
    except BaseException:
        for pool in pools.values():
            await pool.close()
        raise
    return pools


@functools.lru_cache(maxsize=16)
def _database_index(shard_map: ShardMap) -> tuple[int, ...]:
    """Per shard, the index of its database: asked for every report of every batch, made once."""
    order = list(shard_map.databases())
    return tuple(order.index(shard_map.dsn_for(shard)) for shard in range(len(shard_map.dsns)))


class _OnShard(Protocol):
    @property
    def shard(self) -> int: ...


_Item = TypeVar("_Item", bound=_OnShard)


class StoreBase:
    """What the parts of the store share: the shard map, a pool per database, the hints."""

    shard_map: ShardMap
    bounds: SessionBounds
    _pools: dict[str, asyncpg.Pool]
    _hints: Hints

    def pool_for_shard(self, shard: int) -> asyncpg.Pool:
        return self._pools[self.shard_map.dsn_for(shard)]

    def pool_for_dsn(self, dsn: str) -> asyncpg.Pool:
        return self._pools[dsn]

    @property
    def home_pool(self) -> asyncpg.Pool:
        return self._pools[self.shard_map.home]

    def by_db(self, items: Iterable[_Item]) -> dict[str, list[_Item]]:
        """A batch split by the database that holds each item's shard (one statement each)."""
        grouped: dict[str, list[_Item]] = {}
        for item in items:
            grouped.setdefault(self.shard_map.dsn_for(item.shard), []).append(item)
        return grouped

    def database_of(self, shard: int) -> int:
        """The index of ``shard``'s database among the shard map's distinct databases."""
        return _database_index(self.shard_map)[shard]

    def pools(self) -> Iterable[asyncpg.Pool]:
        """Every database once, for the statements that read or sweep all of them."""
        return self._pools.values()
