"""The janitor's statements: lapsed leases rescued, runs of a dead engine life expired, overlap
occurrences handed to rows of their own, drained jobs completed, stalled backfills released,
idempotency keys purged."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from duetime.core import codec, jitter
from duetime.core.ids import new_job_id
from duetime.core.schedule import next_occurrence
from duetime.storage.ports import CompletionStats
from duetime.storage.postgres.completion import expire_locked
from duetime.storage.postgres.pools import StoreBase, translated
from duetime.storage.queries import Q


class MaintenancePart(StoreBase):
    """The janitor half of ``PostgresStore``."""

    async def rescue_expired(self, shard: int, *, limit: int) -> CompletionStats:
        """The janitor: rows whose lease lapsed become due again. A claimed row that never fired
        is released as it was; a running one had an attempt whose outcome nobody recorded, so it
        is finished as ``lease_expired`` and retried under the job's policy.

        A running row's lease is ``run_until``, which no index reads (so its fence and
        heartbeats are HOT updates); the lease index is keyed on the claim's ``leased_until``.
        Runs that outlive that key have it carried up to their ``run_until`` first, so the scan
        below does not walk the same live runs on every round (storage/sql/maintenance.sql)."""
        async with translated(), self.pool_for_shard(shard).acquire() as conn:
            await conn.execute(Q["carry_run_leases"], shard, limit)
            async with conn.transaction():
                ids = [r["job_id"] for r in await conn.fetch(Q["expired_leases"], shard, limit)]
                if not ids:
                    return CompletionStats()
                expired = await expire_locked(conn, ids)
            self._hints.wake(await expired.writer.after_commit(conn))
            return expired.stats

    async def expire_running_of(self, engine_id: str, shards: Sequence[int]) -> CompletionStats:
        """On restart: calls this engine had in flight when it died have unknown outcomes."""
        total = CompletionStats()
        async with translated():
            for dsn, held in self.shard_map.databases().items():
                mine = [s for s in held if s in shards]
                if not mine:
                    continue
                async with self.pool_for_dsn(dsn).acquire() as conn:
                    async with conn.transaction():
                        ids = [r["job_id"] for r in await conn.fetch(Q["running_of_engine"], engine_id, mine)]
                        if not ids:
                            continue
                        expired = await expire_locked(conn, ids)
                        total += expired.stats  # expire_locked counts nothing stale
                    self._hints.wake(await expired.writer.after_commit(conn))
        return total

    async def split_overlapping(self, shard: int, *, horizon_s: float, limit: int = 500) -> int:
        """overlap=allow: every row whose run is still in flight when its next occurrence comes
        due (within ``horizon_s``) hands that occurrence to an occurrence row of its own, due at
        its own instant, claimed and fired like any row. Returns how many were handed out."""
        async with translated(), self.pool_for_shard(shard).acquire() as conn, conn.transaction():
            rows = await conn.fetch(Q["overlap_due"], shard, float(horizon_s), limit)
            if not rows:
                return 0
            occurrence_ids, dues, handed, following = [], [], [], []
            for r in rows:
                spec = codec.spec_from_json(r["spec"])
                occ: datetime = r["split_at"]
                occurrence_ids.append(new_job_id(shard))
                dues.append(jitter.due_at(r["job_id"], occ, spec))
                handed.append(occ)
                following.append(next_occurrence(spec.schedule, occ))
            n = len(rows)
            await conn.execute(
                Q["insert_occurrences"],
                occurrence_ids,
                [shard] * n,
                [r["owner"] for r in rows],
                [r["spec"] for r in rows],
                dues,
                handed,
                [r["job_id"] for r in rows],
                [None] * n,
            )
            await conn.execute(Q["mark_split"], [r["job_id"] for r in rows], handed, following)
            return n

    async def complete_drained_jobs(self, shard: int) -> int:
        """The janitor: recurring jobs whose schedule ended and whose last occurrence row is
        gone, in case the statement after that row's completion was lost."""
        async with translated():
            rows = await self.pool_for_shard(shard).fetch(Q["complete_drained_jobs_of_shard"], shard)
        return len(rows)

    async def release_stalled_backfills(self, shard: int) -> int:
        async with translated():
            rows = await self.pool_for_shard(shard).fetch(Q["release_stalled_backfills"], shard)
        return len(rows)

    async def db_now(self, shard: int = 0) -> datetime:
        async with translated():
            now: datetime = await self.pool_for_shard(shard).fetchval(Q["db_now"])
        return now

    async def purge_idempotency_keys(self, older_than_s: float) -> None:
        async with translated():
            for pool in self.pools():
                await pool.execute(Q["purge_idempotency_keys"], float(older_than_s))
