"""``MemoryStore``: the storage ports (``Registry``, ``RunStore``, ``EventOutbox``,
``FlowControl``, ``TargetHealth``, ``Membership``, ``Retention``, ``DueAge``) in memory, for
tests of what sits on top of storage (engine, workers, API) without a database.

Faithful, not approximate: it keeps the same rows PostgreSQL keeps (state, phase, lease token,
holder, lease expiry, occurrence rows, history), answers with the same records and errors, and
decides what a row becomes with the very code the PostgreSQL store uses (``core.lifecycle`` via
``storage.completion_rules``, and ``storage.registry_rules``); it imports neither asyncpg nor
``storage.postgres``. What SQL does in a
statement is done here between two awaits, which on one event loop is what a row lock and
``SKIP LOCKED`` give: no two claimers hold a row, a stale token changes nothing. Time is the
injected ``clock`` (database time and the store's own, as one), so a test lapses leases by
moving it. The contract suite in tests/contract/ runs the same cases against this store and
PostgreSQL; a difference is a bug in this file.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from duetime.core import codec, jitter, misfire
from duetime.core.backfill import plan_backfill, require_room
from duetime.core.changes import (
    AUTO_PAUSE_REASON,
    AUTO_RESUME_REASON,
    UNNAMED,
    ActorType,
    Change,
    ChangeAction,
    ChangeBy,
    creation_diff,
    spec_diff,
)
from duetime.core.errors import InvalidRequest, NotFound, StorageUnavailable
from duetime.core.failures import FailureEvent
from duetime.core.ids import SHARDS, new_job_id, shard_of
from duetime.core.lifecycle import OwnerStep, RowPlan, initial_plan, owner_step, split_point, update_step
from duetime.core.model import (
    PLAIN_PAUSE,
    Job,
    JobSpec,
    JobState,
    Overlap,
    Paused,
    PauseRequest,
    Phase,
    Run,
    TargetState,
)
from duetime.core.runpath import (
    AttemptReport,
    Claim,
    FencedRun,
    FenceItem,
    Lease,
    Leased,
    Offered,
    RunSpec,
    Skip,
)
from duetime.core.schedule import next_occurrence
from duetime.core.states import OwnerAction, owner_move
from duetime.storage.completion_rules import (
    CompletionBatch,
    LockedRow,
    apply_leased,
    expire_rows,
    failure_parents,
    finishable,
    skippable,
)
from duetime.storage.flow_rules import IDLE_BUCKET_S, bucket_capacity, check_asks, grant, refilled
from duetime.storage.ports import (
    Backfill,
    BulkAction,
    BulkResult,
    CompletionStats,
    DueBacklog,
    EngineRecord,
    EventSettlement,
    FinishedJobsSweep,
    FlowAsk,
    FlowGrant,
    HistorySweep,
    IdempotencyRequest,
    NameHolderChanged,
    OutboxEvent,
    OwnerRun,
    Page,
    Registration,
    SigningKeys,
    TargetHealthReport,
    TargetView,
)
from duetime.storage.registry_rules import (
    BULK_TARGET,
    bulk_states,
    change_cursor,
    check_trigger_step,
    encode_change_cursor,
    encode_cursor,
    encode_owner_runs_cursor,
    hash_key,
    job_cursor,
    key_prefix,
    name_taken,
    owner_runs_cursor,
    refuse_apply,
    replay_plan,
    require_failed_occurrence,
    run_cursor,
    timing_changed,
)
from duetime.storage.target_rules import (
    LIVE_S,
    STALE_S,
    encode_target_cursor,
    latest_per_pair,
    target_cursor,
    worst,
)


def _system_clock() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class _Row:
    """One row of ``jobs``, column for column (see storage/migrations/)."""

    job_id: uuid.UUID
    shard: int
    owner: str
    spec: dict[str, Any]
    state: str
    next_run_at: datetime | None
    scheduled_for: datetime | None
    attempt: int
    created_at: datetime
    updated_at: datetime
    spec_version: int = 1
    phase: str = "idle"
    run_kind: str = "scheduled"
    resume_at: datetime | None = None
    pending_triggers: list[datetime] = field(default_factory=list)
    lease_token: int = 0
    claimed_by: str | None = None
    leased_until: datetime | None = None
    # A running row's lease (migration 0010): the fence, heartbeats, take and keep set it and
    # leave leased_until as the claim set it; the janitor takes a running row once both lapsed.
    run_until: datetime | None = None
    last_run: dict[str, Any] | None = None
    parent_id: uuid.UUID | None = None
    split_at: datetime | None = None
    handed_upto: datetime | None = None
    backfill_seq: int | None = None
    consecutive_failures: int = 0
    failing: bool = False
    # What the fence fenced, under which lease (migration 0013): the attempt an expiry finishes.
    # Set by the fence only, left as they are when the run ends (read only under the same token).
    fenced_token: int | None = None
    fenced_for: datetime | None = None
    fenced_due: datetime | None = None
    fenced_attempt: int | None = None
    fenced_version: int | None = None
    fenced_kind: str | None = None
    # The run context (migration 0019): the job's last success; what run_once folded into the
    # occurrence folded_into (the row's current one only while they are equal).
    last_success_for: datetime | None = None
    folded_from: datetime | None = None
    folded_into: datetime | None = None
    # The API's spec_version (migration 0018), and what the fence found of it.
    spec_revision: int = 1
    fenced_revision: int | None = None
    # What the pause of a paused job said (migration 0020); None while not paused.
    pause: Paused | None = None

    def locked(self) -> LockedRow:
        """The row as ``lock_for_completion`` reads it (the spec as its text)."""
        return LockedRow(
            job_id=self.job_id,
            shard=self.shard,
            owner=self.owner,
            spec=_spec_text(self.spec),
            spec_version=self.spec_version,
            state=self.state,
            phase=self.phase,
            lease_token=self.lease_token,
            scheduled_for=self.scheduled_for,
            next_run_at=self.next_run_at,
            attempt=self.attempt,
            run_kind=self.run_kind,
            resume_at=self.resume_at,
            pending_triggers=list(self.pending_triggers),
            parent_id=self.parent_id,
            handed_upto=self.handed_upto,
            split_at=self.split_at,
            backfill_seq=self.backfill_seq,
            consecutive_failures=self.consecutive_failures,
            failing=self.failing,
            fenced_token=self.fenced_token,
            fenced_for=self.fenced_for,
            fenced_due=self.fenced_due,
            fenced_attempt=self.fenced_attempt,
            fenced_version=self.fenced_version,
            fenced_kind=self.fenced_kind,
            spec_revision=self.spec_revision,
            fenced_revision=self.fenced_revision,
        )

    def plan(self) -> RowPlan:
        return RowPlan(
            state=JobState(self.state),
            next_run_at=self.next_run_at,
            scheduled_for=self.scheduled_for,
            attempt=self.attempt,
            run_kind=self.run_kind,
            resume_at=self.resume_at,
            pending_triggers=tuple(sorted(self.pending_triggers)),
            handed_upto=self.handed_upto,
        )

    def job(self) -> Job:
        return Job(
            id=str(self.job_id),
            owner=self.owner,
            spec=codec.spec_from_json(self.spec),
            state=JobState(self.state),
            next_run_at=self.next_run_at if self.state in ("scheduled", "paused") else None,
            attempt=self.attempt,
            created_at=self.created_at,
            updated_at=self.updated_at,
            last_run=codec.run_from_json(self.last_run) if self.last_run else None,
            spec_version=self.spec_revision,
            paused=self.pause if self.state == JobState.PAUSED else None,
        )

    def give_back_claim(self) -> None:
        """A claimed row's lease is revoked (owner action): it is idle again, unleased."""
        if self.phase == "claimed":
            self.phase, self.claimed_by, self.leased_until = "idle", None, None


@dataclass(slots=True)
class _EventRow:
    """One row of ``failure_events`` (migration 0009)."""

    seq: int
    event: FailureEvent
    attempts: int = 0
    next_attempt_at: datetime | None = None
    gave_up_at: datetime | None = None
    last_error: str | None = None


@dataclass(slots=True)
class _FlowBucket:
    """One row of ``flow_buckets`` (migration 0015): a flow key's token bucket."""

    tokens: float
    refilled_at: datetime


@dataclass(frozen=True, slots=True)
class _FlowHolder:
    """One row of ``flow_holders``: a worker's slots of a flow key, until they lapse."""

    held: int
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class _TargetRow:
    """One row of ``target_health`` (migration 0016): a worker's report and when it came."""

    report: TargetHealthReport
    reported_at: datetime


@dataclass(slots=True)
class _EngineRow:
    """One row of ``engines`` (migration 0004): a member of the membership."""

    reg: Registration
    serving: frozenset[int]
    started_at: datetime
    heartbeat_at: datetime


class _EngineIdLock:
    """``Membership.engine_id_lock`` in memory: the store keeps which lock holds each id, as the
    database keeps a session's advisory lock. A process's death is ``release`` here."""

    def __init__(self, store: MemoryStore, engine_id: str) -> None:
        self._store = store
        self._engine_id = engine_id

    def _try(self) -> bool:
        self._store._check()
        holder = self._store._id_locks.setdefault(self._engine_id, self)
        return holder is self

    async def acquire(self, within_s: float) -> bool:
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            if self._try():
                return True
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.1)

    async def held(self) -> bool:
        return self._try()

    async def release(self) -> None:
        if self._store._id_locks.get(self._engine_id) is self:
            del self._store._id_locks[self._engine_id]


@dataclass(frozen=True, slots=True)
class _HistoryRow:
    run_id: int
    job_id: uuid.UUID
    shard: int
    run: Run
    fencing_token: int


@dataclass(frozen=True, slots=True)
class _IdempotencyKey:
    body_hash: bytes
    job_id: uuid.UUID
    created_at: datetime


@dataclass(slots=True)
class _ApiKey:
    prefix: str
    owner: str
    revoked: bool = False


@dataclass(eq=False, slots=True)
class _Listener:
    """A ``listen_due`` subscription; closing it stops its wake-ups."""

    store: MemoryStore
    shards: frozenset[int]
    wake: Callable[[int], None]

    async def keep(self) -> None:
        """Nothing is ever lost in memory."""

    async def close(self) -> None:
        self.store._listeners.discard(self)


def _spec_text(spec: dict[str, Any]) -> str:
    return json.dumps(spec, separators=(",", ":"), sort_keys=True)


def _copy(spec: dict[str, Any]) -> dict[str, Any]:
    """What a jsonb column gives back: a copy, never the caller's object."""
    out: dict[str, Any] = json.loads(json.dumps(spec))
    return out


def _finished(run: dict[str, Any]) -> datetime:
    """A history entry's ``finished_at`` (a completion always sets it)."""
    return codec.parse_time(run["finished_at"])


def _greatest(kept: datetime | None, new: datetime | None) -> datetime | None:
    """SQL's GREATEST of two instants: the later one, a NULL ignored."""
    if kept is None or new is None:
        return new if kept is None else kept
    return max(kept, new)


def _is_recurring(spec: dict[str, Any]) -> bool:
    return "cron" in spec["schedule"] or "every" in spec["schedule"]


class MemoryStore:
    """Registry + run store in memory. ``clock`` is both the database's ``now()`` and the
    store's own clock; ``notify_horizon_s`` is how far ahead a due row wakes ``listen_due``."""

    def __init__(
        self, *, clock: Callable[[], datetime] = _system_clock, notify_horizon_s: float = 300.0
    ) -> None:
        self._now = clock
        self._notify_horizon = timedelta(seconds=notify_horizon_s)
        self._jobs: dict[uuid.UUID, _Row] = {}
        self._runs: list[_HistoryRow] = []
        self._changes: dict[uuid.UUID, list[Change]] = {}  # job_changes, by job, oldest first
        self._next_run_id = 1
        self._idempotency: dict[tuple[str, str], _IdempotencyKey] = {}
        self._owners: dict[str, str] = {}
        self._keys: dict[bytes, _ApiKey] = {}
        self._listeners: set[_Listener] = set()
        self._events: dict[int, _EventRow] = {}
        self._next_event_seq = 1
        self._targets: dict[tuple[str, str, str], _TargetRow] = {}  # (owner, host, worker)
        self._flow_buckets: dict[tuple[str, str], _FlowBucket] = {}
        self._flow_holders: dict[tuple[str, str], dict[str, _FlowHolder]] = {}
        self._engines: dict[str, _EngineRow] = {}
        self._id_locks: dict[str, _EngineIdLock] = {}
        # The installation's cursor key: one store here is one installation.
        self._cursor_key = secrets.token_bytes(32)
        self.available = True  # False: every call raises StorageUnavailable (an outage)

    # ------------------------------------------------------------------ plumbing

    def database_of(self, shard: int) -> int:
        """One database holds every shard here."""
        return 0

    def _check(self) -> None:
        if not self.available:
            raise StorageUnavailable(
                "the job database is unavailable right now; nothing was changed, try again"
            )

    def _children(self, parent: uuid.UUID) -> list[_Row]:
        return [r for r in self._jobs.values() if r.parent_id == parent]

    def _wake(self, shards: Iterable[int]) -> None:
        """After the change is "committed": listeners of these shards hear of it soon, not now."""
        wanted = set(shards)
        if not wanted:
            return
        loop = asyncio.get_running_loop()
        for listener in list(self._listeners):
            for shard in sorted(wanted & listener.shards):
                loop.call_soon(listener.wake, shard)

    def _due_soon(self, shard: int, plan: RowPlan, now: datetime) -> None:
        if (
            plan.state == JobState.SCHEDULED
            and plan.next_run_at is not None
            and plan.next_run_at <= now + self._notify_horizon
        ):
            self._wake([shard])

    def _owned(self, owner: str, job_id: uuid.UUID) -> _Row:
        row = self._jobs.get(job_id)
        if row is None or row.owner != owner or row.parent_id is not None:
            raise NotFound(f"no job {job_id}", ident=str(job_id))
        return row

    def _history(self, job_id: uuid.UUID, shard: int, run: Run, token: int) -> None:
        self._runs.append(_HistoryRow(self._next_run_id, job_id, shard, run, token))
        self._next_run_id += 1

    def _record(
        self,
        row: _Row,
        action: ChangeAction,
        by: ChangeBy,
        diff: dict[str, Any] | None = None,
        *,
        actor: ActorType = ActorType.OWNER,
        at: datetime | None = None,
    ) -> None:
        """record_changes for one job (storage/sql/changes.sql), after its row was written."""
        records = self._changes.setdefault(row.job_id, [])
        records.append(
            Change(
                seq=len(records) + 1,
                at=self._now() if at is None else at,
                actor=actor,
                key_id=by.key_id,
                action=action,
                reason=by.reason,
                spec_version=row.spec_revision,
                diff=json.loads(json.dumps(diff or {})),
            )
        )

    # ------------------------------------------------------------------ registry

    async def create_job(
        self,
        owner: str,
        spec: JobSpec,
        *,
        idempotency: IdempotencyRequest | None = None,
        by: ChangeBy = UNNAMED,
    ) -> tuple[Job, bool]:
        self._check()
        now = self._now()
        if spec.name is not None:
            holder = self._holder(owner, spec.name)
            replay = idempotency is not None and (owner, idempotency.key) in self._idempotency
            if holder is not None and not replay:
                raise name_taken(spec.name, holder.job_id)
        if idempotency is not None:
            shard = zlib.crc32(f"{owner}\x00{idempotency.key}".encode()) % SHARDS
            job_id = new_job_id(shard)
            existing = self._idempotency.get((owner, idempotency.key))
            if existing is not None:
                if existing.body_hash != idempotency.body_hash:
                    raise InvalidRequest(
                        "this Idempotency-Key was already used with a different body; use a new key "
                        "for a different job, or resend the original body",
                        code="idempotency_key_reused",
                        field="Idempotency-Key",
                    )
                return self._owned(owner, existing.job_id).job(), False
            self._idempotency[(owner, idempotency.key)] = _IdempotencyKey(idempotency.body_hash, job_id, now)
        else:
            job_id = new_job_id()
            shard = shard_of(job_id)
        plan = initial_plan(job_id, spec, now)
        row = _Row(
            job_id=job_id,
            shard=shard,
            owner=owner,
            spec=codec.spec_to_json(spec),
            state=plan.state.value,
            next_run_at=plan.next_run_at,
            scheduled_for=plan.scheduled_for,
            attempt=plan.attempt,
            created_at=now,
            updated_at=now,
            split_at=split_point(spec, plan),
        )
        self._jobs[job_id] = row
        self._record(row, ChangeAction.CREATE, by, creation_diff(row.spec), at=now)
        self._due_soon(shard, plan, now)
        if idempotency is None:
            # As the PostgreSQL store answers a batched insert: the spec as given.
            return replace(row.job(), spec=spec), True
        return row.job(), True

    async def get_job(self, owner: str, job_id: uuid.UUID) -> Job:
        self._check()
        return self._owned(owner, job_id).job()

    def _holder(self, owner: str, name: str) -> _Row | None:
        """The job (not cancelled) that holds a name: the oldest, as the PostgreSQL store picks."""
        holders = [
            r
            for r in self._jobs.values()
            if r.owner == owner
            and r.parent_id is None
            and r.state != JobState.CANCELLED.value
            and r.spec.get("name") == name
        ]
        return min(holders, key=lambda r: (r.created_at, r.job_id)) if holders else None

    @staticmethod
    def _carries(row: _Row, labels: Mapping[str, str] | None, name_prefix: str | None) -> bool:
        have = row.spec.get("labels") or {}
        if labels and any(have.get(k) != v for k, v in labels.items()):
            return False
        name = row.spec.get("name")
        return name_prefix is None or (name is not None and name.startswith(name_prefix))

    async def list_jobs(
        self,
        owner: str,
        *,
        state: JobState | None,
        limit: int,
        cursor: str | None,
        labels: Mapping[str, str] | None = None,
        name_prefix: str | None = None,
    ) -> Page[Job]:
        self._check()
        after = job_cursor(cursor)
        rows = sorted(
            (
                r
                for r in self._jobs.values()
                if r.owner == owner
                and r.parent_id is None
                and r.job_id > after
                and (state is None or r.state == state.value)
                and self._carries(r, labels, name_prefix)
            ),
            key=lambda r: r.job_id,
        )
        page = rows[:limit]
        next_cursor = encode_cursor(page[-1].job_id.bytes) if len(rows) > limit else None
        return Page([r.job() for r in page], next_cursor)

    def _write(
        self,
        row: _Row,
        *,
        plan: RowPlan,
        revoke: bool,
        spec: dict[str, Any] | None = None,
        spec_version: int | None = None,
        pause: PauseRequest = PLAIN_PAUSE,
        by: ChangeBy = UNNAMED,
    ) -> Job:
        if spec is not None:
            row.spec = spec
        if spec_version is not None:
            row.spec_version = spec_version
        if row.state == JobState.PAUSED and plan.state is JobState.SCHEDULED:
            row.consecutive_failures = 0  # a resume starts the failure count over (write_job)
        if plan.state is not JobState.PAUSED:
            row.pause = None  # write_job: cleared when the job leaves paused, kept while it stays
        elif row.state != JobState.PAUSED:
            row.pause = Paused(self._now(), pause.note, pause.until, ActorType.OWNER, by.key_id)
        row.state = plan.state.value
        row.next_run_at = plan.next_run_at
        row.scheduled_for = plan.scheduled_for
        row.attempt = plan.attempt
        row.run_kind = plan.run_kind
        row.resume_at = plan.resume_at
        row.pending_triggers = list(plan.pending_triggers)
        row.split_at = split_point(codec.spec_from_json(row.spec), plan)
        row.handed_upto = plan.handed_upto
        if revoke:
            row.give_back_claim()
        row.updated_at = self._now()
        self._due_soon(row.shard, plan, self._now())
        return row.job()

    def _cascade_state(self, job_id: uuid.UUID, state: JobState) -> None:
        for child in self._children(job_id):
            if child.state != JobState.CANCELLED.value:
                child.state = state.value
                child.give_back_claim()
                child.updated_at = self._now()

    async def get_job_by_name(self, owner: str, name: str) -> Job:
        self._check()
        holder = self._holder(owner, name)
        if holder is None:
            raise NotFound(f"no job named {name!r}", ident=name)
        return holder.job()

    async def apply_job(
        self, owner: str, spec: JobSpec, *, expected_id: str | None, by: ChangeBy = UNNAMED
    ) -> tuple[Job, bool]:
        self._check()
        name = spec.name
        if name is None:
            raise ValueError("apply_job needs a named spec")
        holder = self._holder(owner, name)
        if (None if holder is None else str(holder.job_id)) != expected_id:
            raise NameHolderChanged(name)
        if holder is None:
            return (await self.create_job(owner, spec, by=by))[0], True
        if codec.spec_to_json(codec.spec_from_json(holder.spec)) == codec.spec_to_json(spec):
            return holder.job(), False  # nothing to change: nothing is written
        refuse_apply(JobState(holder.state), holder.job_id, name)
        return self._update(owner, holder.job_id, spec, by, ChangeAction.REPLACE), False

    async def bulk_action(
        self,
        owner: str,
        action: BulkAction,
        labels: Mapping[str, str],
        *,
        state: JobState | None,
        max_jobs: int,
        by: ChangeBy = UNNAMED,
        pause: PauseRequest = PLAIN_PAUSE,
    ) -> BulkResult:
        self._check()
        states = {s.value for s in bulk_states(action, state)}
        found = sorted(
            (
                r
                for r in self._jobs.values()
                if r.owner == owner
                and r.parent_id is None
                and r.state in states
                and self._carries(r, labels, None)
            ),
            key=lambda r: r.job_id,
        )
        chosen = found[:max_jobs]
        target = BULK_TARGET[action]
        for row in chosen:
            if target is JobState.CANCELLED:
                await self.cancel_job(owner, row.job_id, by=by)
            elif target is JobState.PAUSED:
                await self.pause_job(owner, row.job_id, by=by, pause=pause)
            else:
                await self.resume_job(owner, row.job_id, by=by)
        return BulkResult(matched=len(chosen), changed=len(chosen), more=len(found) > max_jobs)

    async def update_job(
        self, owner: str, job_id: uuid.UUID, spec: JobSpec, *, by: ChangeBy = UNNAMED
    ) -> Job:
        self._check()
        return self._update(owner, job_id, spec, by, ChangeAction.UPDATE)

    def _update(self, owner: str, job_id: uuid.UUID, spec: JobSpec, by: ChangeBy, what: ChangeAction) -> Job:
        new_json = codec.spec_to_json(spec)
        row = self._owned(owner, job_id)
        if spec.name is not None and spec.name != row.spec.get("name"):
            holder = self._holder(owner, spec.name)
            if holder is not None and holder.job_id != job_id:
                raise name_taken(spec.name, holder.job_id)
        old = row.spec
        changed = timing_changed(old, new_json)
        step = update_step(job_id, spec, row.plan(), timing_changed=changed, now=self._now())
        version = row.spec_version + 1 if changed else row.spec_version
        diff = spec_diff(codec.spec_to_json(codec.spec_from_json(old)), new_json)
        revision = row.spec_revision + 1 if diff else row.spec_revision
        if new_json != old:
            for child in self._children(job_id):
                child.spec = {**_copy(new_json), "schedule": child.spec["schedule"]}
                child.spec_revision = revision
                child.updated_at = self._now()
        if changed:
            for child in self._children(job_id):
                if child.backfill_seq is None and child.phase != "running":
                    del self._jobs[child.job_id]
        row.spec_revision = revision
        job = self._write(row, spec=_copy(new_json), spec_version=version, plan=step.plan, revoke=step.revoke)
        if diff:
            self._record(row, what, by, diff)
        return job

    def _step(self, action: OwnerAction, row: _Row) -> OwnerStep | None:
        return owner_step(action, row.plan(), now=self._now(), idle=row.phase == Phase.IDLE)

    async def cancel_job(self, owner: str, job_id: uuid.UUID, *, by: ChangeBy = UNNAMED) -> Job:
        self._check()
        row = self._owned(owner, job_id)
        step = self._step(OwnerAction.CANCEL, row)
        if step is None:
            return row.job()
        self._cascade_state(job_id, step.plan.state)
        for child in self._children(job_id):
            if child.phase == "idle":
                del self._jobs[child.job_id]
        job = self._write(row, plan=step.plan, revoke=step.revoke)
        self._record(row, ChangeAction.CANCEL, by)
        return job

    async def pause_job(
        self, owner: str, job_id: uuid.UUID, *, by: ChangeBy = UNNAMED, pause: PauseRequest = PLAIN_PAUSE
    ) -> Job:
        return self._cascaded(owner, job_id, OwnerAction.PAUSE, by, pause)

    async def resume_job(self, owner: str, job_id: uuid.UUID, *, by: ChangeBy = UNNAMED) -> Job:
        return self._cascaded(owner, job_id, OwnerAction.RESUME, by)

    def _cascaded(
        self,
        owner: str,
        job_id: uuid.UUID,
        what: OwnerAction,
        by: ChangeBy,
        pause: PauseRequest = PLAIN_PAUSE,
    ) -> Job:
        self._check()
        row = self._owned(owner, job_id)
        step = self._step(what, row)
        if step is None:
            return row.job()
        self._cascade_state(job_id, step.plan.state)
        job = self._write(row, plan=step.plan, revoke=step.revoke, pause=pause, by=by)
        self._record(row, ChangeAction(what.value), by)
        return job

    async def trigger_job(
        self, owner: str, job_id: uuid.UUID, *, max_pending: int = 0, by: ChangeBy = UNNAMED
    ) -> Job:
        self._check()
        row = self._owned(owner, job_id)
        step = self._step(OwnerAction.TRIGGER, row)
        assert step is not None, "trigger is never a no-op"
        check_trigger_step(row.plan(), step.plan, max_pending)
        job = self._write(row, plan=step.plan, revoke=step.revoke)
        self._record(row, ChangeAction.TRIGGER, by)
        return job

    async def replay_job(self, owner: str, job_id: uuid.UUID, *, by: ChangeBy = UNNAMED) -> Job:
        self._check()
        row = self._owned(owner, job_id)
        step = self._step(OwnerAction.REPLAY, row)
        assert step is not None, "replay is never a no-op"
        job = self._write(row, plan=step.plan, revoke=step.revoke)
        self._record(row, ChangeAction.REPLAY, by)
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
        self._check()
        row = self._owned(owner, job_id)
        owner_move(OwnerAction.BACKFILL, JobState(row.state))
        if not _is_recurring(row.spec):
            raise InvalidRequest(
                "only an occurrence of a recurring (cron or every) job can be replayed by its "
                "scheduled_for; replay a dead one-off job without a body",
                code="not_recurring",
                field="scheduled_for",
            )
        attempts = [
            h
            for h in self._runs
            if h.job_id == job_id and h.run.scheduled_for == scheduled_for and h.run.attempt > 0
        ]
        final = max(attempts, key=lambda h: (h.run.attempt, h.run_id)).run.outcome.value if attempts else None
        require_failed_occurrence(final, codec.format_time(scheduled_for))
        now = self._now()
        children = self._children(job_id)
        last_seq = max((c.backfill_seq or 0 for c in children), default=0)
        plan = replay_plan(codec.spec_from_json(row.spec), len(children), last_seq, now, max_pending)
        self._insert_occurrence(row, plan.due_at, scheduled_for, seq=plan.seq, now=now)
        self._record(row, ChangeAction.REPLAY, by)
        self._wake([row.shard])
        return row.job()

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
        self._check()
        now = self._now()
        row = self._owned(owner, job_id)
        owner_move(OwnerAction.BACKFILL, JobState(row.state))
        spec = codec.spec_from_json(row.spec)
        children = self._children(job_id)
        pending = len(children)
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
            seq = max((c.backfill_seq or 0 for c in children), default=0)
            for i, r in enumerate(runs, start=1):
                self._insert_occurrence(row, r.due_at, r.scheduled_for, seq=seq + i, now=now)
            self._record(row, ChangeAction.BACKFILL, by)
            self._wake([row.shard])
        return Backfill(
            queued=len(runs),
            first=runs[0].scheduled_for if runs else None,
            last=runs[-1].scheduled_for if runs else None,
        )

    def _insert_occurrence(
        self, parent: _Row, due: datetime | None, scheduled_for: datetime, *, seq: int | None, now: datetime
    ) -> None:
        occ_id = new_job_id(parent.shard)
        self._jobs[occ_id] = _Row(
            job_id=occ_id,
            shard=parent.shard,
            owner=parent.owner,
            spec=_copy(parent.spec),
            state="scheduled",
            next_run_at=due,
            scheduled_for=scheduled_for,
            attempt=0,
            created_at=now,
            updated_at=now,
            spec_version=parent.spec_version,
            parent_id=parent.job_id,
            backfill_seq=seq,
            spec_revision=parent.spec_revision,
        )

    async def list_owner_runs(
        self,
        owner: str,
        *,
        outcome: str | None,
        since: datetime | None,
        limit: int,
        cursor: str | None,
    ) -> Page[OwnerRun]:
        self._check()
        after = owner_runs_cursor(cursor)

        def key(h: _HistoryRow) -> tuple[datetime, uuid.UUID, int]:
            assert h.run.finished_at is not None
            return h.run.finished_at, h.job_id, h.run_id

        mine = {j for j, r in self._jobs.items() if r.owner == owner and r.parent_id is None}
        rows = sorted(
            (
                h
                for h in self._runs
                if h.job_id in mine
                and (outcome is None or h.run.outcome.value == outcome)
                and (since is None or (h.run.finished_at is not None and h.run.finished_at >= since))
                and (after is None or key(h) < after)
            ),
            key=key,
            reverse=True,
        )[: limit + 1]
        page = rows[:limit]
        next_cursor = encode_owner_runs_cursor(*key(page[-1])) if len(rows) > limit else None
        return Page([OwnerRun(h.job_id, h.run) for h in page], next_cursor)

    async def list_runs(self, owner: str, job_id: uuid.UUID, *, limit: int, cursor: str | None) -> Page[Run]:
        self._check()
        before = run_cursor(cursor)
        self._owned(owner, job_id)
        rows = sorted(
            (h for h in self._runs if h.job_id == job_id and h.run_id < before),
            key=lambda h: h.run_id,
            reverse=True,
        )[: limit + 1]
        page = rows[:limit]
        next_cursor = encode_cursor(page[-1].run_id.to_bytes(8, "big")) if len(rows) > limit else None
        return Page([h.run for h in page], next_cursor)

    async def list_changes(
        self, owner: str, job_id: uuid.UUID, *, limit: int, cursor: str | None
    ) -> Page[Change]:
        self._check()
        before = change_cursor(cursor)
        self._owned(owner, job_id)
        rows = [c for c in reversed(self._changes.get(job_id, [])) if c.seq < before][: limit + 1]
        page = rows[:limit]
        next_cursor = encode_change_cursor(page[-1].seq) if len(rows) > limit else None
        return Page(page, next_cursor)

    async def count_active_jobs(self, owner: str) -> int:
        self._check()
        return sum(
            1
            for r in self._jobs.values()
            if r.owner == owner and r.parent_id is None and r.state in ("scheduled", "paused")
        )

    async def active_job_bytes(self, owner: str) -> int:
        """The specs' size as compact JSON (PostgreSQL counts them as stored, compressed)."""
        self._check()
        return sum(
            len(json.dumps(r.spec, separators=(",", ":")).encode())
            for r in self._jobs.values()
            if r.owner == owner and r.parent_id is None and r.state in ("scheduled", "paused")
        )

    async def owner_for_key(self, api_key: str) -> str | None:
        self._check()
        key = self._keys.get(hash_key(api_key))
        return None if key is None or key.revoked else key.owner

    async def create_api_key(self, owner: str) -> tuple[str, str]:
        self._check()
        from duetime.core.signing import new_signing_secret

        api_key = "dt_" + secrets.token_urlsafe(24)
        self._owners.setdefault(owner, new_signing_secret())
        self._keys[hash_key(api_key)] = _ApiKey(key_prefix(api_key), owner)
        return api_key, self._owners[owner]

    async def revoke_api_key(self, api_key_or_prefix: str) -> int:
        self._check()
        hashed = hash_key(api_key_or_prefix)
        revoked = 0
        for key_hash, key in self._keys.items():
            if not key.revoked and (key_hash == hashed or key.prefix == api_key_or_prefix):
                key.revoked = True
                revoked += 1
        return revoked

    async def signing_secret(self, owner: str) -> str | None:
        self._check()
        return self._owners.get(owner)

    async def signing_keys(self, owner: str) -> SigningKeys | None:
        """No rotation here (that is an operator's command on the real store): the current one."""
        self._check()
        secret = self._owners.get(owner)
        return (
            None if secret is None else SigningKeys(current=secret, previous=None, previous_valid_until=None)
        )

    async def cursor_key(self) -> bytes:
        self._check()
        return self._cursor_key

    async def ping(self) -> None:
        self._check()

    # ------------------------------------------------------------------ run path

    def _claimed(self, row: _Row, now: datetime) -> Claim:
        assert row.next_run_at is not None and row.scheduled_for is not None
        missed = misfire.missed(
            run_kind=row.run_kind,
            attempt=row.attempt,
            parent_id=row.parent_id,
            next_run_at=row.next_run_at,
            grace_s=int(row.spec["misfire_grace_s"]),
            now=now,
            recurring=_is_recurring(row.spec),
        )
        return Claim(
            job_id=row.job_id,
            shard=row.shard,
            lease_token=row.lease_token,
            due_at=row.next_run_at,
            scheduled_for=row.scheduled_for,
            attempt=row.attempt,
            run_kind=row.run_kind,
            db_now=now,
            owner=row.owner,
            misfire_spec=codec.spec_from_json(_copy(row.spec)) if missed else None,
        )

    def _lease_claim(self, row: _Row, engine_id: str, lease_s: float, now: datetime) -> None:
        assert row.next_run_at is not None
        row.phase = "claimed"
        row.lease_token += 1
        row.claimed_by = engine_id
        row.leased_until = max(row.next_run_at, now) + timedelta(seconds=lease_s)

    async def claim_due(
        self, shard: int, engine_id: str, *, lookahead_s: float, lease_s: float, limit: int
    ) -> list[Claim]:
        self._check()
        now = self._now()
        horizon = now + timedelta(seconds=lookahead_s)
        due = sorted(
            (
                r
                for r in self._jobs.values()
                if r.shard == shard
                and r.state == "scheduled"
                and r.phase == "idle"
                and r.next_run_at is not None
                and r.next_run_at <= horizon
            ),
            key=lambda r: r.next_run_at or now,
        )[:limit]
        for row in due:
            self._lease_claim(row, engine_id, lease_s, now)
        return [self._claimed(r, now) for r in due]

    async def retake_claims(self, engine_id: str, shards: Sequence[int], *, lease_s: float) -> list[Claim]:
        self._check()
        now = self._now()
        mine = [
            r
            for r in self._jobs.values()
            if r.claimed_by == engine_id and r.phase == "claimed" and r.shard in shards
        ]
        for row in mine:
            assert row.next_run_at is not None
            row.lease_token += 1
            row.leased_until = max(row.next_run_at, now) + timedelta(seconds=lease_s)
        return [self._claimed(r, now) for r in mine]

    async def fence_runs(self, items: Sequence[FenceItem], *, lease_s: float) -> list[FencedRun]:
        self._check()
        now = self._now()
        out: list[FencedRun] = []
        for item in items:
            row = self._jobs.get(item.job_id)
            if (
                row is None
                or row.lease_token != item.lease_token
                or row.phase != "claimed"
                or row.state != "scheduled"
            ):
                continue
            row.phase = "running"
            was_for = row.scheduled_for
            if was_for is not None and item.scheduled_for > was_for:  # run_once folded: fence_runs
                if row.folded_into != was_for:
                    row.folded_from = was_for
                row.folded_into = item.scheduled_for
            row.scheduled_for = item.scheduled_for
            row.run_until = now + timedelta(seconds=lease_s)
            assert row.next_run_at is not None
            row.fenced_token, row.fenced_for = row.lease_token, item.scheduled_for
            row.fenced_due, row.fenced_attempt = row.next_run_at, row.attempt
            row.fenced_version, row.fenced_kind = row.spec_version, row.run_kind
            row.fenced_revision = row.spec_revision
            text = _spec_text(row.spec)
            job = row if row.parent_id is None else self._jobs.get(row.parent_id, row)  # job_context
            out.append(
                FencedRun(
                    job_id=row.job_id,
                    shard=row.shard,
                    owner=row.owner,
                    lease_token=row.lease_token,
                    scheduled_for=item.scheduled_for,
                    due_at=row.next_run_at,
                    attempt=row.attempt + 1,
                    spec=RunSpec(text, row.spec_version),
                    run_kind=row.run_kind,
                    parent_id=row.parent_id,
                    job_created_at=job.created_at,
                    last_success_for=job.last_success_for,
                    folded_from=row.folded_from if row.folded_into == row.scheduled_for else None,
                    spec_revision=row.spec_revision,
                )
            )
        return out

    def _held(self, lease: Leased, phase_ok: Callable[[str], bool]) -> _Row | None:
        row = self._jobs.get(lease.job_id)
        if row is None or row.lease_token != lease.lease_token or not phase_ok(row.phase):
            return None
        return row

    async def extend_leases(self, leases: Sequence[Leased], *, lease_s: float) -> set[uuid.UUID]:
        self._check()
        until = self._now() + timedelta(seconds=lease_s)
        held: set[uuid.UUID] = set()
        for lease in leases:
            row = self._held(lease, finishable)
            if row is not None:
                if row.phase == "running":
                    row.run_until = until
                else:
                    row.leased_until = until
                held.add(row.job_id)
        return held

    async def keep_waiting_claims(
        self, shard: int, engine_id: str, *, within_s: float, extend_s: float, limit: int
    ) -> int:
        self._check()
        now = self._now()
        soon = now + timedelta(seconds=within_s)
        rows = sorted(
            (
                r
                for r in self._jobs.values()
                if r.shard == shard
                and r.leased_until is not None
                and r.leased_until < soon
                and r.phase == "claimed"
                and r.claimed_by == engine_id
            ),
            key=lambda r: r.leased_until or now,
        )[:limit]
        for row in rows:
            row.leased_until = now + timedelta(seconds=extend_s)
        return len(rows)

    async def release_claims(self, leases: Sequence[Leased]) -> int:
        self._check()
        released = 0
        for lease in leases:
            row = self._held(lease, skippable)
            if row is not None:
                row.give_back_claim()
                released += 1
        return released

    async def return_unstarted(self, leases: Sequence[Leased]) -> int:
        self._check()
        returned = 0
        for lease in leases:
            row = self._held(lease, lambda phase: phase == "running")
            if row is not None and row.fenced_token == lease.lease_token:
                row.phase, row.claimed_by, row.leased_until, row.run_until = "idle", None, None, None
                returned += 1
        return returned

    # ------------------------------------------------------------------ completion

    def _locked_rows(self, ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, LockedRow]:
        return {i: self._jobs[i].locked() for i in sorted(set(ids)) if i in self._jobs}

    def _flush(self, writer: CompletionBatch) -> set[int]:
        """The batch the completion rules decided, applied to the rows as PostgreSQL's statements
        apply it (storage/sql/completion.sql: insert_catch_up, apply_plans, insert_runs,
        delete_occurrences, the failure counts; after the commit cascade_failure_pause,
        release_next_backfill, parent_last_run, complete_drained_jobs). Returns the shards to wake."""
        now = self._now()
        last_seq: dict[uuid.UUID, int] = {}
        for catch_up in writer.catch_up:  # insert_catch_up
            parent_id, place = catch_up.parent_id, catch_up.position
            seq = None
            if place is not None:
                if parent_id not in last_seq:
                    last_seq[parent_id] = max(
                        (c.backfill_seq or 0 for c in self._children(parent_id)), default=0
                    )
                seq = last_seq[parent_id] + place
            due = now if place is None else None
            self._insert_occurrence(self._jobs[parent_id], due, catch_up.scheduled_for, seq=seq, now=now)
        for w in writer.plans:
            plan = w.plan
            row = self._jobs[w.job_id]
            if not (w.hold and self._children(w.job_id)):
                row.state = plan.state.value
            row.next_run_at = plan.next_run_at
            row.scheduled_for = plan.scheduled_for
            row.attempt = plan.attempt
            row.run_kind = plan.run_kind
            row.resume_at = plan.resume_at
            if w.consumed_trigger is not None:
                consumed = w.consumed_trigger
                row.pending_triggers = sorted(t for t in row.pending_triggers if t > consumed)
            row.split_at = w.split_at
            row.handed_upto = plan.handed_upto
            row.phase, row.claimed_by, row.leased_until, row.run_until = "idle", None, None, None
            if w.last_run is not None:
                row.last_run = w.last_run
            row.last_success_for = _greatest(row.last_success_for, w.succeeded_for)
            row.updated_at = now
        for h in writer.runs:
            self._history(h.job_id, h.shard, h.run, h.fencing_token)
        for job_id in writer.finished_occurrences:
            occurrence = self._jobs.get(job_id)
            if occurrence is not None and occurrence.parent_id is not None:
                del self._jobs[job_id]
        if writer.ended:
            self._write_failures(writer)
        # after the commit
        for child in (c for p in writer.paused for c in self._children(p)):  # cascade_failure_pause
            job_row = self._jobs[child.parent_id or child.job_id]
            if child.state == JobState.SCHEDULED and job_row.state == JobState.PAUSED:
                child.state = JobState.PAUSED.value
                child.give_back_claim()
                child.updated_at = now
        shards = self._release_next_backfill(writer.backfill_parents, now) | writer.catch_up_shards
        for parent, last in writer.parent_last.items():
            job = self._jobs.get(parent)
            if job is None:
                continue
            if job.last_run is None or _finished(job.last_run) <= _finished(last):
                job.last_run = last
                job.updated_at = now
            succeeded = writer.parent_success.get(parent)
            if succeeded is not None and _greatest(job.last_success_for, succeeded) != job.last_success_for:
                job.last_success_for = succeeded
                job.updated_at = now
        self._complete_drained(r for r in (self._jobs.get(p) for p in writer.parent_last) if r is not None)
        return shards

    def _write_failures(self, writer: CompletionBatch) -> None:
        """apply_failure_counts, pause_failing_jobs and insert_failure_events."""
        writes = writer.failure_writes(self._locked_rows(writer.failure_rows_missing()))
        for job_id, count in writes.counts:
            row = self._jobs[job_id]
            row.consecutive_failures, row.failing = count.consecutive, count.failing
        for job_id in writes.paused:
            row = self._jobs[job_id]
            if row.state == JobState.SCHEDULED:
                row.state = JobState.PAUSED.value
                row.split_at = None
                row.give_back_claim()
                row.updated_at = self._now()
                row.pause = Paused(self._now(), None, None, ActorType.DUETIME, None)
                reason = AUTO_PAUSE_REASON % row.consecutive_failures
                self._record(row, ChangeAction.AUTO_PAUSE, ChangeBy(reason=reason), actor=ActorType.DUETIME)
        writer.paused = writes.paused
        for event in writes.events:
            self._events[self._next_event_seq] = _EventRow(
                self._next_event_seq, event, next_attempt_at=self._now()
            )
            self._next_event_seq += 1

    # ------------------------------------------------------------------ failure events' outbox

    def failure_events(self) -> list[FailureEvent]:
        """Every event in the outbox, in the order they were written (for tests)."""
        return [r.event for r in self._events.values()]

    async def claim_events(self, *, limit: int, lease_s: float) -> list[OutboxEvent]:
        self._check()
        now = self._now()
        due = sorted(
            (
                r
                for r in self._events.values()
                if r.gave_up_at is None and r.next_attempt_at is not None and r.next_attempt_at <= now
            ),
            key=lambda r: (r.next_attempt_at or now, r.seq),
        )[:limit]
        claimed = []
        for r in due:
            r.next_attempt_at = now + timedelta(seconds=lease_s)
            r.attempts += 1
            e = r.event
            claimed.append(
                OutboxEvent(
                    seq=r.seq,
                    database="memory",
                    event_id=e.event_id,
                    kind=e.kind.value,
                    job_id=e.job_id,
                    owner=e.owner,
                    scheduled_for=e.scheduled_for,
                    fencing_token=e.fencing_token,
                    target=e.target,
                    body=json.loads(json.dumps(e.body)),
                    attempts=r.attempts,
                )
            )
        return claimed

    async def settle_events(self, settlements: Sequence[EventSettlement]) -> None:
        self._check()
        for s in settlements:
            row = self._events.get(s.event.seq)
            if row is None or row.attempts != s.event.attempts:
                continue
            if s.delivered:
                del self._events[s.event.seq]
                continue
            row.last_error = s.error
            if s.retry_at is None:
                row.gave_up_at = self._now()
            else:
                row.next_attempt_at = s.retry_at

    async def purge_given_up_events(self, *, before: datetime, limit: int) -> int:
        self._check()
        old = sorted(
            (r for r in self._events.values() if r.gave_up_at is not None and r.gave_up_at < before),
            key=lambda r: r.gave_up_at or before,
        )[:limit]
        for r in old:
            del self._events[r.seq]
        return len(old)

    def _release_next_backfill(self, parents: Iterable[uuid.UUID], now: datetime) -> set[int]:
        shards: set[int] = set()
        for parent in parents:
            children = self._children(parent)
            if any(c.next_run_at is not None for c in children):
                continue
            waiting = [c for c in children if c.next_run_at is None and c.state != "cancelled"]
            if waiting:
                nxt = min(waiting, key=lambda c: (c.backfill_seq is None, c.backfill_seq or 0))
                nxt.next_run_at = now
                shards.add(nxt.shard)
        return shards

    def _complete_drained(self, rows: Iterable[_Row]) -> int:
        done = 0
        for p in list(rows):
            if (
                p.state == "scheduled"
                and p.next_run_at is None
                and p.phase == "idle"
                and p.parent_id is None
                and _is_recurring(p.spec)
                and not self._children(p.job_id)
            ):
                p.state = "completed"
                p.updated_at = self._now()
                done += 1
        return done

    async def complete_runs(self, reports: Sequence[AttemptReport]) -> CompletionStats:
        self._check()
        return self._under_lease(reports, finishable, CompletionBatch.finish)

    async def skip_missed(self, items: Sequence[Skip]) -> CompletionStats:
        self._check()
        return self._under_lease(items, skippable, CompletionBatch.skip)

    def _under_lease(
        self,
        items: Sequence[Any],
        phase_ok: Callable[[str], bool],
        apply: Callable[[CompletionBatch, LockedRow, Any, datetime], None],
    ) -> CompletionStats:
        writer = CompletionBatch()
        also = failure_parents(items) if apply is CompletionBatch.finish else []
        rows = self._locked_rows([*(i.job_id for i in items), *also])
        stale = apply_leased(writer, rows, items, phase_ok=phase_ok, apply=apply, now=self._now())
        self._wake(self._flush(writer))
        return CompletionStats(applied=len(writer.seen), stale=stale, history=writer.history_count)

    def _expire(self, rows: Iterable[_Row]) -> CompletionStats:
        writer = CompletionBatch()
        expire_rows(writer, self._locked_rows(r.job_id for r in rows).values(), self._now())
        self._wake(self._flush(writer))
        return CompletionStats(applied=len(writer.seen), history=writer.history_count)

    # ------------------------------------------------------------------ janitor

    async def rescue_expired(self, shard: int, *, limit: int) -> CompletionStats:
        self._check()
        now = self._now()
        lapsed = sorted(
            (
                r
                for r in self._jobs.values()
                if r.shard == shard
                and r.phase != "idle"
                and r.leased_until is not None
                and r.leased_until < now
                and (r.run_until is None or r.run_until < now)
            ),
            key=lambda r: r.leased_until or now,
        )[:limit]
        return self._expire(lapsed) if lapsed else CompletionStats()

    async def expire_running_of(self, engine_id: str, shards: Sequence[int]) -> CompletionStats:
        self._check()
        return self._expire(self._running_of(engine_id, shards))

    def _running_of(self, engine_id: str, shards: Sequence[int]) -> list[_Row]:
        return [
            r
            for r in self._jobs.values()
            if r.claimed_by == engine_id and r.phase == "running" and r.shard in shards
        ]

    async def split_overlapping(self, shard: int, *, horizon_s: float, limit: int = 500) -> int:
        self._check()
        now = self._now()
        horizon = now + timedelta(seconds=horizon_s)
        rows = sorted(
            (
                r
                for r in self._jobs.values()
                if r.shard == shard
                and r.split_at is not None
                and (r.phase == "running" or r.attempt > 0)
                and r.split_at <= horizon
                and r.state == "scheduled"
                and r.run_kind == "scheduled"
                and r.parent_id is None
            ),
            key=lambda r: r.split_at or now,
        )[:limit]
        for row in rows:
            spec = codec.spec_from_json(row.spec)
            occ = row.split_at
            assert occ is not None
            self._insert_occurrence(row, jitter.due_at(row.job_id, occ, spec), occ, seq=None, now=now)
            row.handed_upto = occ
            row.split_at = next_occurrence(spec.schedule, occ)
        return len(rows)

    async def complete_drained_jobs(self, shard: int) -> int:
        self._check()
        return self._complete_drained(r for r in self._jobs.values() if r.shard == shard)

    async def release_stalled_backfills(self, shard: int) -> int:
        self._check()
        parents = {
            r.parent_id
            for r in self._jobs.values()
            if r.shard == shard
            and r.parent_id is not None
            and r.next_run_at is None
            and r.state == "scheduled"
        }
        released = 0
        now = self._now()
        for parent in parents:
            children = self._children(parent)
            if any(c.next_run_at is not None for c in children):
                continue
            waiting = [
                c for c in children if c.next_run_at is None and c.state == "scheduled" and c.shard == shard
            ]
            nxt = min(waiting, key=lambda c: (c.backfill_seq is None, c.backfill_seq or 0))
            nxt.next_run_at = now
            released += 1
        return released

    async def end_pauses(self, shard: int, *, limit: int) -> int:
        """As storage/postgres/pauses.py: the owner's resume of each job whose pause ended, with
        its auto_resume record by Duetime."""
        self._check()
        now = self._now()
        ended = sorted(
            (
                r
                for r in self._jobs.values()
                if r.shard == shard
                and r.parent_id is None
                and r.state == JobState.PAUSED
                and r.pause is not None
                and r.pause.until is not None
                and r.pause.until <= now
            ),
            key=lambda r: (r.pause.until if r.pause is not None else None) or now,
        )[:limit]
        resumed = 0
        for row in ended:
            assert row.pause is not None and row.pause.until is not None
            until = row.pause.until
            step = self._step(OwnerAction.RESUME, row)
            if step is None:
                continue
            self._cascade_state(row.job_id, step.plan.state)
            self._write(row, plan=step.plan, revoke=step.revoke)
            reason = AUTO_RESUME_REASON.format(until=codec.format_time(until))
            self._record(row, ChangeAction.AUTO_RESUME, ChangeBy(reason=reason), actor=ActorType.DUETIME)
            resumed += 1
        return resumed

    async def purge_idempotency_keys(self, older_than_s: float) -> None:
        self._check()
        cutoff = self._now() - timedelta(seconds=older_than_s)
        for key, record in list(self._idempotency.items()):
            if record.created_at < cutoff:
                del self._idempotency[key]

    async def db_now(self, shard: int = 0) -> datetime:
        self._check()
        return self._now()

    async def listen_due(self, shards: Sequence[int], wake: Callable[[int], None]) -> _Listener:
        listener = _Listener(self, frozenset(shards), wake)
        self._listeners.add(listener)
        return listener

    # ------------------------------------------------------------------ NATS run-queue leases

    async def take_runs(self, items: Sequence[Offered], *, holder: str, lease_s: float) -> set[Lease]:
        self._check()
        until = self._now() + timedelta(seconds=lease_s)
        taken: set[Lease] = set()
        for item in sorted(items, key=lambda i: i.job_id):
            row = self._jobs.get(item.job_id)
            if (
                row is None
                or row.lease_token != item.lease_token
                or row.phase != "running"
                or row.claimed_by != item.publisher
            ):
                continue
            row.claimed_by, row.run_until = holder, until
            taken.add(Lease(row.job_id, item.shard, row.lease_token))
        return taken

    async def extend_published(
        self, leases: Sequence[Leased], *, holder: str, lease_s: float
    ) -> set[uuid.UUID]:
        self._check()
        until = self._now() + timedelta(seconds=lease_s)
        held: set[uuid.UUID] = set()
        for lease in leases:
            row = self._held(lease, lambda phase: phase == "running")
            if row is not None and row.claimed_by == holder:
                row.run_until = until
                held.add(row.job_id)
        return held

    async def expire_published_of(self, engine_id: str, shards: Sequence[int]) -> int:
        self._check()
        return self._expire(self._running_of(engine_id, shards)).applied

    # ------------------------------------------------------------------ target health

    async def report_target_health(self, worker: str, reports: Sequence[TargetHealthReport]) -> None:
        self._check()
        now = self._now()
        stale = now - timedelta(seconds=STALE_S)
        for key, row in list(self._targets.items()):
            if key[2] == worker and row.reported_at < stale:
                del self._targets[key]
        for report in latest_per_pair(reports):
            self._targets[(report.owner, report.host, worker)] = _TargetRow(report, now)

    async def list_targets(self, owner: str, *, limit: int, cursor: str | None) -> Page[TargetView]:
        self._check()
        after = target_cursor(cursor)
        live = self._now() - timedelta(seconds=LIVE_S)
        by_host: dict[str, list[TargetHealthReport]] = {}
        for (row_owner, host, _), row in self._targets.items():
            if row_owner == owner and host > after and row.reported_at > live:
                by_host.setdefault(host, []).append(row.report)
        hosts = sorted(by_host)[: limit + 1]
        page = [_target_view(host, by_host[host]) for host in hosts[:limit]]
        next_cursor = encode_target_cursor(page[-1].host) if len(hosts) > limit else None
        return Page(page, next_cursor)

    # ------------------------------------------------------------------ flow control

    async def take_flow(self, worker: str, asks: Sequence[FlowAsk], *, hold_s: float) -> list[FlowGrant]:
        """As ``duetime_take_flow`` does (migration 0015), ask by ask; nothing awaits in between,
        which is what the function's row locks give there."""
        self._check()
        check_asks(asks)
        now = self._now()
        until = now + timedelta(seconds=hold_s)
        grants: list[FlowGrant] = []
        for ask in asks:
            ident = (ask.owner, ask.key)
            bucket = self._flow_buckets.get(ident)
            if bucket is None:
                bucket = self._flow_buckets[ident] = _FlowBucket(bucket_capacity(ask.rate_per_s), now)
            else:
                elapsed_s = (now - bucket.refilled_at).total_seconds()
                bucket.tokens = refilled(bucket.tokens, elapsed_s, ask.rate_per_s)
                bucket.refilled_at = max(bucket.refilled_at, now)
            holders = self._flow_holders.setdefault(ident, {})
            others = sum(h.held for w, h in holders.items() if w != worker and h.expires_at > now)
            granted = grant(ask, tokens=bucket.tokens, others_held=others)
            bucket.tokens -= granted
            if ask.running + granted > 0:
                holders[worker] = _FlowHolder(ask.running + granted, until)
            else:
                holders.pop(worker, None)
            grants.append(FlowGrant(owner=ask.owner, key=ask.key, granted=granted))
        self._sweep_flow(now)
        return grants

    def _sweep_flow(self, now: datetime) -> None:
        """What the function's sweep deletes: lapsed holders, and buckets idle long enough to be
        full (the next ask makes them again, full: the same bucket)."""
        for ident, holders in list(self._flow_holders.items()):
            for lapsed in [w for w, h in holders.items() if h.expires_at <= now]:
                del holders[lapsed]
            if not holders:
                del self._flow_holders[ident]
        idle = now - timedelta(seconds=IDLE_BUCKET_S)
        for ident in [i for i, b in self._flow_buckets.items() if b.refilled_at < idle]:
            del self._flow_buckets[ident]

    # ------------------------------------------------------------------ membership

    def _own_engine(self, reg: Registration) -> _EngineRow | None:
        """The row of ``reg``'s process: under its id and its incarnation (not a later process's)."""
        row = self._engines.get(reg.engine_id)
        return row if row is not None and row.reg.incarnation == reg.incarnation else None

    async def join_engine(self, reg: Registration) -> None:
        self._check()
        now = self._now()
        self._engines[reg.engine_id] = _EngineRow(reg, frozenset(), started_at=now, heartbeat_at=now)

    async def heartbeat_engine(self, reg: Registration, serving: Iterable[int]) -> bool:
        self._check()
        row = self._own_engine(reg)
        if row is None:
            return False
        row.heartbeat_at, row.serving = self._now(), frozenset(serving)
        return True

    async def set_engine_serving(self, reg: Registration, serving: Iterable[int]) -> None:
        self._check()
        row = self._own_engine(reg)
        if row is not None:
            row.serving = frozenset(serving)

    async def leave_engine(self, reg: Registration) -> None:
        self._check()
        if self._own_engine(reg) is not None:
            del self._engines[reg.engine_id]

    async def list_engines(self) -> list[EngineRecord]:
        self._check()
        now = self._now()
        out = []
        for engine_id in sorted(self._engines):
            row = self._engines[engine_id]
            reg = row.reg
            out.append(
                EngineRecord(
                    engine_id=engine_id,
                    host=reg.host,
                    allowed=frozenset(reg.allowed),
                    serving=row.serving,
                    lease_s=float(reg.lease_s),
                    replicas=reg.replicas,
                    incarnation=reg.incarnation,
                    started_at=row.started_at,
                    heartbeat_at=row.heartbeat_at,
                    heartbeat_age_s=max((now - row.heartbeat_at).total_seconds(), 0.0),
                    live=row.heartbeat_at > now - timedelta(seconds=reg.lease_s),
                )
            )
        return out

    async def forget_dead_engines(self, older_than_s: float) -> int:
        self._check()
        now = self._now()
        dead = [
            engine_id
            for engine_id, row in self._engines.items()
            if row.heartbeat_at < now - timedelta(seconds=max(row.reg.lease_s, older_than_s))
        ]
        for engine_id in dead:
            del self._engines[engine_id]
        return len(dead)

    def engine_id_lock(self, engine_id: str) -> _EngineIdLock:
        return _EngineIdLock(self, engine_id)

    # ------------------------------------------------------------------ retention

    def databases(self) -> list[str]:
        """One database holds everything here."""
        return ["memory"]

    async def delete_old_runs(
        self, dsn: str, *, before: datetime, limit: int, after: int = 0
    ) -> HistorySweep | None:
        """As ``retention_old_runs``: the oldest ``limit`` history rows after ``after`` walked,
        those of them finished before ``before`` deleted. Nothing else holds the lock here."""
        self._check()
        head = sorted((h for h in self._runs if h.run_id > after), key=lambda h: h.run_id)[:limit]
        gone = {h.run_id for h in head if (h.run.finished_at or h.run.scheduled_for) < before}
        self._runs = [h for h in self._runs if h.run_id not in gone]
        return HistorySweep(deleted=len(gone), walked=head[-1].run_id if head else None)

    async def delete_finished_jobs(
        self, dsn: str, *, before: datetime, limit: int
    ) -> FinishedJobsSweep | None:
        """As ``retention_finished_jobs`` and the deletes after it: jobs finished before
        ``before``, idle, with no occurrence row in flight, oldest first; their history,
        Idempotency-Keys and occurrence rows with them."""
        self._check()
        finished = (JobState.COMPLETED.value, JobState.CANCELLED.value, JobState.DEAD.value)
        chosen = sorted(
            (
                r
                for r in self._jobs.values()
                if r.parent_id is None
                and r.state in finished
                and r.updated_at < before
                and r.phase == Phase.IDLE
                and not any(c.phase != Phase.IDLE for c in self._children(r.job_id))
            ),
            key=lambda r: r.updated_at,
        )[:limit]
        ids = {r.job_id for r in chosen}
        if not ids:
            return FinishedJobsSweep(jobs=0, history=0)
        history = sum(1 for h in self._runs if h.job_id in ids)
        self._runs = [h for h in self._runs if h.job_id not in ids]
        for key, record in list(self._idempotency.items()):
            if record.job_id in ids:
                del self._idempotency[key]
        for job_id, row in list(self._jobs.items()):
            if job_id in ids or row.parent_id in ids:
                del self._jobs[job_id]
        return FinishedJobsSweep(jobs=len(ids), history=history)

    async def purge_target_health(self, *, older_than_s: float) -> int:
        self._check()
        cutoff = self._now() - timedelta(seconds=older_than_s)
        old = [key for key, row in self._targets.items() if row.reported_at < cutoff]
        for key in old:
            del self._targets[key]
        return len(old)

    # ------------------------------------------------------------------ due age

    async def oldest_unclaimed_due(self, shards: Iterable[int]) -> list[DueBacklog]:
        """As ``oldest_unclaimed_due``: per shard, how long its earliest due, scheduled, unclaimed
        row has waited (0 when none)."""
        self._check()
        now = self._now()
        oldest: dict[int, datetime] = {}
        for r in self._jobs.values():
            if (
                r.state == JobState.SCHEDULED
                and r.claimed_by is None
                and r.phase == Phase.IDLE
                and r.next_run_at is not None
                and r.next_run_at <= now
                and (r.shard not in oldest or r.next_run_at < oldest[r.shard])
            ):
                oldest[r.shard] = r.next_run_at
        return [
            DueBacklog(shard, (now - oldest[shard]).total_seconds() if shard in oldest else 0.0)
            for shard in sorted(set(shards))
        ]

    async def close(self) -> None:
        self._listeners.clear()


def _target_view(host: str, reports: list[TargetHealthReport]) -> TargetView:
    """What the live workers' reports of one host say together (``list_targets``)."""
    backing_off = [
        r.backoff_until for r in reports if r.state is TargetState.BACKING_OFF and r.backoff_until is not None
    ]
    return TargetView(
        host=host,
        state=worst(r.state for r in reports),
        concurrency_limit=sum(r.concurrency_limit for r in reports),
        backoff_until=max(backing_off, default=None),
        calls_5m=sum(r.calls_5m for r in reports),
        timeouts_5m=sum(r.timeouts_5m for r in reports),
        errors_5m=sum(r.errors_5m for r in reports),
    )
