"""Unique job names per owner: the name's lock, the holder lookup, and PUT by name.

A name is unique per owner among jobs that are not cancelled. Job rows are sharded by job id and
the 16 shards may sit on several primaries, so no single index sees every job of an owner. Every
write that *takes* a name (a create with a name, a PATCH or PUT that renames) therefore runs
under a transaction-scoped advisory lock on the home database, keyed by (owner, name): under it,
the store looks for a holder on every database, then writes the job on its own shard and commits
that before the lock is let go. Nothing that takes a name can slip between the check and the
write; freeing a name (cancel, retention) needs no lock. Within one database the partial unique
index ``jobs_owner_name`` (migration 0006) backs this up. See docs/architecture.md for why this
and not a names table or a shard derived from the name.

When the job's database is the home database (always, with one database) the lock, the lookup and
the write share one connection and transaction: a request never holds two connections of one
pool, so a burst of named creates cannot exhaust the pool waiting on itself.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from duetime.core import codec
from duetime.core.changes import UNNAMED, ChangeAction, ChangeBy, creation_diff
from duetime.core.errors import InvalidRequest, NotFound
from duetime.core.ids import SHARDS, new_job_id, shard_of
from duetime.core.lifecycle import initial_plan, split_point
from duetime.core.model import Job, JobSpec, JobState
from duetime.storage.ports import IdempotencyRequest, NameHolderChanged
from duetime.storage.postgres.pools import translated, utcnow
from duetime.storage.postgres.registry import RegistryPart, _Action
from duetime.storage.postgres.rows import job_from_row
from duetime.storage.queries import Q
from duetime.storage.registry_rules import name_taken, refuse_apply

if TYPE_CHECKING:
    from duetime.core.lifecycle import RowPlan

# pg_advisory_xact_lock(int4, int4): the first key says "a job name", so these locks never meet
# another advisory lock of the product (migrations use the one-key form).
_NAME_LOCK_CLASS = 0x4E414D45  # "NAME"


def _lock_key(owner: str, name: str) -> int:
    """A signed 32-bit key for (owner, name). Two names that collide share a lock: they are
    serialised needlessly, never wrongly."""
    value = zlib.crc32(f"{owner}\x00{name}".encode())
    return value - (1 << 32) if value >= 1 << 31 else value


@dataclass(slots=True)
class _Guard:
    """Inside the name's lock: the job that holds the name (or None) and the connection, in a
    transaction, on which to write the job's shard."""

    holder: asyncpg.Record | None
    conn: asyncpg.Connection
    wake: list[tuple[int, RowPlan]]


class NamesPart(RegistryPart):
    """Names on top of the registry: creates and renames take the name's lock."""

    async def _holders(self, home: asyncpg.Connection, owner: str, name: str) -> list[asyncpg.Record]:
        rows: list[asyncpg.Record] = []
        home_dsn = self.shard_map.home
        for dsn in self.shard_map.databases():
            if dsn == home_dsn:
                rows.extend(await home.fetch(Q["name_holder"], owner, name))
            else:
                rows.extend(await self.pool_for_dsn(dsn).fetch(Q["name_holder"], owner, name))
        return rows

    @asynccontextmanager
    async def _name_guard(
        self, owner: str, name: str, shard_for: Callable[[asyncpg.Record | None], int]
    ) -> AsyncIterator[_Guard]:
        """Hold the name's lock, find its holder, then open the write transaction on the shard
        ``shard_for(holder)`` names. The shard's transaction commits before the lock is let go."""
        async with translated(), self.home_pool.acquire() as home, home.transaction():
            await home.execute(Q["lock_name"], _NAME_LOCK_CLASS, _lock_key(owner, name))
            holders = await self._holders(home, owner, name)
            # Jobs from before names were unique may share one across databases: the oldest holds it.
            holder = min(holders, key=lambda r: (r["created_at"], r["job_id"])) if holders else None
            dsn = self.shard_map.dsn_for(shard_for(holder))
            if dsn == self.shard_map.home:
                guard = _Guard(holder, home, [])
                yield guard
            else:
                async with self.pool_for_dsn(dsn).acquire() as conn, conn.transaction():
                    guard = _Guard(holder, conn, [])
                    yield guard
        now = utcnow()
        for shard, plan in guard.wake:
            self._hints.due_soon(shard, plan, now)

    async def get_job_by_name(self, owner: str, name: str) -> Job:
        async with translated():
            rows: list[asyncpg.Record] = []
            for pool in self.pools():
                rows.extend(await pool.fetch(Q["name_holder"], owner, name))
        if not rows:
            raise NotFound(f"no job named {name!r}", ident=name)
        return job_from_row(min(rows, key=lambda r: (r["created_at"], r["job_id"])))

    async def create_job(
        self,
        owner: str,
        spec: JobSpec,
        *,
        idempotency: IdempotencyRequest | None = None,
        by: ChangeBy = UNNAMED,
    ) -> tuple[Job, bool]:
        if spec.name is None:
            return await super().create_job(owner, spec, idempotency=idempotency, by=by)
        key_shard = (
            None if idempotency is None else zlib.crc32(f"{owner}\x00{idempotency.key}".encode()) % SHARDS
        )
        job_id = new_job_id(key_shard) if key_shard is not None else new_job_id()
        async with self._name_guard(owner, spec.name, lambda _holder: shard_of(job_id)) as guard:
            conn = guard.conn
            if idempotency is not None:
                existing = await conn.fetchrow(Q["get_idempotency_key"], owner, idempotency.key)
                if existing is not None:
                    return await self._replayed(conn, owner, idempotency, existing), False
            if guard.holder is not None:
                raise name_taken(spec.name, guard.holder["job_id"])
            if idempotency is not None:
                await conn.execute(
                    Q["insert_idempotency_key"], owner, idempotency.key, idempotency.body_hash, job_id
                )
            job = await self._insert_named(guard, owner, spec, job_id, by)
        return job, True

    @staticmethod
    async def _replayed(
        conn: asyncpg.Connection, owner: str, idempotency: IdempotencyRequest, existing: asyncpg.Record
    ) -> Job:
        if existing["body_hash"] != idempotency.body_hash:
            raise InvalidRequest(
                "this Idempotency-Key was already used with a different body; use a new key "
                "for a different job, or resend the original body",
                code="idempotency_key_reused",
                field="Idempotency-Key",
            )
        row = await conn.fetchrow(Q["get_job"], existing["job_id"], owner)
        if row is None:
            raise NotFound("the job this key created no longer exists", ident=str(existing["job_id"]))
        return job_from_row(row)

    async def _insert_named(
        self, guard: _Guard, owner: str, spec: JobSpec, job_id: uuid.UUID, by: ChangeBy
    ) -> Job:
        now = utcnow()
        plan = initial_plan(job_id, spec, now)
        shard = shard_of(job_id)
        spec_json = codec.spec_to_json(spec)
        row = await guard.conn.fetchrow(
            Q["insert_job"],
            job_id,
            shard,
            owner,
            spec_json,
            plan.state.value,
            plan.next_run_at,
            plan.scheduled_for,
            plan.attempt,
            now,
            split_point(spec, plan),
            by.key_id,
            by.reason,
            creation_diff(spec_json),
        )
        guard.wake.append((shard, plan))
        return job_from_row(row)

    async def update_job(
        self, owner: str, job_id: uuid.UUID, spec: JobSpec, *, by: ChangeBy = UNNAMED
    ) -> Job:
        if spec.name is not None:
            current = await self.get_job(owner, job_id)
            if current.spec.name != spec.name:
                return await self._rename(owner, job_id, spec, by)
        return await super().update_job(owner, job_id, spec, by=by)

    async def _rename(self, owner: str, job_id: uuid.UUID, spec: JobSpec, by: ChangeBy) -> Job:
        assert spec.name is not None
        async with self._name_guard(owner, spec.name, lambda _holder: shard_of(job_id)) as guard:
            if guard.holder is not None and guard.holder["job_id"] != job_id:
                raise name_taken(spec.name, guard.holder["job_id"])
            action = await self._lock_on(guard, owner, job_id)
            job = await self._update_locked(action, job_id, spec, by, ChangeAction.UPDATE)
            if action.wake is not None:
                guard.wake.append((action.row["shard"], action.wake))
            return job

    async def _lock_on(self, guard: _Guard, owner: str, job_id: uuid.UUID) -> _Action:
        row = await guard.conn.fetchrow(Q["lock_job"], job_id, owner)
        if row is None:
            raise NotFound(f"no job {job_id}", ident=str(job_id))
        return _Action(guard.conn, row)

    async def apply_job(
        self, owner: str, spec: JobSpec, *, expected_id: str | None, by: ChangeBy = UNNAMED
    ) -> tuple[Job, bool]:
        name = spec.name
        if name is None:
            raise ValueError("apply_job needs a named spec")
        job_id = new_job_id()

        def shard_for(holder: asyncpg.Record | None) -> int:
            return shard_of(job_id if holder is None else holder["job_id"])

        async with self._name_guard(owner, name, shard_for) as guard:
            holder = guard.holder
            if (None if holder is None else str(holder["job_id"])) != expected_id:
                raise NameHolderChanged(name)
            if holder is None:
                return await self._insert_named(guard, owner, spec, job_id, by), True
            action = await self._lock_on(guard, owner, holder["job_id"])
            row = action.row
            new_json = codec.spec_to_json(spec)
            if codec.spec_to_json(codec.spec_from_json(row["spec"])) == new_json:
                return job_from_row(row), False  # nothing to change: nothing is written
            refuse_apply(JobState(row["state"]), row["job_id"], name)
            job = await self._update_locked(action, row["job_id"], spec, by, ChangeAction.REPLACE)
            if action.wake is not None:
                guard.wake.append((row["shard"], action.wake))
            return job, False
