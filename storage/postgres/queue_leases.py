"""DUETIME_RUN_QUEUE=nats: the leases of runs an engine fenced and published, taken over by the
worker that takes the message, kept alive by the engine until then, expired on its restart."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from duetime.core.runpath import Lease, Leased, Offered
from duetime.storage.postgres.completion import expire_locked
from duetime.storage.postgres.pools import StoreBase, translated
from duetime.storage.queries import Q


class QueueLeasePart(StoreBase):
    """The run-queue leases of ``PostgresStore``."""

    async def take_runs(self, items: Sequence[Offered], *, holder: str, lease_s: float) -> set[Lease]:
        """The worker ``holder`` takes the leases of published runs still running under their token
        and publishing engine; returns the leases it now holds — by token, since a stale message
        may carry the same id with an older one."""
        taken: set[Lease] = set()
        async with translated():
            for dsn, group in self.by_db(items).items():
                rows = await self.pool_for_dsn(dsn).fetch(
                    Q["take_runs"],
                    [g.job_id for g in group],
                    [g.lease_token for g in group],
                    [g.publisher for g in group],
                    holder,
                    float(lease_s),
                )
                shard = {g.job_id: g.shard for g in group}
                taken.update(Lease(r["job_id"], shard[r["job_id"]], r["lease_token"]) for r in rows)
        return taken

    async def extend_published(
        self, leases: Sequence[Leased], *, holder: str, lease_s: float
    ) -> set[uuid.UUID]:
        """Extends the leases ``holder`` (an engine) still holds on
        runs it published; returns their ids. A run a worker took, or that finished, is not among them."""
        held: set[uuid.UUID] = set()
        async with translated():
            for dsn, group in self.by_db(leases).items():
                rows = await self.pool_for_dsn(dsn).fetch(
                    Q["extend_published"],
                    [g.job_id for g in group],
                    [g.lease_token for g in group],
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
                        expired = await expire_locked(conn, ids)
                        applied += expired.stats.applied
                    self._hints.wake(await expired.writer.after_commit(conn))
        return applied
