"""The run path's vocabulary: the records a run travels in from its claim to its recorded outcome.

Pure, like the rest of the core: storage builds these from rows, the engine and the workers pass
them on, and storage finishes them. One record per stage, each carrying the previous one by
reference rather than copying its fields:

  Claim ──(wheel entry, runqueue.wire)──▶ FencedRun ──▶ Delivery ──▶ Verdict ──▶ AttemptReport
  (leased into a wheel)               (may be called) (what the   (how the    (the run + its
                                                      target gets) call went)  verdict + times)

A ``Delivery`` of a run carries its ``RunContext`` (the spec version, the occurrence before, the
last success, what a run_once run folded), worked out once when the delivery is built.

``Skip`` is the other way a claim ends (the misfire policy passes its occurrences over). The spec
a run was fenced with travels as one ``RunSpec`` (its text, version and parsed form, parsed at most
once per run) from the fence to the completion, which reuses it while the row's text is unchanged.

Every record is a frozen slots dataclass: the run path moves a hundred thousand of them a burst,
and a slots instance costs about what the tuple it replaces did.
"""

from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from duetime.core import codec, signing
from duetime.core.model import JobSpec, OneOffSchedule, Outcome, Target
from duetime.core.schedule import epoch_us, folded_count, previous_occurrence
from duetime.core.spectext import spec_from_text


class Leased(Protocol):
    """Anything that names a row's lease: the row, its shard (which database), the token it holds.

    Claims, wheel entries, fenced runs and reports all do, so release, heartbeat and fence take
    them as they are instead of a tuple built per call."""

    @property
    def job_id(self) -> uuid.UUID: ...

    @property
    def shard(self) -> int: ...

    @property
    def lease_token(self) -> int: ...


class FenceItem(Leased, Protocol):
    """A lease and the occurrence it fires for (a misfire's run_once may move it): what the fence
    needs of a fired wheel entry (``runqueue.wire.WheelEntry``) or of a claim.

    Also in the forms a wheel entry holds them (the id's 16 bytes, the occurrence in µs since the
    epoch), which the PostgreSQL fence sends as they are: building a ``UUID`` and a ``datetime``
    per run for the driver to take apart again was a quarter of the fence's CPU on the node."""

    @property
    def scheduled_for(self) -> datetime: ...

    @property
    def job_id_bytes(self) -> bytes: ...

    @property
    def scheduled_for_us(self) -> int: ...


class Offered(Leased, Protocol):
    """A run's lease as a run-queue message offers it, and the engine that published it: a worker
    may take the lease only from that engine (``take_runs``)."""

    @property
    def publisher(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Lease:
    """A row's lease on its own: the row, its shard and the fencing token it holds (what a store
    answers a take with, and what a holder keeps when it does not keep the run)."""

    job_id: uuid.UUID
    shard: int
    lease_token: int


class _FenceForms:
    """``FenceItem``'s packed forms, for the records that keep a ``UUID`` and a ``datetime``."""

    __slots__ = ()
    job_id: uuid.UUID
    scheduled_for: datetime

    @property
    def job_id_bytes(self) -> bytes:
        return self.job_id.bytes

    @property
    def scheduled_for_us(self) -> int:
        return epoch_us(self.scheduled_for)


@dataclass(frozen=True, slots=True)
class FenceRequest(_FenceForms):
    """A ``FenceItem`` on its own (the engine passes its fired wheel entries as they are)."""

    job_id: uuid.UUID
    shard: int
    lease_token: int
    scheduled_for: datetime


@dataclass(frozen=True, slots=True)
class PublishedRun:
    """An ``Offered`` lease on its own (a worker passes the decoded messages as they are)."""

    job_id: uuid.UUID
    shard: int
    lease_token: int
    publisher: str


@dataclass(frozen=True, slots=True)
class RunSpec:
    """The spec a run was fenced with: the row's ``spec`` text, its ``spec_version``, and the parsed
    ``JobSpec``, decoded on first use and then kept.

    The fence reads the text; the engine never needs the parsed form (NATS: the text is published
    as it is), the worker parses it once for the call, and the completion reuses that parse while
    the row's text is still the same (``reuse``): one decode per run, not three.
    """

    text: str
    version: int
    _parsed: JobSpec | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, spec: JobSpec, version: int = 1) -> RunSpec:
        """A spec we hold parsed already (tests, tools): its canonical text, and the spec itself."""
        return cls(json.dumps(codec.spec_to_json(spec), separators=(",", ":")), version, spec)

    @property
    def parsed(self) -> JobSpec:
        spec = self._parsed
        if spec is None:
            spec = spec_from_text(self.text)
            object.__setattr__(self, "_parsed", spec)  # a cache, not a change: same value each time
        return spec

    @property
    def parsed_already(self) -> JobSpec | None:
        """The parsed spec if it was parsed already (the worker parses it for its call), else None:
        for a use that can do without it rather than decode it (the completion's one statement)."""
        return self._parsed

    def reuse(self, text: str) -> JobSpec:
        """The parsed spec of a row whose spec text is now ``text``: this one's parse while the text
        is unchanged since the fence (the common case), else ``text`` decoded."""
        if text == self.text:
            return self.parsed
        return spec_from_text(text)


@dataclass(frozen=True, slots=True)
class Claim(_FenceForms):
    """A row leased into an engine's wheel (claim_due, retake_claims). ``misfire_spec`` is set
    only when the row is overdue past its grace, or is a recurring row a second or more behind
    (``core.misfire.MISSED_SQL``), so the engine can apply the job's misfire policy or start a
    catch-up; ``db_now`` is the database's clock at the claim."""

    job_id: uuid.UUID
    shard: int
    lease_token: int
    due_at: datetime
    scheduled_for: datetime
    attempt: int
    run_kind: str
    db_now: datetime
    owner: str = ""
    misfire_spec: JobSpec | None = None


@dataclass(frozen=True, slots=True)
class FencedRun:
    """A run that passed the fence (claimed → running): it may be called, as attempt ``attempt``."""

    job_id: uuid.UUID
    shard: int
    owner: str
    lease_token: int
    scheduled_for: datetime
    due_at: datetime
    attempt: int  # this call's attempt number, 1-based
    spec: RunSpec
    run_kind: str
    # Set on an occurrence row (overlap=allow, backfill): the job it runs an occurrence of. The
    # target sees this id (Duetime-Job-Id, Idempotency-Key); the lease is the row's own.
    parent_id: uuid.UUID | None = None
    # What the fence read for the run's context (RunContext), all of the job's own row (an
    # occurrence row's parent): when the job was made (its first occurrence follows from it), the
    # newest occurrence that succeeded before this fence, and, for a run that stands for missed
    # occurrences run_once folded into it, the oldest of them (migration 0019). None: not known
    # (a message of an engine before them), or none.
    job_created_at: datetime | None = None
    last_success_for: datetime | None = None
    folded_from: datetime | None = None
    # The job's spec_version as the API shows it (jobs.spec_revision, migration 0018) when the run
    # was fenced: what its history row records and its target is told. None: a message of an
    # engine before it (``spec_version`` then says the run path's own version, ``spec.version``).
    spec_revision: int | None = None

    @property
    def public_id(self) -> uuid.UUID:
        return self.parent_id or self.job_id

    @property
    def spec_version(self) -> int:
        """The spec version the run runs under, as the API counts it (Duetime-Spec-Version).
        Not ``spec.version``: that one counts only changes of timing and fences completions."""
        return self.spec.version if self.spec_revision is None else self.spec_revision


@dataclass(frozen=True, slots=True)
class Published:
    """A fenced run as a run-queue message carries it, with the engine that published it: a worker
    may take its lease only from that engine (``take_runs``)."""

    run: FencedRun
    publisher: str

    @property
    def job_id(self) -> uuid.UUID:
        return self.run.job_id

    @property
    def shard(self) -> int:
        return self.run.shard

    @property
    def lease_token(self) -> int:
        return self.run.lease_token


@dataclass(frozen=True, slots=True)
class RunContext:
    """What a run's target is told about the run besides its occurrence (docs/targets.md, "Run
    context"): the spec version it runs under, the occurrence the schedule defined before this one
    (whether or not it ran), the newest occurrence of the job that succeeded before this attempt
    was fenced, and, when a run_once run stands for missed occurrences, how many (itself not
    counted) and the oldest of them. Worked out once per attempt, when its ``Delivery`` is built:
    the schedule math from the parsed spec (the worker parses it for the call anyway), the rest as
    the fence read it."""

    spec_version: int
    previous_for: datetime | None = None
    last_success_for: datetime | None = None
    folded_count: int = 0
    folded_from: datetime | None = None

    @classmethod
    def of(cls, run: FencedRun, spec: JobSpec) -> RunContext:
        schedule = spec.schedule
        if isinstance(schedule, OneOffSchedule):  # one occurrence: nothing before it, nothing folded
            if run.last_success_for is None:
                return _version_only(run.spec_version)  # a burst's run: no record made
            return cls(run.spec_version, None, run.last_success_for)
        previous = previous_occurrence(schedule, run.scheduled_for, run.job_created_at)
        folded_from = run.folded_from
        count = 0
        if folded_from is not None:
            count = folded_count(schedule, folded_from, run.scheduled_for)
            if count == 0:  # nothing the schedule defines lies between: nothing was folded
                folded_from = None
        return cls(run.spec_version, previous, run.last_success_for, count, folded_from)

    def headers(self) -> list[tuple[str, str]]:
        """The context as ``(header, value)`` pairs, in the order calls carry them: the spec
        version always, the others when they have a value. A queue message holds the same names
        (Redis: ``redis_field`` of each)."""
        fmt = signing.format_occurrence
        pairs = [(signing.SPEC_VERSION, str(self.spec_version))]
        if self.previous_for is not None:
            pairs.append((signing.PREVIOUS_SCHEDULED_FOR, fmt(self.previous_for)))
        if self.last_success_for is not None:
            pairs.append((signing.LAST_SUCCESS_SCHEDULED_FOR, fmt(self.last_success_for)))
        if self.folded_from is not None:
            pairs.append((signing.FOLDED_COUNT, str(self.folded_count)))
            pairs.append((signing.FOLDED_FROM, fmt(self.folded_from)))
        return pairs


@functools.lru_cache(maxsize=1024)
def _version_only(spec_version: int) -> RunContext:
    """The context of a run that has nothing to say but its spec version, one record per version
    (a frozen record is shared safely): a burst of one-offs builds none per run."""
    return RunContext(spec_version)


def redis_field(header: str) -> str:
    """A header's name as a Redis stream field: snake case (``Duetime-Spec-Version`` →
    ``duetime_spec_version``), as the stream's other fields are named."""
    return header.lower().replace("-", "_")


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one call of a target is about: built from a fenced run, the only input of a dispatch."""

    job_id: str  # uuid string: the job's own id, never an occurrence row's
    scheduled_for: datetime  # nominal occurrence (before jitter), aware UTC
    attempt: int  # 1-based
    fencing_token: int
    owner: str
    signing_secret: str  # the owner's secret, "whsec_<base64>"; "" for queue targets
    payload: Any  # JSON value (None → body "null")
    target: Target  # WebhookTarget | QueueTarget
    # During a rotation's grace: the owner's previous secret, which signs too (Standard Webhooks
    # carries several signatures, space-separated), so receivers holding either verify the call.
    extra_signing_secrets: tuple[str, ...] = ()
    # With tracing on (workers/tracing.py): the W3C traceparent of this attempt's span.
    traceparent: str | None = None
    # A failure event's type (core/failures.py): sent as Duetime-Event, and part of its key.
    event: str | None = None
    # A run's context (a failure event has none): sent as the Duetime-* headers it lists.
    context: RunContext | None = None

    @classmethod
    def of(
        cls,
        run: FencedRun,
        *,
        signing_secret: str,
        extra_signing_secrets: tuple[str, ...] = (),
        traceparent: str | None = None,
    ) -> Delivery:
        """What the target gets for ``run``: under the job's id (an occurrence row's parent),
        never the row's own (one builder for every call path, so no path can name an internal
        row). The rotation's extra secrets and the traceparent are taken here too, so a caller
        need not copy the record again to add them (``dataclasses.replace`` costs ~3 µs)."""
        spec = run.spec.parsed
        return cls(
            str(run.public_id),
            run.scheduled_for,
            run.attempt,
            run.lease_token,
            run.owner,
            signing_secret,
            spec.payload,
            spec.target,
            extra_signing_secrets,
            traceparent,
            None,
            RunContext.of(run, spec),
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """How one attempt went: the one outcome record, from the target's answer to the history row.

    The dispatcher classifies a call into it, the worker's report carries it, the completion
    decides the retry from it and writes the history row from it."""

    outcome: Outcome
    retryable: bool
    status_code: int | None = None
    error: str | None = None  # short, for a person; never header values or secrets
    retry_after_s: float | None = None  # a 429/503's Retry-After, for the one retry layer


@dataclass(frozen=True, slots=True)
class CallResult:
    """A verdict and when the call ran: ``started_at`` is when the request left (after any limiter
    wait), ``finished_at`` when its answer (or failure) came back."""

    verdict: Verdict
    started_at: datetime
    finished_at: datetime

    @property
    def outcome(self) -> Outcome:
        return self.verdict.outcome

    @property
    def retryable(self) -> bool:
        return self.verdict.retryable

    @property
    def status_code(self) -> int | None:
        return self.verdict.status_code

    @property
    def error(self) -> str | None:
        return self.verdict.error


@dataclass(frozen=True, slots=True)
class AttemptReport:
    """One attempt's outcome, to be finished under the lease its run was fenced with.

    ``started_at`` is None when no call was made (no signing secret; the janitor's lease_expired).
    """

    run: FencedRun
    verdict: Verdict
    started_at: datetime | None
    finished_at: datetime

    @classmethod
    def of(cls, run: FencedRun, result: CallResult) -> AttemptReport:
        return cls(run, result.verdict, result.started_at, result.finished_at)

    @property
    def job_id(self) -> uuid.UUID:
        return self.run.job_id

    @property
    def shard(self) -> int:
        return self.run.shard

    @property
    def lease_token(self) -> int:
        return self.run.lease_token

    @property
    def attempt(self) -> int:
        return self.run.attempt

    @property
    def scheduled_for(self) -> datetime:
        return self.run.scheduled_for

    @property
    def due_at(self) -> datetime:
        return self.run.due_at

    @property
    def spec(self) -> RunSpec:
        return self.run.spec

    @property
    def outcome(self) -> Outcome:
        return self.verdict.outcome

    @property
    def retryable(self) -> bool:
        return self.verdict.retryable

    @property
    def status_code(self) -> int | None:
        return self.verdict.status_code

    @property
    def error(self) -> str | None:
        return self.verdict.error


@dataclass(frozen=True, slots=True)
class Skip:
    """A claimed row whose missed occurrences the misfire policy passes over: they are recorded
    ``skipped`` and the row moves on to ``next_scheduled_for`` (None: the job is over)."""

    job_id: uuid.UUID
    shard: int
    lease_token: int
    skipped: tuple[datetime, ...]
    next_scheduled_for: datetime | None
    # A catch-up (core/misfire.py): these occurrences start now in occurrence rows of their
    # own, all together or (``chained``) back to back, while the row moves on to ``next``.
    catch_up: tuple[datetime, ...] = ()
    chained: bool = False
