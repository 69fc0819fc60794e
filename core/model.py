"""The domain records of Duetime: frozen, validated once at the edge, shared by every layer.

Nothing here imports asyncpg, aiohttp or prometheus: storage, engine, workers and API depend on
this module, never the other way round. Datetimes are aware and in UTC everywhere; naive ones are
refused by the validators in ``core.validation`` before they get this far.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any


class JobState(enum.StrEnum):
    """The lifecycle a job owner sees (``state`` in the API). See docs/state-machine.md."""

    SCHEDULED = "scheduled"
    PAUSED = "paused"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    DEAD = "dead"


class ActorType(enum.StrEnum):
    """Who made a change (or a pause): an owner through the API, or Duetime itself."""

    OWNER = "owner"
    DUETIME = "duetime"


class Phase(enum.StrEnum):
    """Where the job's current run is in the run path; internal, never shown by the API.

    Kept apart from ``JobState`` so that a pause or cancel can land while a call is in flight
    without losing the in-flight run's history: the lease stays valid, only the lifecycle moves.
    """

    IDLE = "idle"  # waiting for its next_run_at; claimable when state is scheduled
    CLAIMED = "claimed"  # leased by an engine, waiting in its wheel
    RUNNING = "running"  # fenced by a worker, the call is (or may be) in flight


class Misfire(enum.StrEnum):
    RUN_ONCE = "run_once"
    RUN_ALL = "run_all"
    SKIP = "skip"


class Overlap(enum.StrEnum):
    """What a recurring job does when an occurrence comes due while its previous run is in flight."""

    ALLOW = "allow"  # start it on time, in a run of its own: runs of the job may overlap
    SKIP = "skip"  # record it as skipped, reason overlap
    BUFFER_ONE = "buffer_one"  # run one of them right after the current run ends; skip the rest


class DstGap(enum.StrEnum):
    SHIFT = "shift"
    SKIP = "skip"


class DstOverlap(enum.StrEnum):
    FIRST = "first"
    BOTH = "both"


class Outcome(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    LEASE_EXPIRED = "lease_expired"
    SKIPPED = "skipped"


class WebhookMethod(enum.StrEnum):
    POST = "POST"
    PUT = "PUT"


class Broker(enum.StrEnum):
    NATS = "nats"
    REDIS = "redis"


@dataclass(frozen=True, slots=True)
class Flow:
    """Flow control (``target.flow``): every job of one owner naming ``key`` shares these limits
    across the whole cluster. Calls over them wait; they are not failed and use no attempt."""

    key: str
    rate_per_s: float
    parallelism: int


@dataclass(frozen=True, slots=True)
class WebhookTarget:
    url: str
    method: WebhookMethod = WebhookMethod.POST
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: int = 30
    type: str = "webhook"
    flow: Flow | None = None


@dataclass(frozen=True, slots=True)
class QueueTarget:
    broker: Broker
    topic: str
    type: str = "queue"
    flow: Flow | None = None


class TargetState(enum.StrEnum):
    """A target host's health as a worker sees it (workers/health.py, docs/targets.md)."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"  # fewer calls at once: its calls time out or are refused
    BACKING_OFF = "backing_off"  # no calls until a moment, then one probe at a time


Target = WebhookTarget | QueueTarget


@dataclass(frozen=True, slots=True)
class OneOffSchedule:
    run_at: datetime


@dataclass(frozen=True, slots=True)
class DateRange:
    """Local calendar days ``first`` to ``last`` inclusive (one day when they are equal)."""

    first: date
    last: date


@dataclass(frozen=True, slots=True)
class CronSchedule:
    cron: str
    timezone: str = "UTC"
    start_at: datetime | None = None
    end_at: datetime | None = None
    dst_gap: DstGap = DstGap.SHIFT
    dst_overlap: DstOverlap = DstOverlap.FIRST
    exclude: tuple[DateRange, ...] = ()


@dataclass(frozen=True, slots=True)
class IntervalSchedule:
    """``start_at + k × every`` in exact elapsed time (see core/interval.py).

    ``every`` is kept as written (``"1h30m"``) and ``every_s`` is its value; ``timezone`` only
    says on which wall clock the ``exclude`` dates are read.
    """

    every: str
    every_s: int
    start_at: datetime
    end_at: datetime | None = None
    timezone: str = "UTC"
    exclude: tuple[DateRange, ...] = ()


Schedule = OneOffSchedule | CronSchedule | IntervalSchedule
RecurringSchedule = CronSchedule | IntervalSchedule


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 5
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 600.0
    backoff_multiplier: float = 2.0
    # No attempt starts later than this after the occurrence was due (None: no such bound).
    max_duration_s: int | None = None


@dataclass(frozen=True, slots=True)
class OnFailure:
    """Where a job's failure events go (``job.failing``, ``job.paused``, ``job.recovered``), and
    after how many consecutive failed occurrences it counts as failing (core/failures.py)."""

    target: Target
    after: int = 1


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Everything an owner says about a job: what POST takes, with every default filled in."""

    target: Target
    schedule: Schedule
    name: str | None = None
    payload: Any = None
    # Owner-chosen tags, selected by lists and bulk actions (core.labels has the grammar).
    labels: dict[str, str] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    misfire: Misfire = Misfire.RUN_ONCE
    misfire_grace_s: int = 60
    jitter_s: int = 0
    # A fixed per-job offset window: every occurrence is due at its time plus the job's own offset
    # in [0, spread_s) (core.jitter.spread_ms), so a thousand "0 * * * *" jobs do not fire at once.
    spread_s: int = 0
    overlap: Overlap = Overlap.ALLOW
    on_failure: OnFailure | None = None
    # After this many consecutive failed occurrences the job is paused (None: never).
    pause_after_failures: int | None = None

    @property
    def recurring(self) -> bool:
        return isinstance(self.schedule, CronSchedule | IntervalSchedule)


@dataclass(frozen=True, slots=True)
class Run:
    """One attempt of one occurrence, as the history keeps it."""

    scheduled_for: datetime
    attempt: int
    started_at: datetime | None
    finished_at: datetime | None
    outcome: Outcome
    status_code: int | None = None
    error: str | None = None
    lateness_ms: int | None = None
    # The job's spec_version this run ran under (a skipped occurrence: the one in force when it
    # was skipped). History from before versions were kept reads as 1, the version every job
    # had then.
    spec_version: int = 1


@dataclass(frozen=True, slots=True)
class Paused:
    """What the pause of a paused job said (the Job's ``paused`` object): when it paused (None
    for a job paused before this was kept), the owner's note, when Duetime resumes it by itself
    (None: never), and who paused it (an owner's API key, or Duetime for pause_after_failures)."""

    at: datetime | None
    note: str | None
    until: datetime | None
    actor: ActorType
    key_id: str | None


@dataclass(frozen=True, slots=True)
class PauseRequest:
    """What a pause call asks besides the pause itself: a note, and a time to resume at."""

    note: str | None = None
    until: datetime | None = None


#: A pause that says nothing more.
PLAIN_PAUSE = PauseRequest()


@dataclass(frozen=True, slots=True)
class Job:
    """A job as the registry holds it and the API shows it."""

    id: str
    owner: str
    spec: JobSpec
    state: JobState
    next_run_at: datetime | None
    attempt: int
    created_at: datetime
    updated_at: datetime
    last_run: Run | None = None
    # 1 at create, one more for each change that altered the spec (core/changes.py).
    spec_version: int = 1
    # While paused: what its pause said; None in any other state.
    paused: Paused | None = None
