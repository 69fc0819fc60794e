"""What the maintenance service deletes: expired run history and long-finished jobs.

Each method deletes one batch per database, in its own short transaction, and answers how many
rows went; the service (``engine.retention``) decides when and how often. A batch first takes a
try-lock for its database, so when several engines each run the service, one of them does a
database's batch and the others skip it instead of deleting the same rows side by side.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Final

import asyncpg

from duetime.storage.ports import FinishedJobsSweep, HistorySweep
from duetime.storage.postgres.pools import StoreBase, translated
from duetime.storage.queries import Q

_RETENTION_LOCK: Final = (0x52455445, 1)  # "RETE": pg_try_advisory_xact_lock's two keys


def _count(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1])


class RetentionPart(StoreBase):
    """Batched deletes for the maintenance service."""

    def databases(self) -> list[str]:
        return list(self.shard_map.databases())

    async def delete_old_runs(
        self, dsn: str, *, before: datetime, limit: int, after: int = 0
    ) -> HistorySweep | None:
        """History rows that finished before ``before``, among the oldest ``limit`` with a run id
        above ``after``; None when another process holds this database's maintenance lock."""
        async with translated(), self.pool_for_dsn(dsn).acquire() as conn, conn.transaction():
            if not await conn.fetchval(Q["retention_lock"], *_RETENTION_LOCK):
                return None
            row = await conn.fetchrow(Q["retention_old_runs"], before, limit, after)
            assert row is not None
            return HistorySweep(deleted=int(row["deleted"]), walked=row["walked"])

    async def delete_finished_jobs(
        self, dsn: str, *, before: datetime, limit: int
    ) -> FinishedJobsSweep | None:
        """Up to ``limit`` jobs finished before ``before``, with their history (``limit`` rows per
        statement), Idempotency-Keys, change records and occurrence rows. Returns the jobs and
        history rows deleted, or None when another process holds this database's maintenance lock.

        The lock is held for the whole batch, not only while its jobs are chosen: otherwise a
        second engine chose the same jobs while the first deleted their history, found them gone
        at the end, took "0 deleted" for "nothing left", and the two engines then skipped each
        other until their next rounds (old jobs went at a batch a minute)."""
        async with translated(), self.pool_for_dsn(dsn).acquire() as conn:
            if not await conn.fetchval(Q["retention_lock_held"], *_RETENTION_LOCK):
                return None
            try:
                return await _finished_batch(conn, before, limit)
            finally:
                try:
                    await conn.fetchval(Q["retention_unlock"], *_RETENTION_LOCK)
                except BaseException:
                    conn.terminate()  # a closed session holds no lock
                    raise


async def _finished_batch(conn: asyncpg.Connection, before: datetime, limit: int) -> FinishedJobsSweep:
    """One batch of ``delete_finished_jobs``, on a connection that holds the maintenance lock."""
    chosen = await conn.fetch(Q["retention_finished_jobs"], before, limit)
    ids: list[uuid.UUID] = [r["job_id"] for r in chosen]
    if not ids:
        return FinishedJobsSweep(jobs=0, history=0)
    history = 0
    while True:  # their history first, in statements of its own: it may be long
        deleted = _count(await conn.execute(Q["retention_runs_of_jobs"], ids, limit))
        history += deleted
        if deleted < limit:
            break
    async with conn.transaction():
        locked = [r["job_id"] for r in await conn.fetch(Q["retention_lock_finished"], before, ids)]
        if not locked:
            return FinishedJobsSweep(jobs=0, history=history)
        history += _count(await conn.execute(Q["retention_all_runs_of_jobs"], locked))
        await conn.execute(Q["retention_keys_of_jobs"], locked)
        await conn.execute(Q["retention_changes_of_jobs"], locked)
        await conn.execute(Q["retention_occurrences_of_jobs"], locked)
        jobs = _count(await conn.execute(Q["retention_delete_jobs"], locked))
    return FinishedJobsSweep(jobs=jobs, history=history)
