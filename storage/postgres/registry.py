"""The registry the API uses: jobs (create, read, list, owner actions, backfill), their run
history, owners and API keys, and idempotency keys. Every call is scoped by owner."""

from __future__ import annotations

import secrets
import uuid
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from duetime.core import codec
from duetime.core.backfill import plan_backfill, require_room
from duetime.core.changes import UNNAMED, ChangeAction, ChangeBy, creation_diff, spec_diff
from duetime.core.errors import InvalidRequest, NotFound
from duetime.core.ids import SHARDS, new_job_id, shard_of
from duetime.core.lifecycle import OwnerStep, RowPlan, initial_plan, owner_step, split_point, update_step
from duetime.core.model import PLAIN_PAUSE, Job, JobSpec, JobState, Overlap, PauseRequest, Phase, Run
from duetime.core.states import OwnerAction, owner_move
from duetime.storage.base import Backfill, IdempotencyRequest, Page
from duetime.storage.ports import OwnerRun
from duetime.storage.postgres.changes import record_changes
from duetime.storage.postgres.inserts import InsertBatcher
from duetime.storage.postgres.pauses import add_pause_ends
from duetime.storage.postgres.pools import StoreBase, contention_retried, translated, utcnow
from duetime.storage.postgres.rows import job_from_row, plan_of, run_from_row
from duetime.storage.queries import Q
from duetime.storage.registry_rules import (
    check_trigger_step,
    encode_cursor,
    encode_owner_runs_cursor,
    hash_key,
    job_cursor,
    key_prefix,
    owner_runs_cursor,
    replay_plan,
    require_failed_occurrence,
    run_cursor,
    timing_changed,
)


@dataclass(slots=True)
class _Action:
    """One owner action in progress: its connection, the locked row, and whom to wake after."""

    conn: asyncpg.Connection
    row: asyncpg.Record
    wake: RowPlan | None = None


class RegistryPart(StoreBase):
    """The registry half of ``PostgresStore``."""

    _inserters: dict[str, InsertBatcher]

    async def create_job(
        self,
        owner: str,
        spec: JobSpec,
        *,
        idempotency: IdempotencyRequest | None = None,
        by: ChangeBy = UNNAMED,
    ) -> tuple[Job, bool]:
        now = utcnow()
        if idempotency is not None:
            shard = zlib.crc32(f"{owner}\x00{idempotency.key}".encode()) % SHARDS
            job_id = new_job_id(shard)
        else:
            job_id = new_job_id()
            shard = shard_of(job_id)
        plan = initial_plan(job_id, spec, now)
        spec_json = codec.spec_to_json(spec)
        args = (
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
        if idempotency is None:
            await self._inserters[self.shard_map.dsn_for(shard)].insert(args)
            self._hints.due_soon(shard, plan, now)
            return (
                Job(
                    id=str(job_id),
                    owner=owner,
                    spec=spec,
                    state=plan.state,
                    next_run_at=plan.next_run_at if plan.state is JobState.SCHEDULED else None,
                    attempt=plan.attempt,
                    created_at=now,
                    updated_at=now,
                    last_run=None,
                ),
                True,
            )
        async with translated(), self.pool_for_shard(shard).acquire() as conn, conn.transaction():
            inserted = await conn.fetchval(
                Q["insert_idempotency_key"], owner, idempotency.key, idempotency.body_hash, job_id
            )
            if inserted is None:
                existing = await conn.fetchrow(Q["get_idempotency_key"], owner, idempotency.key)
                if existing["body_hash"] != idempotency.body_hash:
                    raise InvalidRequest(
                        "this Idempotency-Key was already used with a different body; use a new key "
                        "for a different job, or resend the original body",
                        code="idempotency_key_reused",
                        field="Idempotency-Key",
                    )
                row = await conn.fetchrow(Q["get_job"], existing["job_id"], owner)
                if row is None:  # pragma: no cover - keys and jobs are written together
                    raise NotFound("the job this key created no longer exists", ident=str(job_id))
                return job_from_row(row), False
            row = await conn.fetchrow(Q["insert_job"], *args)
        self._hints.due_soon(shard, plan, now)
        return job_from_row(row), True

    async def get_job(self, owner: str, job_id: uuid.UUID) -> Job:
        async with translated():
            row = await self.pool_for_shard(shard_of(job_id)).fetchrow(Q["get_job"], job_id, owner)
        if row is None:
            raise NotFound(f"no job {job_id}", ident=str(job_id))
        return job_from_row(row)

    async def list_jobs(
        self, owner: str, *, state: JobState | None, limit: int, cursor: str | None
    ) -> Page[Job]:
        after = job_cursor(cursor)
        rows: list[asyncpg.Record] = []
        async with translated():
            for pool in self.pools():
                if state is None:
                    rows.extend(await pool.fetch(Q["list_jobs"], owner, after, limit + 1))
                else:
                    rows.extend(
                        await pool.fetch(Q["list_jobs_by_state"], owner, state.value, after, limit + 1)
                    )
        rows.sort(key=lambda r: r["job_id"])
        page = rows[:limit]
        next_cursor = encode_cursor(page[-1]["job_id"].bytes) if len(rows) > limit else None
        return Page([job_from_row(r) for r in page], next_cursor)

    @asynccontextmanager
    async def _locked(self, owner: str, job_id: uuid.UUID) -> AsyncIterator[_Action]:
        """The job's row under lock for one owner action; engines are woken after the commit."""
        async with translated(), self.pool_for_shard(shard_of(job_id)).acquire() as conn:
            async with conn.transaction():
                await conn.execute(Q["lock_family"], job_id, owner)
                row = await conn.fetchrow(Q["lock_job"], job_id, owner)
                if row is None:
                    raise NotFound(f"no job {job_id}", ident=str(job_id))
                action = _Action(conn, row)
                yield action
            if action.wake is not None:
                self._hints.due_soon(row["shard"], action.wake, utcnow())

    @staticmethod
    def _step(action: OwnerAction, row: asyncpg.Record) -> OwnerStep | None:
        """What ``core.lifecycle`` makes of the locked row for ``action`` (None: a no-op); a
        refusal by the owner table raises the 409."""
        return owner_step(action, plan_of(row), now=utcnow(), idle=row["phase"] == Phase.IDLE)

    async def _write(
        self,
        action: _Action,
        *,
        spec: dict[str, Any] | None = None,
        spec_version: int | None = None,
        revision: int | None = None,
        plan: RowPlan,
        revoke: bool,
        pause: PauseRequest = PLAIN_PAUSE,
        by: ChangeBy = UNNAMED,
    ) -> Job:
        """Write the row as ``plan`` says; a write that pauses the job keeps what ``pause`` says
        and who paused it (``by``)."""
        row = action.row
        out = await action.conn.fetchrow(
            Q["write_job"],
            row["job_id"],
            row["owner"],
            spec if spec is not None else row["spec"],
            spec_version if spec_version is not None else row["spec_version"],
            plan.state.value,
            plan.next_run_at,
            plan.scheduled_for,
            plan.attempt,
            plan.run_kind,
            plan.resume_at,
            list(plan.pending_triggers),
            revoke,
            split_point(codec.spec_from_json(spec if spec is not None else row["spec"]), plan),
            plan.handed_upto,
            revision if revision is not None else row["spec_revision"],
            pause.note,
            pause.until,
            by.key_id,
        )
        action.wake = plan
        return job_from_row(out)

    @contention_retried
    async def update_job(
        self, owner: str, job_id: uuid.UUID, spec: JobSpec, *, by: ChangeBy = UNNAMED
    ) -> Job:
        async with self._locked(owner, job_id) as action:
            return await self._update_locked(action, job_id, spec, by, ChangeAction.UPDATE)

    async def _update_locked(
        self, action: _Action, job_id: uuid.UUID, spec: JobSpec, by: ChangeBy, what: ChangeAction
    ) -> Job:
        """The update of a row already locked in ``action`` (also the PUT by name's, which locks
        it under the name's lock), recorded as ``what`` when it alters the spec."""
        new_json = codec.spec_to_json(spec)
        row = action.row
        old = row["spec"]
        changed = timing_changed(old, new_json)
        step = update_step(job_id, spec, plan_of(row), timing_changed=changed, now=utcnow())
        version = row["spec_version"] + 1 if changed else row["spec_version"]
        # Against the stored spec as the API shows it: a row written by an older release lacks
        # fields added since, which are no change.
        diff = spec_diff(codec.spec_to_json(codec.spec_from_json(old)), new_json)
        revision = row["spec_revision"] + 1 if diff else row["spec_revision"]
        if new_json != old:
            await action.conn.execute(Q["cascade_spec"], job_id, new_json, revision)
        if changed:
            await action.conn.execute(Q["drop_split_occurrences"], job_id)
        job = await self._write(
            action, spec=new_json, spec_version=version, revision=revision, plan=step.plan, revoke=step.revoke
        )
        if diff:
            await record_changes(action.conn, [job_id], what, by, diff)
        return job

    @contention_retried
    async def cancel_job(self, owner: str, job_id: uuid.UUID, *, by: ChangeBy = UNNAMED) -> Job:
        async with self._locked(owner, job_id) as action:
            step = self._step(OwnerAction.CANCEL, action.row)
            if step is None:
                return job_from_row(action.row)
            await action.conn.fetch(Q["cascade_state"], job_id, step.plan.state.value)
            await action.conn.execute(Q["drop_idle_occurrences"], job_id)
            job = await self._write(action, plan=step.plan, revoke=step.revoke)
            await record_changes(action.conn, [job_id], ChangeAction.CANCEL, by)
            return job

    @contention_retried
    async def pause_job(
        self, owner: str, job_id: uuid.UUID, *, by: ChangeBy = UNNAMED, pause: PauseRequest = PLAIN_PAUSE
    ) -> Job:
        return await self._cascaded(owner, job_id, OwnerAction.PAUSE, by, pause)

    @contention_retried
    async def resume_job(self, owner: str, job_id: uuid.UUID, *, by: ChangeBy = UNNAMED) -> Job:
        return await self._cascaded(owner, job_id, OwnerAction.RESUME, by)

    async def _cascaded(
        self,
        owner: str,
        job_id: uuid.UUID,
        what: OwnerAction,
        by: ChangeBy,
        pause: PauseRequest = PLAIN_PAUSE,
    ) -> Job:
        """Pause or resume: the job's row and, in the same transaction, its occurrence rows."""
        async with self._locked(owner, job_id) as action:
            step = self._step(what, action.row)
            if step is None:
                return job_from_row(action.row)
            await action.conn.fetch(Q["cascade_state"], job_id, step.plan.state.value)
            job = await self._write(action, plan=step.plan, revoke=step.revoke, pause=pause, by=by)
            if step.plan.state is JobState.PAUSED:
                await add_pause_ends(action.conn, pause.until, [job_id], [action.row["shard"]])
            await record_changes(action.conn, [job_id], ChangeAction(what.value), by)
            return job

    @contention_retried
    async def trigger_job(
        self, owner: str, job_id: uuid.UUID, *, max_pending: int = 0, by: ChangeBy = UNNAMED
    ) -> Job:
        async with self._locked(owner, job_id) as action:
            step = self._step(OwnerAction.TRIGGER, action.row)
            assert step is not None, "trigger is never a no-op"
            check_trigger_step(plan_of(action.row), step.plan, max_pending)
            job = await self._write(action, plan=step.plan, revoke=step.revoke)
            await record_changes(action.conn, [job_id], ChangeAction.TRIGGER, by)
            return job

    @contention_retried
    async def replay_job(self, owner: str, job_id: uuid.UUID, *, by: ChangeBy = UNNAMED) -> Job:
        async with self._locked(owner, job_id) as action:
            step = self._step(OwnerAction.REPLAY, action.row)
            assert step is not None, "replay is never a no-op"
            job = await self._write(action, plan=step.plan, revoke=step.revoke)
            await record_changes(action.conn, [job_id], ChangeAction.REPLAY, by)
            return job

    async def replay_occurrence(
        self,
        owner: str,
        job_id: uuid.UUID,
        scheduled_for: datetime,
        *,
        max_pending: int = 0,
        by: ChangeBy = UNNAMED,
    ) -> Job:
        now = utcnow()
        async with self._locked(owner, job_id) as action:
            row, conn = action.row, action.conn
            owner_move(OwnerAction.BACKFILL, JobState(row["state"]))
            spec = codec.spec_from_json(row["spec"])
            if not spec.recurring:
                raise InvalidRequest(
                    "only an occurrence of a recurring (cron or every) job can be replayed by its "
                    "scheduled_for; replay a dead one-off job without a body",
                    code="not_recurring",
                    field="scheduled_for",
                )
            final = await conn.fetchval(Q["final_outcome_of_occurrence"], job_id, scheduled_for)
            require_failed_occurrence(final, codec.format_time(scheduled_for))
            waiting = await conn.fetchrow(Q["occurrences_of"], job_id)
            plan = replay_plan(spec, int(waiting["pending"]), int(waiting["last_seq"]), now, max_pending)
            shard = row["shard"]
            await conn.execute(
                Q["insert_occurrences"],
                [new_job_id(shard)],
                [shard],
                [owner],
                [row["spec"]],
                [plan.due_at],
                [scheduled_for],
                [job_id],
                [plan.seq],
            )
            await record_changes(conn, [job_id], ChangeAction.REPLAY, by)
            action.wake = RowPlan(state=JobState.SCHEDULED, next_run_at=now, scheduled_for=None, attempt=0)
            return job_from_row(row)

    @contention_retried
    async def backfill_job(
        self,
        owner: str,
        job_id: uuid.UUID,
        start: datetime,
        end: datetime,
        *,
        max_occurrences: int,
        pace_per_s: float,
        by: ChangeBy = UNNAMED,
    ) -> Backfill:
        now = utcnow()
        async with self._locked(owner, job_id) as action:
            row, conn = action.row, action.conn
            owner_move(OwnerAction.BACKFILL, JobState(row["state"]))
            spec = codec.spec_from_json(row["spec"])
            waiting = await conn.fetchrow(Q["occurrences_of"], job_id)
            pending = int(waiting["pending"])
            runs = plan_backfill(
                spec,
                start,
                end,
                now,
                max_occurrences=max_occurrences,
                pace_per_s=pace_per_s,
                chain_busy=spec.overlap is not Overlap.ALLOW and pending > 0,
            )
            require_room(pending, len(runs), max_occurrences)
            if runs:
                seq = int(waiting["last_seq"])
                n, shard = len(runs), row["shard"]
                await conn.execute(
                    Q["insert_occurrences"],
                    [new_job_id(shard) for _ in runs],
                    [shard] * n,
                    [owner] * n,
                    [row["spec"]] * n,
                    [r.due_at for r in runs],
                    [r.scheduled_for for r in runs],
                    [job_id] * n,
                    list(range(seq + 1, seq + 1 + n)),
                )
                await record_changes(conn, [job_id], ChangeAction.BACKFILL, by)
                action.wake = RowPlan(
                    state=JobState.SCHEDULED, next_run_at=now, scheduled_for=None, attempt=0
                )
        return Backfill(
            queued=len(runs),
            first=runs[0].scheduled_for if runs else None,
            last=runs[-1].scheduled_for if runs else None,
        )

    async def list_runs(self, owner: str, job_id: uuid.UUID, *, limit: int, cursor: str | None) -> Page[Run]:
        before = run_cursor(cursor)
        pool = self.pool_for_shard(shard_of(job_id))
        async with translated():
            if await pool.fetchval(Q["job_exists"], job_id, owner) is None:
                raise NotFound(f"no job {job_id}", ident=str(job_id))
            rows = await pool.fetch(Q["list_runs"], job_id, before, limit + 1)
        page = rows[:limit]
        next_cursor = encode_cursor(page[-1]["run_id"].to_bytes(8, "big")) if len(rows) > limit else None
        return Page([run_from_row(r) for r in page], next_cursor)

    async def list_owner_runs(
        self,
        owner: str,
        *,
        outcome: str | None,
        since: datetime | None,
        limit: int,
        cursor: str | None,
    ) -> Page[OwnerRun]:
        after = owner_runs_cursor(cursor)
        finished, job, run_id = after if after is not None else (None, None, None)
        found: list[asyncpg.Record] = []
        async with translated():
            for pool in self.pools():
                found.extend(
                    await pool.fetch(
                        Q["list_owner_runs"], owner, outcome, since, finished, job, run_id, limit + 1
                    )
                )
        found.sort(key=lambda r: (r["finished_at"], r["job_id"], r["run_id"]), reverse=True)
        page = found[:limit]
        next_cursor = None
        if len(found) > limit:
            last = page[-1]
            next_cursor = encode_owner_runs_cursor(last["finished_at"], last["job_id"], last["run_id"])
        return Page([OwnerRun(r["job_id"], run_from_row(r)) for r in page], next_cursor)

    async def active_job_bytes(self, owner: str) -> int:
        total = 0
        async with translated():
            for pool in self.pools():
                total += int(await pool.fetchval(Q["active_job_bytes"], owner))
        return total

    async def count_active_jobs(self, owner: str) -> int:
        total = 0
        async with translated():
            for pool in self.pools():
                total += await pool.fetchval(Q["count_active_jobs"], owner)
        return total

    async def owner_for_key(self, api_key: str) -> str | None:
        async with translated():
            owner: str | None = await self.home_pool.fetchval(Q["owner_for_key"], hash_key(api_key))
        return owner

    async def create_api_key(self, owner: str) -> tuple[str, str]:
        from duetime.core.signing import new_signing_secret

        api_key = "dt_" + secrets.token_urlsafe(24)  # 192 random bits
        async with translated(), self.home_pool.acquire() as conn, conn.transaction():
            await conn.execute(Q["insert_owner"], owner, new_signing_secret())
            await conn.execute(Q["insert_api_key"], hash_key(api_key), key_prefix(api_key), owner)
            secret: str = await conn.fetchval(Q["signing_secret"], owner)
        return api_key, secret

    async def revoke_api_key(self, api_key_or_prefix: str) -> int:
        async with translated():
            status: str = await self.home_pool.execute(
                Q["revoke_api_key"], hash_key(api_key_or_prefix), api_key_or_prefix
            )
        return int(status.rsplit(maxsplit=1)[-1])

    async def signing_secret(self, owner: str) -> str | None:
        async with translated():
            secret: str | None = await self.home_pool.fetchval(Q["signing_secret"], owner)
        return secret

    async def ping(self) -> None:
        async with translated():
            for pool in self.pools():
                await pool.fetchval(Q["db_now"])
