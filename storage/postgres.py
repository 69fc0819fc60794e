"""PostgreSQL implementation of the storage seam: the registry the API uses and the run store the
engine and workers use, over 16 logical shards on one or more primaries.

Every run-path method works on batches (arrays of hundreds of rows, one statement each). What a
row becomes after an event is decided by ``core.lifecycle`` from the row as it is under lock, in
the same transaction as the write.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import secrets
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import asyncpg

from duetime.core import codec, jitter
from duetime.core.backfill import plan_backfill
from duetime.core.errors import Conflict, InvalidRequest, NotFound, StorageUnavailable
from duetime.core.ids import SHARDS, new_job_id, shard_of
from duetime.core.lifecycle import (
    OVERLAP_SKIP_REASON,
    OWNER_TRANSITIONS,
    RowPlan,
    after_attempt,
    after_occurrence_attempt,
    initial_plan,
    split_point,
    start_manual,
)
from duetime.core.model import Job, JobSpec, JobState, Outcome, Overlap, Run
from duetime.core.schedule import next_occurrence
from duetime.storage.base import Backfill, IdempotencyRequest, Page
from duetime.storage.queries import Q
from duetime.storage.shardmap import ShardMap

log = logging.getLogger("duetime.storage")

_MAX_UUID = uuid.UUID(int=(1 << 128) - 1)
_NIL_UUID = uuid.UUID(int=0)
_MAX_RUN_ID = (1 << 63) - 1
NOTIFY_CHANNEL = "duetime_due"

# SQLSTATE classes that mean "the database is not there or will not take writes now".
_UNAVAILABLE_STATES = ("08", "57", "53", "25006", "40001", "40P01")


def _utcnow() -> datetime:
    return datetime.now(UTC)


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
async def _translated() -> AsyncIterator[None]:
    """Database failures become StorageUnavailable at the seam; nothing was acknowledged."""
    try:
        yield
    except (asyncpg.PostgresError, OSError, asyncpg.exceptions.InterfaceError, TimeoutError) as exc:
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


def _hash_key(api_key: str) -> bytes:
    return hashlib.sha256(api_key.encode()).digest()


def _encode_cursor(value: bytes) -> str:
    return base64.urlsafe_b64encode(value).decode().rstrip("=")


def _decode_cursor(cursor: str, size: int) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest(
            "cursor is not one this server issued; pass next_cursor from the previous page unchanged",
            code="invalid_cursor",
            field="cursor",
        ) from exc
    if len(raw) != size:
        raise InvalidRequest(
            "cursor is not one this server issued; pass next_cursor from the previous page unchanged",
            code="invalid_cursor",
            field="cursor",
        )
    return raw


def _plan_of(row: asyncpg.Record) -> RowPlan:
    return RowPlan(
        state=JobState(row["state"]),
        next_run_at=row["next_run_at"],
        scheduled_for=row["scheduled_for"],
        attempt=row["attempt"],
        run_kind=row["run_kind"],
        resume_at=row["resume_at"],
        pending_triggers=tuple(sorted(row["pending_triggers"] or ())),
        handed_upto=row["handed_upto"],
    )


def job_from_row(row: asyncpg.Record) -> Job:
    last = row["last_run"]
    return Job(
        id=str(row["job_id"]),
        owner=row["owner"],
        spec=codec.spec_from_json(row["spec"]),
        state=JobState(row["state"]),
        next_run_at=row["next_run_at"] if row["state"] in ("scheduled", "paused") else None,
        attempt=row["attempt"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        last_run=codec.run_from_json(last) if last else None,
    )


def _run_from_row(row: asyncpg.Record) -> Run:
    return Run(
        scheduled_for=row["scheduled_for"],
        attempt=row["attempt"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        outcome=Outcome(row["outcome"]),
        status_code=row["status_code"],
        error=row["error"],
        lateness_ms=row["lateness_ms"],
    )


class _InsertBatcher:
    """Coalesces concurrent creates on one database into multi-row INSERTs.

    Registering thousands of jobs a second one statement each spends most of the API's time in
    round trips and commits. Each create joins the pending list; up to ``max_inflight`` writers
    take everything pending (at most ``max_rows``) into one statement, so a burst of POSTs costs a
    few statements and commits. A caller's answer waits for its own row's commit: nothing is
    acknowledged before it is durable. Writers run as their own tasks, so a client that hangs up
    cannot cancel a statement that carries other clients' rows.
    """

    def __init__(self, pool: asyncpg.Pool, *, max_rows: int = 500, max_inflight: int = 4) -> None:
        self._pool = pool
        self._max_rows = max_rows
        self._max_inflight = max_inflight
        self._pending: list[tuple[tuple[Any, ...], asyncio.Future[None]]] = []
        self._running = 0
        self._writers: set[asyncio.Task[None]] = set()

    async def insert(self, args: tuple[Any, ...]) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._pending.append((args, fut))
        if self._running < self._max_inflight:
            self._running += 1
            writer = loop.create_task(self._drain())
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)
        await fut

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch = self._pending[: self._max_rows]
                del self._pending[: len(batch)]
                cols = list(zip(*(a for a, _ in batch), strict=True))
                try:
                    async with _translated():
                        await self._pool.execute(Q["insert_jobs"], *[list(c) for c in cols])
                except BaseException as exc:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                else:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_result(None)
        finally:
            self._running -= 1


@dataclass(slots=True)
class _Action:
    """One owner action in progress: its connection, the locked row, and whom to wake after."""

    conn: asyncpg.Connection
    row: asyncpg.Record
    wake: RowPlan | None = None


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


@dataclass(frozen=True, slots=True)
class AttemptReport:
    """What a worker saw: one attempt's outcome, to be finished under the lease it ran with."""

    job_id: uuid.UUID
    shard: int
    lease_token: int
    spec_version: int
    attempt: int
    scheduled_for: datetime
    due_at: datetime
    started_at: datetime | None
    finished_at: datetime
    outcome: Outcome
    retryable: bool
    status_code: int | None = None
    error: str | None = None
    # The spec the attempt ran with, parsed, and its text as the fence read it: the completion
    # reuses it when the row's spec text is still the same, instead of decoding the JSON again.
    spec: JobSpec | None = None
    spec_text: str = ""


@dataclass(frozen=True, slots=True)
class MissedSkip:
    """A claimed row whose missed occurrences the policy skips: record them, move on to ``next``."""

    job_id: uuid.UUID
    shard: int
    lease_token: int
    skipped: tuple[datetime, ...]
    next_scheduled_for: datetime | None


# What a fenced write is about: an attempt to finish, or missed occurrences to skip.
_Leased = TypeVar("_Leased", AttemptReport, MissedSkip)


@dataclass(slots=True)
class CompletionStats:
    applied: int = 0
    stale: int = 0
    history: int = 0


class PostgresStore:
    """Registry + run store on asyncpg pools, one pool per distinct database in the shard map."""

    def __init__(self, shard_map: ShardMap, pools: dict[str, asyncpg.Pool], notify_horizon_s: float) -> None:
        self.shard_map = shard_map
        self._pools = pools
        self._notify_horizon = timedelta(seconds=notify_horizon_s)
        self._notify_pending: set[int] = set()
        self._inserters = {dsn: _InsertBatcher(pool) for dsn, pool in pools.items()}
        self._notify_task: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, shard_map: ShardMap, *, pool_size: int = 10, notify_horizon_s: float = 300.0
    ) -> PostgresStore:
        pools: dict[str, asyncpg.Pool] = {}
        try:
            async with _translated():
                for dsn in shard_map.databases():
                    pools[dsn] = await asyncpg.create_pool(
                        dsn,
                        min_size=1,
                        max_size=pool_size,
                        init=_init_connection,
                        max_inactive_connection_lifetime=300,
                        reset=_no_reset,
                    )
        except BaseException:
            for pool in pools.values():
                await pool.close()
            raise
        return cls(shard_map, pools, notify_horizon_s)

    async def close(self) -> None:
        if self._notify_task is not None:
            await self._notify_task
        for pool in self._pools.values():
            await pool.close()

    def pool_for_shard(self, shard: int) -> asyncpg.Pool:
        return self._pools[self.shard_map.dsn_for(shard)]

    def pool_for_dsn(self, dsn: str) -> asyncpg.Pool:
        return self._pools[dsn]

    @property
    def home_pool(self) -> asyncpg.Pool:
        return self._pools[self.shard_map.home]

    # ------------------------------------------------------------------ registry (API side)

    async def create_job(
        self, owner: str, spec: JobSpec, *, idempotency: IdempotencyRequest | None = None
    ) -> tuple[Job, bool]:
        now = _utcnow()
        if idempotency is not None:
            shard = zlib.crc32(f"{owner}\x00{idempotency.key}".encode()) % SHARDS
            job_id = new_job_id(shard)
        else:
            job_id = new_job_id()
            shard = shard_of(job_id)
        plan = initial_plan(job_id, spec, now)
        args = (
            job_id,
            shard,
            owner,
            codec.spec_to_json(spec),
            plan.state.value,
            plan.next_run_at,
            plan.scheduled_for,
            plan.attempt,
            now,
            split_point(spec, plan),
        )
        if idempotency is None:
            await self._inserters[self.shard_map.dsn_for(shard)].insert(args)
            self._maybe_notify(shard, plan, now)
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
        async with _translated(), self.pool_for_shard(shard).acquire() as conn, conn.transaction():
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
        self._maybe_notify(shard, plan, now)
        return job_from_row(row), True

    def _maybe_notify(self, shard: int, plan: RowPlan, now: datetime) -> None:
        """Wake the engines of this shard when the row is due inside their lookahead.

        A hint, sent after commit and coalesced: one NOTIFY statement carries every shard that
        became due-soon since the last one, so registering thousands of jobs a second does not
        put a NOTIFY (and its commit-time queue lock) in every transaction. A lost hint costs at
        most one poll interval.
        """
        if (
            plan.state == JobState.SCHEDULED
            and plan.next_run_at is not None
            and plan.next_run_at <= now + self._notify_horizon
        ):
            self._notify_pending.add(shard)
            if self._notify_task is None or self._notify_task.done():
                self._notify_task = asyncio.get_running_loop().create_task(self._send_notifies())

    def _hint(self, shards: Iterable[int]) -> None:
        """Wake the engines of these shards: a run there became due now."""
        for shard in shards:
            self._notify_pending.add(shard)
        if self._notify_pending and (self._notify_task is None or self._notify_task.done()):
            self._notify_task = asyncio.get_running_loop().create_task(self._send_notifies())

    async def _send_notifies(self) -> None:
        while self._notify_pending:
            pending, self._notify_pending = self._notify_pending, set()
            by_db: dict[str, list[str]] = {}
            for shard in pending:
                by_db.setdefault(self.shard_map.dsn_for(shard), []).append(str(shard))
            for dsn, shards in by_db.items():
                try:
                    await self._pools[dsn].execute(Q["notify_due"], shards)
                except Exception as exc:  # a hint; the poll interval covers a lost one
                    log.debug("NOTIFY failed: %s", exc)

    async def get_job(self, owner: str, job_id: uuid.UUID) -> Job:
        async with _translated():
            row = await self.pool_for_shard(shard_of(job_id)).fetchrow(Q["get_job"], job_id, owner)
        if row is None:
            raise NotFound(f"no job {job_id}", ident=str(job_id))
        return job_from_row(row)

    async def list_jobs(
        self, owner: str, *, state: JobState | None, limit: int, cursor: str | None
    ) -> Page[Job]:
        after = uuid.UUID(bytes=_decode_cursor(cursor, 16)) if cursor else _NIL_UUID
        rows: list[asyncpg.Record] = []
        async with _translated():
            for pool in self._pools.values():
                if state is None:
                    rows.extend(await pool.fetch(Q["list_jobs"], owner, after, limit + 1))
                else:
                    rows.extend(
                        await pool.fetch(Q["list_jobs_by_state"], owner, state.value, after, limit + 1)
                    )
        rows.sort(key=lambda r: r["job_id"])
        page = rows[:limit]
        next_cursor = _encode_cursor(page[-1]["job_id"].bytes) if len(rows) > limit else None
        return Page([job_from_row(r) for r in page], next_cursor)

    @asynccontextmanager
    async def _locked(self, owner: str, job_id: uuid.UUID) -> AsyncIterator[_Action]:
        """The job's row under lock for one owner action; engines are woken after the commit."""
        async with _translated(), self.pool_for_shard(shard_of(job_id)).acquire() as conn:
            async with conn.transaction():
                row = await conn.fetchrow(Q["lock_job"], job_id, owner)
                if row is None:
                    raise NotFound(f"no job {job_id}", ident=str(job_id))
                action = _Action(conn, row)
                yield action
            if action.wake is not None:
                self._maybe_notify(row["shard"], action.wake, _utcnow())

    @staticmethod
    def _require(action: str, row: asyncpg.Record) -> None:
        state = JobState(row["state"])
        if state not in OWNER_TRANSITIONS[action]:
            raise Conflict(
                f"cannot {action} a job that is {state.value}"
                + {
                    "completed": "; a completed job stays completed, create a new one",
                    "cancelled": "; a cancelled job stays cancelled, create a new one",
                    "dead": "; replay it first (POST /v1/jobs/{id}/replay)",
                    "paused": "; resume it first (POST /v1/jobs/{id}/resume)",
                    "scheduled": "",
                }[state.value],
                code=f"job_{state.value}",
            )

    async def _write(
        self,
        action: _Action,
        *,
        spec: dict[str, Any] | None = None,
        spec_version: int | None = None,
        plan: RowPlan,
        revoke: bool,
    ) -> Job:
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
        )
        action.wake = plan
        return job_from_row(out)

    async def update_job(self, owner: str, job_id: uuid.UUID, spec: JobSpec) -> Job:
        new_json = codec.spec_to_json(spec)
        async with self._locked(owner, job_id) as action:
            row = action.row
            self._require("update", row)
            old = row["spec"]
            timing_changed = (
                old["schedule"] != new_json["schedule"] or old["jitter_s"] != new_json["jitter_s"]
            )
            plan = _plan_of(row)
            version = row["spec_version"]
            if timing_changed:
                version += 1
                fresh = initial_plan(job_id, spec, _utcnow())
                keep_state = JobState(row["state"])
                plan = replace(fresh, pending_triggers=plan.pending_triggers)
                if keep_state in (JobState.PAUSED, JobState.DEAD) and plan.state == JobState.SCHEDULED:
                    plan = replace(plan, state=keep_state)
            if new_json != old:
                await action.conn.execute(Q["cascade_spec"], job_id, new_json)
            if timing_changed:
                await action.conn.execute(Q["drop_split_occurrences"], job_id)
            return await self._write(
                action, spec=new_json, spec_version=version, plan=plan, revoke=timing_changed
            )

    async def cancel_job(self, owner: str, job_id: uuid.UUID) -> Job:
        async with self._locked(owner, job_id) as action:
            row = action.row
            if row["state"] == JobState.CANCELLED.value:
                return job_from_row(row)
            plan = replace(_plan_of(row), state=JobState.CANCELLED, next_run_at=None, pending_triggers=())
            await action.conn.fetch(Q["cascade_state"], job_id, JobState.CANCELLED.value)
            await action.conn.execute(Q["drop_idle_occurrences"], job_id)
            return await self._write(action, plan=plan, revoke=True)

    async def pause_job(self, owner: str, job_id: uuid.UUID) -> Job:
        async with self._locked(owner, job_id) as action:
            row = action.row
            self._require("pause", row)
            if row["state"] == JobState.PAUSED.value:
                return job_from_row(row)
            plan = replace(_plan_of(row), state=JobState.PAUSED)
            await action.conn.fetch(Q["cascade_state"], job_id, JobState.PAUSED.value)
            return await self._write(action, plan=plan, revoke=True)

    async def resume_job(self, owner: str, job_id: uuid.UUID) -> Job:
        async with self._locked(owner, job_id) as action:
            row = action.row
            self._require("resume", row)
            if row["state"] == JobState.SCHEDULED.value:
                return job_from_row(row)
            # Occurrences missed while paused are left overdue on purpose: the claim applies the
            # job's misfire policy to them, the same rule as after an outage.
            plan = replace(_plan_of(row), state=JobState.SCHEDULED)
            await action.conn.fetch(Q["cascade_state"], job_id, JobState.SCHEDULED.value)
            return await self._write(action, plan=plan, revoke=False)

    async def trigger_job(self, owner: str, job_id: uuid.UUID) -> Job:
        now = _utcnow()
        async with self._locked(owner, job_id) as action:
            row = action.row
            self._require("trigger", row)
            plan = _plan_of(row)
            if row["phase"] == "idle" and plan.attempt == 0 and plan.run_kind == "scheduled":
                plan = start_manual(plan, now)
                revoke = False
            else:
                # A run is in the wheel, in flight, or waiting for a retry: queue the trigger; it
                # starts as soon as that run's occurrence is over.
                plan = replace(plan, pending_triggers=(*plan.pending_triggers, now))
                revoke = False
            return await self._write(action, plan=plan, revoke=revoke)

    async def replay_job(self, owner: str, job_id: uuid.UUID) -> Job:
        now = _utcnow()
        async with self._locked(owner, job_id) as action:
            row = action.row
            self._require("replay", row)
            plan = replace(
                _plan_of(row), state=JobState.SCHEDULED, attempt=0, next_run_at=now, run_kind="scheduled"
            )
            return await self._write(action, plan=plan, revoke=False)

    async def backfill_job(
        self,
        owner: str,
        job_id: uuid.UUID,
        start: datetime,
        end: datetime,
        *,
        max_occurrences: int,
        pace_per_s: float,
    ) -> Backfill:
        now = _utcnow()
        async with self._locked(owner, job_id) as action:
            row, conn = action.row, action.conn
            self._require("backfill", row)
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
            if pending + len(runs) > max_occurrences:
                raise Conflict(
                    f"this job has {pending} backfilled or overlapping runs not finished yet and at "
                    f"most {max_occurrences} may wait at a time; wait for them, or ask for at most "
                    f"{max(max_occurrences - pending, 0)} occurrences",
                    code="backfill_in_progress",
                )
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
                action.wake = RowPlan(
                    state=JobState.SCHEDULED, next_run_at=now, scheduled_for=None, attempt=0
                )
        return Backfill(
            queued=len(runs),
            first=runs[0].scheduled_for if runs else None,
            last=runs[-1].scheduled_for if runs else None,
        )

    async def list_runs(self, owner: str, job_id: uuid.UUID, *, limit: int, cursor: str | None) -> Page[Run]:
        before = int.from_bytes(_decode_cursor(cursor, 8), "big") if cursor else _MAX_RUN_ID
        if before > _MAX_RUN_ID:
            raise InvalidRequest(
                "cursor is not one this server issued; pass next_cursor from the previous page unchanged",
                code="invalid_cursor",
                field="cursor",
            )
        pool = self.pool_for_shard(shard_of(job_id))
        async with _translated():
            if await pool.fetchval(Q["job_exists"], job_id, owner) is None:
                raise NotFound(f"no job {job_id}", ident=str(job_id))
            rows = await pool.fetch(Q["list_runs"], job_id, before, limit + 1)
        page = rows[:limit]
        next_cursor = _encode_cursor(page[-1]["run_id"].to_bytes(8, "big")) if len(rows) > limit else None
        return Page([_run_from_row(r) for r in page], next_cursor)

    async def count_active_jobs(self, owner: str) -> int:
        total = 0
        async with _translated():
            for pool in self._pools.values():
                total += await pool.fetchval(Q["count_active_jobs"], owner)
        return total

    async def owner_for_key(self, api_key: str) -> str | None:
        async with _translated():
            owner: str | None = await self.home_pool.fetchval(Q["owner_for_key"], _hash_key(api_key))
        return owner

    async def create_api_key(self, owner: str) -> tuple[str, str]:
        from duetime.core.signing import new_signing_secret

        api_key = "dt_" + secrets.token_urlsafe(24)  # 192 random bits
        async with _translated(), self.home_pool.acquire() as conn, conn.transaction():
            await conn.execute(Q["insert_owner"], owner, new_signing_secret())
            await conn.execute(Q["insert_api_key"], _hash_key(api_key), api_key[:10], owner)
            secret: str = await conn.fetchval(Q["signing_secret"], owner)
        return api_key, secret

    async def revoke_api_key(self, api_key_or_prefix: str) -> int:
        async with _translated():
            status: str = await self.home_pool.execute(
                Q["revoke_api_key"], _hash_key(api_key_or_prefix), api_key_or_prefix
            )
        return int(status.rsplit(maxsplit=1)[-1])

    async def signing_secret(self, owner: str) -> str | None:
        async with _translated():
            secret: str | None = await self.home_pool.fetchval(Q["signing_secret"], owner)
        return secret

    async def ping(self) -> None:
        async with _translated():
            for pool in self._pools.values():
                await pool.fetchval(Q["db_now"])

    # ------------------------------------------------------------------ run store (engine side)

    async def claim_due(
        self, shard: int, engine_id: str, *, lookahead_s: float, lease_s: float, limit: int
    ) -> list[ClaimedRow]:
        async with _translated():
            rows = await self.pool_for_shard(shard).fetch(
                Q["claim_due"], shard, engine_id, float(lookahead_s), limit, float(lease_s)
            )
        return [_claimed(r) for r in rows]

    async def retake_claims(
        self, engine_id: str, shards: Sequence[int], *, lease_s: float
    ) -> list[ClaimedRow]:
        out: list[ClaimedRow] = []
        async with _translated():
            for dsn, held in self.shard_map.databases().items():
                mine = [s for s in held if s in shards]
                if mine:
                    rows = await self._pools[dsn].fetch(Q["retake_claims"], engine_id, mine, float(lease_s))
                    out.extend(_claimed(r) for r in rows)
        return out

    def _by_db(self, shards_ids: Iterable[tuple[int, Any]]) -> dict[str, list[Any]]:
        grouped: dict[str, list[Any]] = {}
        for shard, item in shards_ids:
            grouped.setdefault(self.shard_map.dsn_for(shard), []).append(item)
        return grouped

    async def fence_runs(
        self, items: Sequence[tuple[uuid.UUID, int, int, datetime]], *, lease_s: float
    ) -> list[FencedRow]:
        """items: (job_id, shard, lease_token, scheduled_for). Returns those that may be called."""
        out: list[FencedRow] = []
        async with _translated():
            for dsn, group in self._by_db((s, (j, t, sf)) for j, s, t, sf in items).items():
                rows = await self._pools[dsn].fetch(
                    Q["fence_runs"],
                    [g[0] for g in group],
                    [g[1] for g in group],
                    float(lease_s),
                    [g[2] for g in group],
                )
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
        async with _translated():
            for dsn, group in self._by_db((s, (j, t)) for j, s, t in items).items():
                rows = await self._pools[dsn].fetch(
                    Q["extend_leases"], [g[0] for g in group], [g[1] for g in group], float(lease_s)
                )
                held.update(r["job_id"] for r in rows)
        return held

    async def keep_waiting_claims(
        self, shard: int, engine_id: str, *, within_s: float, extend_s: float, limit: int
    ) -> int:
        """Extend the leases of ``engine_id``'s claims on ``shard`` that would lapse within
        ``within_s``, by ``extend_s`` from now; at most ``limit`` rows. Returns how many."""
        async with _translated():
            status: str = await self.pool_for_shard(shard).execute(
                Q["keep_waiting_claims"], shard, engine_id, float(within_s), float(extend_s), limit
            )
        return int(status.rsplit(" ", 1)[-1])

    async def release_claims(self, items: Sequence[tuple[uuid.UUID, int, int]]) -> int:
        released = 0
        async with _translated():
            for dsn, group in self._by_db((s, (j, t)) for j, s, t in items).items():
                rows = await self._pools[dsn].fetch(
                    Q["release_claims"], [g[0] for g in group], [g[1] for g in group]
                )
                released += len(rows)
        return released

    async def complete_runs(self, reports: Sequence[AttemptReport]) -> CompletionStats:
        """Finish attempts under their leases, in one transaction per database.

        A report whose token no longer matches (the lease lapsed and was taken over, or the
        owner revoked it) changes nothing and is counted as stale.
        """
        return await self._under_lease(
            reports, lambda phase: phase != "idle", lambda w, row, rep, now: w.finish(row, rep, now)
        )

    async def skip_missed(self, items: Sequence[MissedSkip]) -> CompletionStats:
        """Record skipped occurrences and move claimed rows on to their next occurrence."""
        return await self._under_lease(
            items, lambda phase: phase == "claimed", lambda w, row, item, now: w.skip(row, item, now)
        )

    async def _under_lease(
        self,
        items: Sequence[_Leased],
        phase_ok: Callable[[str], bool],
        apply: Callable[[_BatchWriter, asyncpg.Record, _Leased, datetime], None],
    ) -> CompletionStats:
        """The fenced write shared by completions and skips: lock the rows, drop the items whose
        lease no longer holds (counted stale), let ``apply`` decide the rest, write in one go."""
        stats = CompletionStats()
        now = _utcnow()
        async with _translated():
            for dsn, group in self._by_db((i.shard, i) for i in items).items():
                async with self._pools[dsn].acquire() as conn:
                    writer = _BatchWriter()
                    async with conn.transaction():
                        rows = {
                            r["job_id"]: r
                            for r in await conn.fetch(Q["lock_for_completion"], [g.job_id for g in group])
                        }
                        for item in group:
                            row = rows.get(item.job_id)
                            if (
                                row is None
                                or row["lease_token"] != item.lease_token
                                or not phase_ok(row["phase"])
                                or item.job_id in writer.seen
                            ):
                                stats.stale += 1
                                continue
                            apply(writer, row, item, now)
                        await writer.flush(conn)
                    stats.applied += len(writer.seen)
                    stats.history += writer.history_count
                    self._hint(await writer.after_commit(conn))
        return stats

    async def rescue_expired(self, shard: int, *, limit: int) -> CompletionStats:
        """The janitor: rows whose lease lapsed become due again. A claimed row that never fired
        is released as it was; a running one had an attempt whose outcome nobody recorded, so it
        is finished as ``lease_expired`` and retried under the job's policy."""
        async with _translated(), self.pool_for_shard(shard).acquire() as conn:
            async with conn.transaction():
                ids = [r["job_id"] for r in await conn.fetch(Q["expired_leases"], shard, limit)]
                if not ids:
                    return CompletionStats()
                stats, writer = await self._expire(conn, ids)
            self._hint(await writer.after_commit(conn))
            return stats

    async def expire_running_of(self, engine_id: str, shards: Sequence[int]) -> CompletionStats:
        """On restart: calls this engine had in flight when it died have unknown outcomes."""
        total = CompletionStats()
        async with _translated():
            for dsn, held in self.shard_map.databases().items():
                mine = [s for s in held if s in shards]
                if not mine:
                    continue
                async with self._pools[dsn].acquire() as conn:
                    async with conn.transaction():
                        ids = [r["job_id"] for r in await conn.fetch(Q["running_of_engine"], engine_id, mine)]
                        if not ids:
                            continue
                        stats, writer = await self._expire(conn, ids)
                        total.applied += stats.applied
                        total.history += stats.history
                    self._hint(await writer.after_commit(conn))
        return total

    async def _expire(
        self, conn: asyncpg.Connection, ids: list[uuid.UUID]
    ) -> tuple[CompletionStats, _BatchWriter]:
        now = _utcnow()
        writer = _BatchWriter()
        for row in await conn.fetch(Q["lock_for_completion"], ids):
            if row["phase"] == "claimed":
                writer.release(row)
                continue
            if row["phase"] != "running":
                continue
            rep = AttemptReport(
                job_id=row["job_id"],
                shard=row["shard"],
                lease_token=row["lease_token"],
                spec_version=row["spec_version"],
                attempt=row["attempt"] + 1,
                scheduled_for=row["scheduled_for"],
                due_at=row["next_run_at"],
                started_at=None,
                finished_at=now,
                outcome=Outcome.LEASE_EXPIRED,
                retryable=True,
                error="the lease lapsed before an outcome was recorded (worker or engine died or stalled)",
            )
            writer.finish(row, rep, now)
        await writer.flush(conn)
        return CompletionStats(applied=len(writer.seen), history=writer.history_count), writer

    async def split_overlapping(self, shard: int, *, horizon_s: float, limit: int = 500) -> int:
        """overlap=allow: every row whose run is still in flight when its next occurrence comes
        due (within ``horizon_s``) hands that occurrence to an occurrence row of its own, due at
        its own instant, claimed and fired like any row. Returns how many were handed out."""
        async with _translated(), self.pool_for_shard(shard).acquire() as conn, conn.transaction():
            rows = await conn.fetch(Q["overlap_due"], shard, float(horizon_s), limit)
            if not rows:
                return 0
            occurrence_ids, dues, handed, following = [], [], [], []
            for r in rows:
                spec = codec.spec_from_json(r["spec"])
                occ: datetime = r["split_at"]
                occurrence_ids.append(new_job_id(shard))
                dues.append(jitter.due_at(r["job_id"], occ, spec.jitter_s))
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
        async with _translated():
            rows = await self.pool_for_shard(shard).fetch(Q["complete_drained_jobs_of_shard"], shard)
        return len(rows)

    async def release_stalled_backfills(self, shard: int) -> int:
        async with _translated():
            rows = await self.pool_for_shard(shard).fetch(Q["release_stalled_backfills"], shard)
        return len(rows)

    async def db_now(self, shard: int = 0) -> datetime:
        async with _translated():
            now: datetime = await self.pool_for_shard(shard).fetchval(Q["db_now"])
        return now

    async def purge_idempotency_keys(self, older_than_s: float) -> None:
        async with _translated():
            for pool in self._pools.values():
                await pool.execute(Q["purge_idempotency_keys"], float(older_than_s))


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


def _hold(spec: JobSpec, plan: RowPlan) -> bool:
    """A recurring job whose schedule just ended: completed only once no occurrence row is left."""
    return spec.recurring and plan.state is JobState.COMPLETED


def _locked_spec(row: asyncpg.Record, rep: AttemptReport | None) -> JobSpec:
    """The spec of a row read by ``lock_for_completion`` (as text): the attempt's own parsed spec
    when the text is unchanged since its fence, otherwise decoded from the row."""
    text: str = row["spec"]
    if rep is not None and rep.spec is not None and rep.spec_text and rep.spec_text == text:
        return rep.spec
    return codec.spec_from_json(json.loads(text))


class _BatchWriter:
    """Collects the row updates and history of one transaction and writes each as one statement.

    Occurrence rows (overlap=allow, backfill) are finished here too: their history goes under the
    parent's id, a finished one is deleted, and what must touch the parent or the occurrence's
    siblings (the job's ``last_run``, the next backfilled run) is kept for ``after_commit``.
    """

    def __init__(self) -> None:
        self.seen: set[uuid.UUID] = set()
        # (job id, plan, consumed trigger, last_run, split_at, hold: see apply_plans)
        self.plans: list[
            tuple[uuid.UUID, RowPlan, datetime | None, dict[str, Any] | None, datetime | None, bool]
        ] = []
        self.runs: list[tuple[Any, ...]] = []
        self.history_count = 0
        self.finished_occurrences: list[uuid.UUID] = []
        self.parent_last: dict[uuid.UUID, dict[str, Any]] = {}
        self.backfill_parents: set[uuid.UUID] = set()

    def _history(self, row: asyncpg.Record, run: Run, fencing_token: int) -> dict[str, Any]:
        self.runs.append(
            (
                row["parent_id"] or row["job_id"],
                row["shard"],
                run.scheduled_for,
                run.attempt,
                run.started_at,
                run.finished_at,
                run.outcome.value,
                run.status_code,
                run.error,
                run.lateness_ms,
                fencing_token,
            )
        )
        self.history_count += 1
        return codec.run_to_json(run)

    def finish(self, row: asyncpg.Record, rep: AttemptReport, now: datetime) -> None:
        self.seen.add(rep.job_id)
        spec = _locked_spec(row, rep)
        parent = row["parent_id"]
        lateness = None
        if rep.started_at is not None:
            nominal_due = jitter.due_at(parent or rep.job_id, rep.scheduled_for, spec.jitter_s)
            lateness = int((rep.started_at - nominal_due).total_seconds() * 1000)
        run = Run(
            scheduled_for=rep.scheduled_for,
            attempt=rep.attempt,
            started_at=rep.started_at,
            finished_at=rep.finished_at,
            outcome=rep.outcome,
            status_code=rep.status_code,
            error=rep.error,
            lateness_ms=lateness,
        )
        last = self._history(row, run, rep.lease_token)
        current = _plan_of(row)
        if parent is not None:
            self.parent_last[parent] = last
            nxt = after_occurrence_attempt(
                spec,
                current,
                attempt=rep.attempt,
                outcome=rep.outcome,
                retryable=rep.retryable,
                now=now,
            )
            if nxt is None:
                self.finished_occurrences.append(rep.job_id)
                if row["backfill_seq"] is not None:
                    self.backfill_parents.add(parent)
            else:
                self.plans.append((rep.job_id, nxt, None, last, None, False))
            return
        if row["spec_version"] != rep.spec_version:
            # The schedule was replaced while this attempt ran: the owner's new plan stands.
            self.plans.append((rep.job_id, current, None, last, split_point(spec, current), False))
            return
        plan = after_attempt(
            rep.job_id,
            spec,
            current,
            attempt=rep.attempt,
            outcome=rep.outcome,
            retryable=rep.retryable,
            now=now,
        )
        if plan.overlap_skipped:
            last = self._overlap_skips(row, plan, spec.overlap.value, now) or last
        consumed = None
        if len(plan.pending_triggers) < len(current.pending_triggers):
            consumed = current.pending_triggers[0]
        self.plans.append((rep.job_id, plan, consumed, last, split_point(spec, plan), _hold(spec, plan)))

    def _overlap_skips(
        self, row: asyncpg.Record, plan: RowPlan, policy: str, now: datetime
    ) -> dict[str, Any] | None:
        """Occurrences that came due while the run was in flight and the policy passes over."""
        reason = OVERLAP_SKIP_REASON.format(policy=policy)
        last_reason = reason
        if plan.overlap_unrecorded:
            last_reason += (
                f"; {plan.overlap_unrecorded} later occurrences were skipped too, not recorded one by one"
            )
        return self._skipped(row, plan.overlap_skipped, reason, now, last_reason=last_reason)

    def _skipped(
        self,
        row: asyncpg.Record,
        occurrences: Sequence[datetime],
        reason: str,
        now: datetime,
        *,
        last_reason: str | None = None,
    ) -> dict[str, Any] | None:
        """History rows for occurrences that did not run; the last one's JSON (for last_run)."""
        last = None
        for i, occurrence in enumerate(occurrences):
            error = last_reason if last_reason is not None and i == len(occurrences) - 1 else reason
            last = self._history(
                row,
                Run(
                    scheduled_for=occurrence,
                    attempt=0,
                    started_at=None,
                    finished_at=now,
                    outcome=Outcome.SKIPPED,
                    error=error,
                ),
                row["lease_token"],
            )
        return last

    def skip(self, row: asyncpg.Record, item: MissedSkip, now: datetime) -> None:
        self.seen.add(item.job_id)
        last = self._skipped(
            row,
            item.skipped,
            "missed while the system was down or the job paused; skipped by the job's misfire policy",
            now,
        )
        spec = _locked_spec(row, None)
        current = _plan_of(row)
        if item.next_scheduled_for is None:
            plan = replace(current, state=JobState.COMPLETED, next_run_at=None, attempt=0)
        else:
            plan = replace(
                current,
                next_run_at=jitter.due_at(item.job_id, item.next_scheduled_for, spec.jitter_s),
                scheduled_for=item.next_scheduled_for,
                attempt=0,
            )
        self.plans.append((item.job_id, plan, None, last, split_point(spec, plan), _hold(spec, plan)))

    def release(self, row: asyncpg.Record) -> None:
        self.seen.add(row["job_id"])
        self.plans.append((row["job_id"], _plan_of(row), None, None, row["split_at"], False))

    async def flush(self, conn: asyncpg.Connection) -> None:
        if self.plans:
            p = self.plans
            await conn.execute(
                Q["apply_plans"],
                [x[0] for x in p],
                [x[1].state.value for x in p],
                [x[1].next_run_at for x in p],
                [x[1].scheduled_for for x in p],
                [x[1].attempt for x in p],
                [x[1].run_kind for x in p],
                [x[1].resume_at for x in p],
                [x[2] is not None for x in p],
                [x[2] for x in p],
                [x[3] for x in p],
                [x[4] for x in p],
                [x[1].handed_upto for x in p],
                [x[5] for x in p],
            )
        if self.runs:
            cols = list(zip(*self.runs, strict=True))
            await conn.execute(Q["insert_runs"], *[list(c) for c in cols])
        if self.finished_occurrences:
            await conn.execute(Q["delete_occurrences"], self.finished_occurrences)

    async def after_commit(self, conn: asyncpg.Connection) -> set[int]:
        """What touches rows other than the ones locked: in statements of their own, after the
        commit, so they never take locks in the opposite order of an owner action. Losing them
        to a crash costs a stale ``last_run`` (the history has the run) or a backfilled run that
        waits for the janitor's next round. Returns the shards that have a run due now."""
        shards: set[int] = set()
        if self.backfill_parents:
            rows = await conn.fetch(Q["release_next_backfill"], list(self.backfill_parents))
            shards = {r["shard"] for r in rows}
        if self.parent_last:
            parents = list(self.parent_last)
            await conn.execute(Q["parent_last_run"], parents, list(self.parent_last.values()))
            await conn.execute(Q["complete_drained_jobs"], parents)
        return shards


# ---------------------------------------------------------------------- run queue across processes


async def take_runs(
    store: PostgresStore,
    items: Sequence[tuple[uuid.UUID, int, int, str]],
    *,
    holder: str,
    lease_s: float,
) -> set[tuple[uuid.UUID, int]]:
    """items: (job_id, shard, lease_token, publishing engine). The worker ``holder`` takes the
    leases of those still running under that token and engine; returns the (id, token) pairs it
    now holds — by pair, since a stale message may carry the same id with an older token."""
    taken: set[tuple[uuid.UUID, int]] = set()
    async with _translated():
        for dsn, group in store._by_db((s, (j, t, p)) for j, s, t, p in items).items():
            rows = await store.pool_for_dsn(dsn).fetch(
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
    store: PostgresStore, items: Sequence[tuple[uuid.UUID, int, int]], *, holder: str, lease_s: float
) -> set[uuid.UUID]:
    """items: (job_id, shard, lease_token). Extends the leases ``holder`` (an engine) still holds on
    runs it published; returns their ids. A run a worker took, or that finished, is not among them."""
    held: set[uuid.UUID] = set()
    async with _translated():
        for dsn, group in store._by_db((s, (j, t)) for j, s, t in items).items():
            rows = await store.pool_for_dsn(dsn).fetch(
                Q["extend_published"], [g[0] for g in group], [g[1] for g in group], holder, float(lease_s)
            )
            held.update(r["job_id"] for r in rows)
    return held


async def expire_published_of(store: PostgresStore, engine_id: str, shards: Sequence[int]) -> int:
    """Before a restarted engine starts (DUETIME_RUN_QUEUE=nats): runs its previous life fenced and
    no worker took are finished as ``lease_expired`` and retried, and their messages, if any, are
    dropped as stale. Race-free with a worker taking one of them at the same moment."""
    applied = 0
    async with _translated():
        for dsn, held in store.shard_map.databases().items():
            mine = [s for s in held if s in shards]
            if not mine:
                continue
            async with store.pool_for_dsn(dsn).acquire() as conn:
                async with conn.transaction():
                    ids = [r["job_id"] for r in await conn.fetch(Q["published_of_engine"], engine_id, mine)]
                    if not ids:
                        continue
                    stats, writer = await store._expire(conn, ids)
                    applied += stats.applied
                store._hint(await writer.after_commit(conn))
    return applied


# ---------------------------------------------------------------------- moving a logical shard


@dataclass(frozen=True, slots=True)
class ShardMoveReport:
    shard: int
    jobs: int
    runs: int
    idempotency_keys: int


_MOVE_TABLES: tuple[tuple[str, str, tuple[str, ...] | None], ...] = (
    ("jobs", "copy_out_jobs", None),
    (
        "runs",
        "copy_out_runs",
        (
            "job_id",
            "shard",
            "scheduled_for",
            "attempt",
            "started_at",
            "finished_at",
            "outcome",
            "status_code",
            "error",
            "lateness_ms",
            "fencing_token",
        ),
    ),
    ("idempotency_keys", "copy_out_idempotency_keys", ("owner", "key", "body_hash", "job_id", "created_at")),
)


async def _pipe_copy(
    src: asyncpg.Connection,
    dst: asyncpg.Connection,
    query: str,
    *,
    shard: int,
    table: str,
    columns: tuple[str, ...] | None,
) -> int:
    """COPY out of one connection straight into another, streamed (a shard may not fit in memory)."""
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)

    async def sink(chunk: bytes) -> None:
        await chunks.put(bytes(chunk))

    async def source() -> AsyncIterator[bytes]:
        while (chunk := await chunks.get()) is not None:
            yield chunk

    async def produce() -> None:
        try:
            await src.copy_from_query(query, shard, output=sink, format="binary")
        finally:
            await chunks.put(None)

    status = await asyncio.gather(
        produce(),
        dst.copy_to_table(
            table, source=source(), columns=list(columns) if columns else None, format="binary"
        ),
    )
    return int(str(status[1]).rsplit(" ", 1)[-1])


async def move_shard(shard: int, source_dsn: str, target_dsn: str) -> ShardMoveReport:
    """Copy every row of one logical shard from its database to another, then delete it at the
    source. Refuses while any of its rows is claimed or running (drain its engines first) and when
    the target already holds rows of the shard. Writes on the source wait while the copy runs."""
    if source_dsn == target_dsn:
        raise InvalidRequest(f"shard {shard} already lives in that database", code="same_database")
    async with _translated():
        src = await asyncpg.connect(source_dsn)
        try:
            dst = await asyncpg.connect(target_dsn)
            try:
                async with src.transaction():
                    await src.execute(Q["lock_for_shard_move"])
                    here = await src.fetchrow(Q["shard_rows"], shard)
                    if here["busy"]:
                        raise Conflict(
                            f"shard {shard} has {here['busy']} claimed or running rows: stop or restart "
                            "its engines without it (and let its workers finish) before moving it"
                        )
                    there = await dst.fetchrow(Q["shard_rows"], shard)
                    if there["total"] or await dst.fetchval(Q["shard_runs_count"], shard):
                        raise Conflict(
                            f"the target already holds rows of shard {shard}; a shard lives in one "
                            "database only (delete them there if they are a leftover of an earlier move)"
                        )
                    copied: dict[str, int] = {}
                    async with dst.transaction():
                        for table, query, columns in _MOVE_TABLES:
                            copied[table] = await _pipe_copy(
                                src, dst, Q[query], shard=shard, table=table, columns=columns
                            )
                        if copied["jobs"] != here["total"]:
                            raise Conflict(
                                f"copied {copied['jobs']} jobs of shard {shard} but the source has "
                                f"{here['total']}; nothing was changed"
                            )
                    await src.execute(Q["delete_shard_idempotency_keys"], shard)
                    await src.execute(Q["delete_shard_runs"], shard)
                    await src.execute(Q["delete_shard_jobs"], shard)
            finally:
                await dst.close()
        finally:
            await src.close()
    return ShardMoveReport(shard, copied["jobs"], copied["runs"], copied["idempotency_keys"])
