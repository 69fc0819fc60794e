"""The storage ports: what the API, the engine and the workers may ask of storage, as Protocols,
and the typed records that cross them.

The API talks to a ``Registry`` (and lists target health: ``ApiStore`` is both); the engine and
workers talk to a ``RunStore``; the engine's membership keeper to ``Membership``, its
maintenance service to ``Retention``, its due-age sampler to ``DueAge``. All are implemented by
``storage.postgres.PostgresStore`` (the real thing, built only by the composition root) and by
``storage.memory.MemoryStore`` (a faithful in-memory fake for tests); the contract suite in
tests/contract/ runs the same cases against both, so the fake cannot drift. Methods are
verb-named; each names its shard where one shard is meant. Database errors reach callers as
``core.errors`` (``StorageUnavailable``, ``NotFound``, ``Conflict``, ``InvalidRequest``), never as
a driver's exceptions.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Literal, Protocol, TypeVar

from duetime.core.changes import UNNAMED, Change, ChangeBy
from duetime.core.dealing import Member
from duetime.core.model import PLAIN_PAUSE, Job, JobSpec, JobState, PauseRequest, Run, Target, TargetState

# The run path's records are the core's vocabulary (core/runpath.py); they cross this port as
# they are, and are re-exported here for the callers that name them by the port.
from duetime.core.runpath import (
    AttemptReport,
    Claim,
    FencedRun,
    FenceItem,
    FenceRequest,
    Lease,
    Leased,
    Offered,
    PublishedRun,
    Skip,
)

__all__ = [
    "ApiStore",
    "AttemptReport",
    "Backfill",
    "Claim",
    "CompletionStats",
    "DueAge",
    "DueBacklog",
    "DueListener",
    "EngineIdLock",
    "EngineRecord",
    "EventOutbox",
    "EventSettlement",
    "FenceItem",
    "FenceRequest",
    "FencedRun",
    "FinishedJobsSweep",
    "FlowAsk",
    "FlowControl",
    "FlowGrant",
    "HistorySweep",
    "IdempotencyRequest",
    "Lease",
    "Leased",
    "Membership",
    "Offered",
    "OutboxEvent",
    "Page",
    "PublishedRun",
    "Registration",
    "Registry",
    "Retention",
    "RunStore",
    "Skip",
    "TargetHealth",
    "TargetHealthReport",
    "TargetView",
]

# ---------------------------------------------------------------------- the registry (API side)


@dataclass(frozen=True, slots=True)
class IdempotencyRequest:
    key: str
    body_hash: bytes


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class OwnerRun:
    """A run of the owner's history across jobs: the run and the job it belongs to."""

    job_id: uuid.UUID
    run: Run


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Backfill:
    """What a backfill queued: how many occurrences, the oldest and the newest."""

    queued: int
    first: datetime | None
    last: datetime | None


BulkAction = Literal["pause", "resume", "cancel"]


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What one bulk call did: jobs it found that the action applies to (at most the bound), how
    many of them it changed, and whether more such jobs are left for the next call."""

    matched: int
    changed: int
    more: bool


class NameHolderChanged(Exception):
    """``apply_job``: the job holding the name is not the one the caller built its spec against
    (a concurrent PUT created or cancelled it). The caller reads the holder again and retries."""


@dataclass(frozen=True, slots=True)
class SigningKeys:
    """An owner's webhook signing secrets: the current one, and the one it replaced with the end
    of its grace (both None when the secret was never rotated)."""

    current: str
    previous: str | None
    previous_valid_until: datetime | None

    def valid_at(self, now: datetime) -> tuple[str, ...]:
        """The secrets that sign at ``now``: the current one, then the previous during its grace."""
        if (
            self.previous is not None
            and self.previous_valid_until is not None
            and now < self.previous_valid_until
        ):
            return (self.current, self.previous)
        return (self.current,)


@dataclass(frozen=True, slots=True)
class SecretRotation:
    owner: str
    signing_secret: str
    previous_valid_until: datetime


@dataclass(frozen=True, slots=True)
class ApiKeyInfo:
    """What may be shown of an API key: its prefix (the key itself is never stored)."""

    prefix: str
    owner: str
    created_at: datetime
    revoked_at: datetime | None


class Registry(Protocol):
    """What the API needs. Every call is scoped by owner: another owner's job is NotFound.

    Every call that changes a job writes its change record (core/changes.py) in the transaction of
    the change, naming ``by`` (the API key's id and the call's reason); a call that changes
    nothing (a pause of a paused job, a PUT or PATCH that alters no field) writes none."""

    async def create_job(
        self,
        owner: str,
        spec: JobSpec,
        *,
        idempotency: IdempotencyRequest | None = None,
        by: ChangeBy = UNNAMED,
    ) -> tuple[Job, bool]:
        """Returns (job, created). Same key + same body: the original job and False (and no
        second record). Same key + different body: ``InvalidRequest(code="idempotency_key_reused")``."""
        ...

    async def get_job(self, owner: str, job_id: uuid.UUID) -> Job: ...

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
        """Stable order (by id); following next_cursor to the end lists every job once. With
        ``labels``, only jobs carrying every pair; with ``name_prefix``, only names starting so.
        A cursor we did not issue raises ``InvalidRequest(code="invalid_cursor", field="cursor")``."""
        ...

    async def get_job_by_name(self, owner: str, name: str) -> Job:
        """The job (not cancelled) that holds this name; NotFound when none does."""
        ...

    async def apply_job(
        self, owner: str, spec: JobSpec, *, expected_id: str | None, by: ChangeBy = UNNAMED
    ) -> tuple[Job, bool]:
        """PUT by name (``spec.name`` is set): create the job when no job holds the name (True),
        else make the holder match ``spec`` as a PATCH of every field would (False); a spec equal
        to the holder's writes nothing. ``expected_id`` is the holder the caller built ``spec``
        against (None: none); another one raises ``NameHolderChanged``. A name another job holds
        makes a create or a rename answer ``Conflict(code="name_taken")``. Recorded as
        ``create`` or ``replace``."""
        ...

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
        """Pause, resume or cancel up to ``max_jobs`` of the owner's jobs that carry every label
        (and are in ``state``, if given) and that the action would change, each under the same
        rules as the single-job call, with a change record each (written a batch at a time). A
        pause says ``pause`` (its note and until) for every job it pauses."""
        ...

    async def update_job(
        self, owner: str, job_id: uuid.UUID, spec: JobSpec, *, by: ChangeBy = UNNAMED
    ) -> Job:
        """Replace the spec (the API merged the PATCH); recompute next_run_at on a schedule change.
        Conflict on a cancelled or completed job."""
        ...

    async def cancel_job(self, owner: str, job_id: uuid.UUID, *, by: ChangeBy = UNNAMED) -> Job: ...

    async def pause_job(
        self, owner: str, job_id: uuid.UUID, *, by: ChangeBy = UNNAMED, pause: PauseRequest = PLAIN_PAUSE
    ) -> Job:
        """Pause a scheduled job, keeping what ``pause`` says (a note; a time to resume at) and who
        paused it (``by``), shown while it is paused. A paused job is left as it is (no-op)."""
        ...

    async def resume_job(self, owner: str, job_id: uuid.UUID, *, by: ChangeBy = UNNAMED) -> Job: ...

    async def trigger_job(
        self, owner: str, job_id: uuid.UUID, *, max_pending: int = 0, by: ChangeBy = UNNAMED
    ) -> Job:
        """Queue one extra run now, besides the schedule. Conflict unless the job is scheduled, and
        (``too_many_triggers``) when ``max_pending`` (> 0) triggers already wait."""
        ...

    async def replay_job(self, owner: str, job_id: uuid.UUID, *, by: ChangeBy = UNNAMED) -> Job: ...

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
        """Queue a run of every occurrence of a recurring job in [start, end) (see core.backfill);
        recorded when it queued any."""
        ...

    async def replay_occurrence(
        self,
        owner: str,
        job_id: uuid.UUID,
        scheduled_for: datetime,
        *,
        max_pending: int = 0,
        by: ChangeBy = UNNAMED,
    ) -> Job:
        """Run one failed occurrence of a recurring job once more, in a row of its own (its own
        ``scheduled_for``, so its own Idempotency-Key), as a backfilled run: now under ``overlap:
        allow``, else at the end of the job's line of occurrence rows. Conflict
        ``occurrence_not_failed`` when the history has no failed final attempt for it;
        ``too_many_replays`` when ``max_pending`` (> 0) replayed or backfilled runs already wait
        (storage/registry_rules.py ``replay_plan``)."""
        ...

    async def list_runs(
        self, owner: str, job_id: uuid.UUID, *, limit: int, cursor: str | None
    ) -> Page[Run]: ...

    async def list_changes(
        self, owner: str, job_id: uuid.UUID, *, limit: int, cursor: str | None
    ) -> Page[Change]:
        """The job's change records, newest (highest ``seq``) first."""
        ...

    async def list_owner_runs(
        self,
        owner: str,
        *,
        outcome: str | None,
        since: datetime | None,
        limit: int,
        cursor: str | None,
    ) -> Page[OwnerRun]:
        """The owner's runs across all jobs, newest (by finished_at) first (GET /v1/runs)."""
        ...

    async def count_active_jobs(self, owner: str) -> int:
        """Scheduled and paused jobs of this owner (for the per-owner cap)."""
        ...

    async def active_job_bytes(self, owner: str) -> int:
        """Bytes the specs of this owner's scheduled and paused jobs take (for the per-owner cap)."""
        ...

    async def owner_for_key(self, api_key: str) -> str | None: ...

    async def create_api_key(self, owner: str) -> tuple[str, str]:
        """Returns (api_key, signing_secret); makes the owner and its secret when new."""
        ...

    async def revoke_api_key(self, api_key_or_prefix: str) -> int: ...

    async def signing_secret(self, owner: str) -> str | None: ...

    async def cursor_key(self) -> bytes:
        """The installation's 32-byte key for sealing page cursors (api/cursors.py).

        One per installation, the same for every API process, so a cursor one process issued
        opens on any other behind the same load balancer; made at the first call (concurrent
        first calls agree on one) and never changed, so cursors stay valid across restarts."""
        ...

    async def ping(self) -> None:
        """Raises StorageUnavailable when any database in the shard map cannot be reached."""
        ...


# ---------------------------------------------------------------------- the run store (engine, workers)


@dataclass(frozen=True, slots=True)
class CompletionStats:
    """What a fenced write did: rows finished (``applied``), items whose lease no longer held
    (``stale``, nothing written for them) and history rows recorded."""

    applied: int = 0
    stale: int = 0
    history: int = 0

    def __add__(self, other: CompletionStats) -> CompletionStats:
        return CompletionStats(
            self.applied + other.applied, self.stale + other.stale, self.history + other.history
        )


class DueListener(Protocol):
    """A subscription to "a row of these shards became due soon" (see ``RunStore.listen_due``)."""

    async def keep(self) -> None:
        """Subscribe again where the subscription was lost (a database restarted), waking the
        shards whose hints may have been missed meanwhile; cheap when nothing was lost."""
        ...

    async def close(self) -> None: ...


class RunStore(Protocol):
    """What the engine and the workers need: the run path from claim to completion, the janitor,
    and the leases of runs on the NATS run queue. Every method works on a batch and costs a few
    statements whatever its size; a lease token that no longer matches makes an item a no-op."""

    def database_of(self, shard: int) -> int:
        """Which database holds ``shard``, as a small number (the same for shards on one primary).

        The run path batches its work per database with it, so one primary's trouble (an outage,
        a deadlock, a hung statement) holds back only the work of its own shards."""
        ...

    # -- claims, fence, heartbeats (storage/postgres/runpath.py)

    async def claim_due(
        self, shard: int, engine_id: str, *, lookahead_s: float, lease_s: float, limit: int
    ) -> list[Claim]:
        """Lease up to ``limit`` idle scheduled rows of ``shard`` due within ``lookahead_s``,
        skipping rows another claimer holds; each gets a new (larger) token and a lease until
        its due time plus ``lease_s``."""
        ...

    async def retake_claims(self, engine_id: str, shards: Sequence[int], *, lease_s: float) -> list[Claim]:
        """A restarted engine takes back what its previous life claimed on ``shards``, under new
        tokens (which fence whatever the old process may still hold)."""
        ...

    async def fence_runs(self, items: Sequence[FenceItem], *, lease_s: float) -> list[FencedRun]:
        """claimed → running where the token still matches and the job is still scheduled; what
        is returned may be called, what is not must not be."""
        ...

    async def extend_leases(self, leases: Sequence[Leased], *, lease_s: float) -> set[uuid.UUID]:
        """Heartbeat: the ids whose lease still holds, extended by ``lease_s`` from now."""
        ...

    async def keep_waiting_claims(
        self, shard: int, engine_id: str, *, within_s: float, extend_s: float, limit: int
    ) -> int:
        """Extend ``engine_id``'s claims on ``shard`` that would lapse within ``within_s``."""
        ...

    async def release_claims(self, leases: Sequence[Leased]) -> int:
        """Give back claims that were not fired (shutdown); they are claimable at once."""
        ...

    async def return_unstarted(self, leases: Sequence[Leased]) -> int:
        """Give back fenced runs that were never called (a worker stops while they wait for
        their host): idle and claimable at once, their attempt unused. A run an owner's edit has
        rewritten since its fence is left to its new plan. Returns how many were given back."""
        ...

    # -- the completion writer (storage/postgres/completion.py)

    async def complete_runs(self, reports: Sequence[AttemptReport]) -> CompletionStats:
        """Finish attempts under their leases (``core.lifecycle`` decides what each row becomes)."""
        ...

    async def skip_missed(self, items: Sequence[Skip]) -> CompletionStats:
        """Record missed occurrences as skipped and move claimed rows on to their next one."""
        ...

    # -- the janitor (storage/postgres/maintenance.py)

    async def rescue_expired(self, shard: int, *, limit: int) -> CompletionStats:
        """Lapsed leases on ``shard``: a claimed row is given back, a running one is finished as
        ``lease_expired`` and retried under the job's policy."""
        ...

    async def expire_running_of(self, engine_id: str, shards: Sequence[int]) -> CompletionStats:
        """On restart: the calls ``engine_id`` had in flight on ``shards`` have unknown outcomes."""
        ...

    async def split_overlapping(self, shard: int, *, horizon_s: float, limit: int = 500) -> int:
        """overlap=allow: hand occurrences due beside a run in flight to rows of their own."""
        ...

    async def complete_drained_jobs(self, shard: int) -> int: ...

    async def release_stalled_backfills(self, shard: int) -> int: ...

    async def end_pauses(self, shard: int, *, limit: int) -> int:
        """Resume up to ``limit`` jobs of ``shard`` whose pause's ``until`` has come, as an owner's
        resume does (their missed occurrences then follow their misfire policy), each with its
        ``auto_resume`` change record; returns how many. Safe to call from every engine serving
        the shard at once: a job is resumed once."""
        ...

    async def purge_idempotency_keys(self, older_than_s: float) -> None: ...

    async def db_now(self, shard: int = 0) -> datetime:
        """The store's clock (leases are in its time, not the caller's)."""
        ...

    # -- wake-ups

    async def listen_due(self, shards: Sequence[int], wake: Callable[[int], None]) -> DueListener:
        """Call ``wake(shard)`` soon after a row of one of ``shards`` becomes due within the
        engines' lookahead (a hint: a lost one costs a poll interval). Failing to listen is not
        an error: the engine polls."""
        ...

    # -- the NATS run queue's leases (storage/postgres/queue_leases.py)

    async def take_runs(self, items: Sequence[Offered], *, holder: str, lease_s: float) -> set[Lease]:
        """A worker ``holder`` takes the leases of published runs still running under their token
        and publisher; returns those it now holds (by token: a stale message may carry an old one)."""
        ...

    async def extend_published(
        self, leases: Sequence[Leased], *, holder: str, lease_s: float
    ) -> set[uuid.UUID]:
        """The publishing engine ``holder`` keeps the leases of runs no worker took yet."""
        ...

    async def expire_published_of(self, engine_id: str, shards: Sequence[int]) -> int:
        """A restarted engine finishes what its previous life published and nobody took."""
        ...

    # -- what workers read besides the run path

    async def signing_secret(self, owner: str) -> str | None: ...

    async def signing_keys(self, owner: str) -> SigningKeys | None:
        """The owner's current secret and, during a rotation's grace, the previous one."""
        ...


# ---------------------------------------------------------------------- the failure events' outbox


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """A failure event claimed for delivery (core/failures.py made it): where it goes, what it
    says, and which attempt of its delivery this is (``attempts``, 1-based, fences the settle)."""

    seq: int
    database: str  # which database holds the row (an opaque name the store hands back)
    event_id: str  # <job id>:<scheduled_for>:<type>, the webhook-id
    kind: str
    job_id: uuid.UUID
    owner: str
    scheduled_for: datetime
    fencing_token: int
    target: Target
    body: dict[str, object]
    attempts: int


@dataclass(frozen=True, slots=True)
class EventSettlement:
    """How one delivery attempt of an event went: delivered, to be tried again at ``retry_at``,
    or (neither) given up on."""

    event: OutboxEvent
    delivered: bool
    retry_at: datetime | None = None
    error: str | None = None


class EventOutbox(Protocol):
    """What the delivery service of failure events asks of storage (workers/events.py)."""

    async def claim_events(self, *, limit: int, lease_s: float) -> list[OutboxEvent]:
        """Up to ``limit`` due events across every database, each leased for ``lease_s`` seconds
        (SKIP LOCKED: several processes share the outbox)."""
        ...

    async def settle_events(self, settlements: Sequence[EventSettlement]) -> None:
        """Delete the delivered events, set the next attempt (or give up) on the rest; an event
        whose lease another holder took over is left alone."""
        ...

    async def purge_given_up_events(self, *, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` events per database given up on before ``before``."""
        ...

    async def signing_keys(self, owner: str) -> SigningKeys | None: ...


# ---------------------------------------------------------------------- flow control (workers)


@dataclass(frozen=True, slots=True)
class FlowAsk:
    """One worker's request for one flow key (``target.flow``) of one owner.

    ``want``: calls it could start now; ``running``: its calls of this key in flight now (its
    previous grants it has not finished). The limits are the strictest its waiting runs carry.
    """

    owner: str
    key: str
    rate_per_s: float
    parallelism: int
    want: int
    running: int


@dataclass(frozen=True, slots=True)
class FlowGrant:
    """How many calls of a flow key the asking worker may start now: each took one rate token
    and one parallelism slot of the key's cluster-wide limits."""

    owner: str
    key: str
    granted: int


class FlowControl(Protocol):
    """The cluster-wide limits of flow keys, kept in the home database (workers/pool.py, its flow loop)."""

    async def take_flow(self, worker: str, asks: Sequence[FlowAsk], *, hold_s: float) -> list[FlowGrant]:
        """One grant per ask, in order, in one round trip for all of a worker's keys.

        A worker's slots are what it reports ``running`` plus what it is granted now; they count
        against the key's parallelism for ``hold_s`` seconds unless renewed by the next ask (a
        worker that dies gives its slots back when they lapse). An ask with ``want`` and
        ``running`` both 0 gives the worker's slots back at once.

        One ask per (owner, key) per call, and one call at a time per ``worker`` (each call sets
        the worker's slots of a key, it does not add to them); a repeated key or a negative count
        raises ``ValueError`` (storage/flow_rules.py).
        """
        ...


# ---------------------------------------------------------------------- target health (workers, API)


@dataclass(frozen=True, slots=True)
class TargetHealthReport:
    """One worker's view of one host for one owner: the host's state and limit (the same for
    every owner) and that owner's calls to it over the last five minutes."""

    owner: str
    host: str  # host:port
    state: TargetState
    concurrency_limit: int
    backoff_until: datetime | None
    calls_5m: int
    timeouts_5m: int
    errors_5m: int


@dataclass(frozen=True, slots=True)
class TargetView:
    """``GET /v1/targets``' item: one host of the owner's, as all live workers see it together
    (the worst state, the sum of their limits, the latest back-off, the sums of the counts)."""

    host: str
    state: TargetState
    concurrency_limit: int
    backoff_until: datetime | None
    calls_5m: int
    timeouts_5m: int
    errors_5m: int


class TargetHealth(Protocol):
    """Workers report what they see of target hosts; the API lists it per owner."""

    async def report_target_health(self, worker: str, reports: Sequence[TargetHealthReport]) -> None:
        """Replace what ``worker`` said before of these (owner, host) pairs; reports older than
        a few minutes (a worker that stopped) no longer count."""
        ...

    async def list_targets(self, owner: str, *, limit: int, cursor: str | None) -> Page[TargetView]:
        """The owner's hosts in host order, from live reports only."""
        ...


# ---------------------------------------------------------------------- what the API is given


class ApiStore(Registry, TargetHealth, Protocol):
    """Everything the API asks of storage: the registry, and the target health it lists. The
    composition root hands it the concrete store (``PostgresStore``; ``MemoryStore`` in tests)."""


# ---------------------------------------------------------------------- the engines' membership (engine)


@dataclass(frozen=True, slots=True)
class Registration:
    """What an engine registers under: its id, where it runs, what it may serve, and the
    incarnation (one per process) that tells its own row from a later process's under the id."""

    engine_id: str
    host: str
    allowed: frozenset[int]
    lease_s: float
    replicas: int
    incarnation: uuid.UUID


@dataclass(frozen=True, slots=True)
class EngineRecord:
    """One member, as read (its heartbeat's age and liveness by the store's clock)."""

    engine_id: str
    host: str
    allowed: frozenset[int]
    serving: frozenset[int]
    lease_s: float
    replicas: int
    incarnation: uuid.UUID
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_s: float
    live: bool

    def member(self) -> Member:
        return Member(self.engine_id, self.allowed)


class EngineIdLock(Protocol):
    """What makes an engine id one live process's, held for the process's whole life (frozen or
    not) and gone with it when it dies (``Membership.engine_id_lock``)."""

    async def acquire(self, within_s: float) -> bool:
        """Take the lock, trying for up to ``within_s`` (a killed predecessor lets go a moment
        after its death); False when another process holds it."""
        ...

    async def held(self) -> bool:
        """Whether this process still holds the id: after its hold was lost (the store restarted,
        the network cut) it takes the lock again; False when another process took it meanwhile.
        Raises ``StorageUnavailable`` while the store cannot be asked."""
        ...

    async def release(self) -> None: ...


class Membership(Protocol):
    """Who is in the cluster (engine/membership.py): one membership for every engine, on the home
    database; "live" is decided by the store's clock against each member's own lease."""

    async def join_engine(self, reg: Registration) -> None:
        """Register (a restart under the same id is the same member, with a new incarnation)."""
        ...

    async def heartbeat_engine(self, reg: Registration, serving: Iterable[int]) -> bool:
        """Refresh this process's heartbeat and what it serves; False when the row is not its own
        any more (another process registered under the id, or the row was forgotten)."""
        ...

    async def set_engine_serving(self, reg: Registration, serving: Iterable[int]) -> None: ...

    async def leave_engine(self, reg: Registration) -> None:
        """A graceful stop: the others deal without this engine at their next heartbeat."""
        ...

    async def list_engines(self) -> list[EngineRecord]:
        """Every member, live or dead, by id."""
        ...

    async def forget_dead_engines(self, older_than_s: float) -> int:
        """Forget members silent for longer than ``older_than_s`` and their own lease."""
        ...

    def engine_id_lock(self, engine_id: str) -> EngineIdLock:
        """A lock on ``engine_id``, not taken yet (``acquire``)."""
        ...


# ---------------------------------------------------------------------- retention (engine)


@dataclass(frozen=True, slots=True)
class HistorySweep:
    """One batch of the history sweep: how many rows went, and the last run id it walked (the
    next batch starts after it; None when there was nothing after the batch's start)."""

    deleted: int
    walked: int | None


@dataclass(frozen=True, slots=True)
class FinishedJobsSweep:
    """One batch of finished jobs deleted: the jobs, and the history rows that went with them."""

    jobs: int
    history: int


class Retention(Protocol):
    """What the maintenance service deletes (engine/retention.py), one batch per call and
    database, each call a short transaction of its own."""

    def databases(self) -> list[str]:
        """The store's databases, by the names the calls below take (a PostgreSQL store's DSNs)."""
        ...

    async def delete_old_runs(
        self, dsn: str, *, before: datetime, limit: int, after: int = 0
    ) -> HistorySweep | None:
        """History rows that finished before ``before``, among the oldest ``limit`` with a run id
        above ``after``; None when another process holds this database's maintenance lock."""
        ...

    async def delete_finished_jobs(
        self, dsn: str, *, before: datetime, limit: int
    ) -> FinishedJobsSweep | None:
        """Up to ``limit`` jobs finished (completed, cancelled, dead) before ``before``, none with
        a run in flight, with their history, Idempotency-Keys and occurrence rows; None when
        another process holds this database's maintenance lock."""
        ...

    async def purge_target_health(self, *, older_than_s: float) -> int:
        """Target health reports older than ``older_than_s`` (workers long gone)."""
        ...


# ---------------------------------------------------------------------- due age (engine)


@dataclass(frozen=True, slots=True)
class DueBacklog:
    """One shard's reading: seconds since its earliest unclaimed due row fell due (0 = none)."""

    shard: int
    oldest_age_s: float


class DueAge(Protocol):
    """How long each shard's oldest due row has waited for a claim (engine/due_age.py)."""

    async def oldest_unclaimed_due(self, shards: Iterable[int]) -> list[DueBacklog]:
        """A reading for each of ``shards`` (0 when nothing due waits); raises
        ``StorageUnavailable`` when a database is down."""
        ...
