"""The run path up to the call: claim due rows into a wheel, fence them before a call, keep
their leases alive (heartbeats), give back what was claimed and not fired."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import asyncpg
from asyncpg.pgproto.pgproto import UUID as PgUUID

from duetime.core import codec
from duetime.core.runpath import Claim, FencedRun, FenceItem, Leased, RunSpec
from duetime.storage.postgres.pools import StoreBase, retried, translated
from duetime.storage.queries import Q


class RunPathPart(StoreBase):
    """Claims, fences and leases of ``PostgresStore``."""

    async def claim_due(
        self, shard: int, engine_id: str, *, lookahead_s: float, lease_s: float, limit: int
    ) -> list[Claim]:
        async with translated():
            rows = await self.pool_for_shard(shard).fetch(
                Q["claim_due"], shard, engine_id, float(lookahead_s), limit, float(lease_s)
            )
        return [_claimed(r) for r in rows]

    async def retake_claims(self, engine_id: str, shards: Sequence[int], *, lease_s: float) -> list[Claim]:
        out: list[Claim] = []
        async with translated():
            for dsn, held in self.shard_map.databases().items():
                mine = [s for s in held if s in shards]
                if mine:
                    rows = await self.pool_for_dsn(dsn).fetch(
                        Q["retake_claims"], engine_id, mine, float(lease_s)
                    )
                    out.extend(_claimed(r) for r in rows)
        return out

    async def fence_runs(self, items: Sequence[FenceItem], *, lease_s: float) -> list[FencedRun]:
        """Fired claims (wheel entries) → the runs that may be called. The spec comes as the row's
        text, not decoded here: the worker parses it once, when it needs it."""
        out: list[FencedRun] = []
        async with translated():
            for dsn, group in self.by_db(items).items():
                pool: asyncpg.Pool = self.pool_for_dsn(dsn)
                args = fence_args(group, lease_s)

                # The fence is one statement: a deadlock PostgreSQL broke is simply run again.
                async def fence(pool: asyncpg.Pool = pool, args: tuple[Any, ...] = args) -> list[Any]:
                    return list(await pool.fetch(Q["fence_runs"], *args))

                rows = await retried(fence)
                # Each row unpacked in the statement's RETURNING order into FencedRun's field
                # order: a run of a burst is 15 values, and 15 lookups by name cost more than the
                # columns' decoding (loadtest.fence_bench).
                fenced = [
                    FencedRun(
                        job,
                        shard,
                        owner,
                        token,
                        occurrence,
                        due,
                        attempt + 1,
                        RunSpec(text, version),
                        kind,
                        parent,
                        created,
                        succeeded,
                        folded,
                        revision,
                    )
                    for (
                        job,
                        shard,
                        owner,
                        token,
                        occurrence,
                        due,
                        attempt,
                        text,
                        version,
                        kind,
                        parent,
                        created,
                        succeeded,
                        folded,
                        revision,
                    ) in rows
                ]
                parents = {r.parent_id for r in fenced if r.parent_id is not None}
                if parents:
                    fenced = await _with_jobs_context(pool, fenced, parents)
                out.extend(fenced)
        return out

    async def extend_leases(self, items: Sequence[Leased], *, lease_s: float) -> set[uuid.UUID]:
        """Returns the ids whose lease still holds."""
        held: set[uuid.UUID] = set()
        async with translated():
            for dsn, group in self.by_db(items).items():
                rows = await self.pool_for_dsn(dsn).fetch(
                    Q["extend_leases"],
                    [g.job_id for g in group],
                    [g.lease_token for g in group],
                    float(lease_s),
                )
                held.update(r["job_id"] for r in rows)
        return held

    async def keep_waiting_claims(
        self, shard: int, engine_id: str, *, within_s: float, extend_s: float, limit: int
    ) -> int:
        """Extend the leases of ``engine_id``'s claims on ``shard`` that would lapse within
        ``within_s``, by ``extend_s`` from now; at most ``limit`` rows. Returns how many."""
        async with translated():
            status: str = await self.pool_for_shard(shard).execute(
                Q["keep_waiting_claims"], shard, engine_id, float(within_s), float(extend_s), limit
            )
        return int(status.rsplit(" ", 1)[-1])

    async def release_claims(self, items: Sequence[Leased]) -> int:
        return await self._give_back("release_claims", items)

    async def return_unstarted(self, leases: Sequence[Leased]) -> int:
        return await self._give_back("return_unstarted", leases)

    async def _give_back(self, statement: str, items: Sequence[Leased]) -> int:
        """``statement`` (ids, tokens) once per database of ``items``; how many rows it changed."""
        given = 0
        async with translated():
            for dsn, group in self.by_db(items).items():
                rows = await self.pool_for_dsn(dsn).fetch(
                    Q[statement], [g.job_id for g in group], [g.lease_token for g in group]
                )
                given += len(rows)
        return given


async def _with_jobs_context(
    pool: asyncpg.Pool, fenced: list[FencedRun], parents: set[uuid.UUID]
) -> list[FencedRun]:
    """``fenced`` with each occurrence row's context taken from its job's row (``job_context``):
    the job's creation and last success, not the occurrence row's own. An occurrence row lives on
    its job's shard, so the job's row is in the same database."""
    rows = {r["job_id"]: r for r in await pool.fetch(Q["job_context"], list(parents))}
    out: list[FencedRun] = []
    for run in fenced:
        job = rows.get(run.parent_id) if run.parent_id is not None else None
        if job is None:
            out.append(run)
        else:
            out.append(
                replace(run, job_created_at=job["created_at"], last_success_for=job["last_success_for"])
            )
    return out


def fence_args(group: Sequence[FenceItem], lease_s: float) -> tuple[Any, ...]:
    """``fence_runs``' parameters ($1..$4) from the forms a wheel entry keeps: the ids as the
    driver's own UUID type built from their 16 bytes (encoded by a copy; a ``uuid.UUID`` is built
    in Python and then asked for its bytes), the occurrences as µs since the epoch (the statement
    turns them into ``timestamptz``; the driver's ``timestamptz`` encoding asks each ``datetime``
    for its offset and subtracts). Measured by ``loadtest.fence_bench``."""
    return (
        [PgUUID(g.job_id_bytes) for g in group],
        [g.lease_token for g in group],
        float(lease_s),
        [g.scheduled_for_us for g in group],
    )


def _claimed(r: asyncpg.Record) -> Claim:
    missed = r["misfire_spec"]  # only a missed row's (core.misfire.MISSED_SQL)
    return Claim(
        job_id=r["job_id"],
        shard=r["shard"],
        lease_token=r["lease_token"],
        due_at=r["next_run_at"],
        scheduled_for=r["scheduled_for"],
        attempt=r["attempt"],
        run_kind=r["run_kind"],
        db_now=r["db_now"],
        owner=r["owner"],
        misfire_spec=codec.spec_from_json(missed) if missed is not None else None,
    )
