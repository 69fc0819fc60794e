"""DUETIME_RUN_QUEUE=nats: the leases of runs an engine fenced and published, taken over by the
worker that takes the message, kept alive by the engine until then, expired on its restart."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from duetime.storage.postgres.completion import expire_locked
from duetime.storage.postgres.pools import StoreBase, translated
from duetime.storage.queries import Q


class QueueLeasePart(StoreBase):
    """The run-queue leases of ``PostgresStore``."""

    async def take_runs(
        self,
        items: Sequence[tuple[uuid.UUID, int, int, str]],
        *,
        holder: str,
        lease_s: float,
    ) -> set[tuple[uuid.UUID, int]]:
        """items: (job_id, shard, lease_token, publishing engine). The worker ``holder`` takes the
        leases of those still running under that token and engine; returns the (id, token) pairs it
        now holds — by pair, since a stale message may carry the same id with an older token."""
        taken: set[tuple[uuid.UUID, int]] = set()
        async with translated():
            for dsn, group in self.by_db((s, (j, t, p)) for j, s, t, p in items).items():
                rows = await self.pool_for_dsn(dsn).fetch(
                    Q["take_runs"],
                    [g[0] for g in group],
                    [g[1] for g in group],
                    [g[2] for g in group],
                    holder,
                    float(lease_s),
                )
                taken.update((r["job_id"], r["lease_token"]) for r in rows)
        return taken

    async def extend_published(
        self, items: Sequence[tuple[uuid.UUID, int, int]], *, holder: str, lease_s: float
    ) -> set[uuid.UUID]:
        """items: (job_id, shard, lease_token). Extends the leases ``holder`` (an engine) still holds on
        runs it published; returns their ids. A run a worker took, or that finished, is not among them."""
        held: set[uuid.UUID] = set()
        async with translated():
            for dsn, group in self.by_db((s, (j, t)) for j, s, t in items).items():
                rows = await self.pool_for_dsn(dsn).fetch(
                    Q["extend_published"],
                    [g[0] for g in group],
                    [g[1] for g in group],
                    holder,
                    float(lease_s),
                )
                held.update(r["job_id"] for r in rows)
        return held

    async def expire_published_of(self, engine_id: str, shards: Sequence[int]) -> int:
        """Before a restarted engine starts (DUETIME_RUN_QUEUE=nats): runs its previous life fenced and
        no worker took are finished as ``lease_expired`` and retried, and their messages, if any, are
        dropped as stale. Race-free with a worker taking one of them at the same moment."""
        applied = 0
        async with translated():
            for dsn, held in self.shard_map.databases().items():
                mine = [s for s in held if s in shards]
                if not mine:
                    continue
                async with self.pool_for_dsn(dsn).acquire() as conn:
                    async with conn.transaction():
                        ids = [
                            r["job_id"] for r in await conn.fetch(Q["published_of_engine"], engine_id, mine)
                        ]
                        if not ids:
                            continue
                        stats, writer = await expire_locked(conn, ids)
                        applied += stats.applied
                    self._hints.wake(await writer.after_commit(conn))
        return applied


# The module-level spellings callers used before these were methods of the store; they only
# delegate (the store's internals stay its own).


async def take_runs(
    store: QueueLeasePart,
    items: Sequence[tuple[uuid.UUID, int, int, str]],
    *,
    holder: str,
    lease_s: float,
) -> set[tuple[uuid.UUID, int]]:
    """See ``QueueLeasePart.take_runs``."""
    return await store.take_runs(items, holder=holder, lease_s=lease_s)


async def extend_published(
    store: QueueLeasePart, items: Sequence[tuple[uuid.UUID, int, int]], *, holder: str, lease_s: float
) -> set[uuid.UUID]:
    """See ``QueueLeasePart.extend_published``."""
    return await store.extend_published(items, holder=holder, lease_s=lease_s)


async def expire_published_of(store: QueueLeasePart, engine_id: str, shards: Sequence[int]) -> int:
    """See ``QueueLeasePart.expire_published_of``."""
    return await store.expire_published_of(engine_id, shards)
