"""LISTEN for "a job of shard N became due inside the lookahead", so the engine can wake that
shard's claim loop within milliseconds of the commit instead of at its next poll.

The statement that NOTIFYs is in storage/sql/hints.sql (``pg_notify`` on ``NOTIFY_CHANNEL``,
the shard as payload). The listening connections live here, in storage, so the engine needs no
database driver: it hands over a callback and gets a listener to close.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable

import asyncpg

from duetime.storage.postgres.hints import NOTIFY_CHANNEL
from duetime.storage.shardmap import ShardMap

log = logging.getLogger("duetime.engine")


class DueListener:
    """One LISTEN connection per database that holds any of the listened shards."""

    def __init__(self, on_due: Callable[[int], None]) -> None:
        self._on_due = on_due
        self._conns: list[asyncpg.Connection] = []

    @classmethod
    async def open(
        cls, shard_map: ShardMap, shards: Iterable[int], on_due: Callable[[int], None]
    ) -> DueListener:
        """A database that refuses the LISTEN is logged and left to polling, not an error: the
        claim loops poll every ``DUETIME_POLL_INTERVAL_S`` anyway."""
        listener = cls(on_due)
        wanted = set(shards)
        for dsn, held in shard_map.databases().items():
            if not set(held) & wanted:
                continue
            try:
                conn = await asyncpg.connect(dsn)
                await conn.add_listener(NOTIFY_CHANNEL, listener._notified)
                listener._conns.append(conn)
            except (OSError, asyncpg.PostgresError):
                log.warning("LISTEN on %s failed; relying on polling", dsn.split("@")[-1])
        return listener

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            shard = int(payload)
        except ValueError:
            return
        self._on_due(shard)

    async def close(self) -> None:
        conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.close()
