"""The run path up to the call: claim due rows into a wheel, fence them before a call, keep
their leases alive (heartbeats), give back what was claimed and not fired."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from duetime.storage.postgres.pools import StoreBase, retried, translated
from duetime.storage.queries import Q


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    """A row leased into an engine's wheel. ``misfire_spec`` is set only when it is overdue past
    its grace, so the engine can apply the misfire policy."""

    job_id: uuid.UUID
    shard: int
    lease_token: int
    due_at: datetime
    scheduled_for: datetime
    attempt: int
    run_kind: str
    misfire_spec: dict[str, Any] | None
    db_now: datetime
    owner: str = ""


@dataclass(frozen=True, slots=True)
class FencedRow:
    """A run that passed the fence: it may be called, as attempt ``attempt``."""

    job_id: uuid.UUID
    shard: int
    owner: str
    lease_token: int
    scheduled_for: datetime
    due_at: datetime
    attempt: int
    spec: dict[str, Any]
    spec_version: int
    run_kind: str
    spec_text: str = ""  # the spec as the fence read it (jsonb's text), when it came from the fence
    # Set on an occurrence row (overlap=allow, backfill): the job it runs an occurrence of. The
    # target sees this id (Duetime-Job-Id, Idempotency-Key); the lease is the row's own.
    parent_id: uuid.UUID | None = None

    @property
    def public_id(self) -> uuid.UUID:
        return self.parent_id or self.job_id


class RunPathPart(StoreBase):
    """Claims, fences and leases of ``PostgresStore``."""

    async def claim_due(
        self, shard: int, engine_id: str, *, lookahead_s: float, lease_s: float, limit: int
    ) -> list[ClaimedRow]:
        async with translated():
            rows = await self.pool_for_shard(shard).fetch(
                Q["claim_due"], shard, engine_id, float(lookahead_s), limit, float(lease_s)
            )
        return [_claimed(r) for r in rows]

    async def retake_claims(
        self, engine_id: str, shards: Sequence[int], *, lease_s: float
    ) -> list[ClaimedRow]:
        out: list[ClaimedRow] = []
        async with translated():
            for dsn, held in self.shard_map.databases().items():
                mine = [s for s in held if s in shards]
                if mine:
                    rows = await self.pool_for_dsn(dsn).fetch(
                        Q["retake_claims"], engine_id, mine, float(lease_s)
                    )
                    out.extend(_claimed(r) for r in rows)
        return out

    async def fence_runs(
        self, items: Sequence[tuple[uuid.UUID, int, int, datetime]], *, lease_s: float
    ) -> list[FencedRow]:
        """items: (job_id, shard, lease_token, scheduled_for). Returns those that may be called."""
        out: list[FencedRow] = []
        async with translated():
            for dsn, group in self.by_db((s, (j, t, sf)) for j, s, t, sf in items).items():
                pool: asyncpg.Pool = self.pool_for_dsn(dsn)
                args: tuple[Any, ...] = (
                    [g[0] for g in group],
                    [g[1] for g in group],
                    float(lease_s),
                    [g[2] for g in group],
                )

                async def fence(pool: asyncpg.Pool = pool, args: tuple[Any, ...] = args) -> list[Any]:
                    return list(await pool.fetch(Q["fence_runs"], *args))

                rows = await retried(fence)
                out.extend(
                    FencedRow(
                        job_id=r["job_id"],
                        shard=r["shard"],
                        owner=r["owner"],
                        lease_token=r["lease_token"],
                        scheduled_for=r["scheduled_for"],
                        due_at=r["next_run_at"],
                        attempt=r["attempt"] + 1,
                        spec=json.loads(r["spec"]),
                        spec_version=r["spec_version"],
                        spec_text=r["spec"],
                        run_kind=r["run_kind"],
                        parent_id=r["parent_id"],
                    )
                    for r in rows
                )
        return out

    async def extend_leases(
        self, items: Sequence[tuple[uuid.UUID, int, int]], *, lease_s: float
    ) -> set[uuid.UUID]:
        """items: (job_id, shard, lease_token). Returns the ids whose lease still holds."""
        held: set[uuid.UUID] = set()
        async with translated():
            for dsn, group in self.by_db((s, (j, t)) for j, s, t in items).items():
                rows = await self.pool_for_dsn(dsn).fetch(
                    Q["extend_leases"], [g[0] for g in group], [g[1] for g in group], float(lease_s)
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

    async def release_claims(self, items: Sequence[tuple[uuid.UUID, int, int]]) -> int:
        released = 0
        async with translated():
            for dsn, group in self.by_db((s, (j, t)) for j, s, t in items).items():
                rows = await self.pool_for_dsn(dsn).fetch(
                    Q["release_claims"], [g[0] for g in group], [g[1] for g in group]
                )
                released += len(rows)
        return released


def _claimed(r: asyncpg.Record) -> ClaimedRow:
    return ClaimedRow(
        job_id=r["job_id"],
        shard=r["shard"],
        lease_token=r["lease_token"],
        due_at=r["next_run_at"],
        scheduled_for=r["scheduled_for"],
        attempt=r["attempt"],
        run_kind=r["run_kind"],
        misfire_spec=r["misfire_spec"],
        db_now=r["db_now"],
        owner=r["owner"],
    )
