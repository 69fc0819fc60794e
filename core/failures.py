"""Failure handling of a job: the consecutive failed occurrences it counts, the events it sends
(``job.failing``, ``job.paused``, ``job.recovered``) and when it pauses itself. Pure.

An occurrence *fails* when its last attempt fails (retries exhausted, the retry window closed, or
a failure that is not retried); it *succeeds* when an attempt succeeds. Storage calls ``step``
for each occurrence that ended, in the transaction that records its last attempt, with the
job's count as it is under lock, and writes what it answers in that same transaction: the count,
the ``failing`` flag, a pause, and the events (an outbox the delivery service empties).

Only jobs that ask for it are counted (``on_failure`` or ``pause_after_failures`` set): for any
other job ``tracked`` is False and a success costs the completion nothing. A job that stops
asking (a PATCH cleared both) has its count reset by its next ended occurrence.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from duetime.core.codec import format_time
from duetime.core.model import JobSpec, JobState, Outcome, Target
from duetime.core.states import OWNER_TABLE, OwnerAction


class EventType(enum.StrEnum):
    FAILING = "job.failing"
    PAUSED = "job.paused"
    RECOVERED = "job.recovered"


@dataclass(frozen=True, slots=True)
class FailureCount:
    """What a job row keeps: consecutive failed occurrences, and whether ``job.failing`` was sent
    (and ``job.recovered`` not yet)."""

    consecutive: int = 0
    failing: bool = False


@dataclass(frozen=True, slots=True)
class OccurrenceEnd:
    """An occurrence of a job whose last attempt was just recorded."""

    job_id: uuid.UUID  # the job's own id (an occurrence row's parent)
    scheduled_for: datetime
    attempts: int
    outcome: Outcome
    status_code: int | None
    error: str | None
    at: datetime  # when it was recorded
    fencing_token: int = 0

    @property
    def failed(self) -> bool:
        return self.outcome not in (Outcome.SUCCEEDED, Outcome.SKIPPED)


@dataclass(frozen=True, slots=True)
class FailureStep:
    """What one ended occurrence does to its job: the new count, whether the job pauses, and
    the events to send (in this order)."""

    count: FailureCount
    pause: bool
    events: tuple[EventType, ...]


def tracked(spec: JobSpec) -> bool:
    """Whether the job counts its failed occurrences at all."""
    return spec.on_failure is not None or spec.pause_after_failures is not None


def may_pause(state: JobState) -> bool:
    """A failing job pauses itself only where an owner's pause would move it (the owner table's
    cell): a scheduled job; a paused one already is, a finished one stays finished."""
    move = OWNER_TABLE[OwnerAction.PAUSE][state]
    return move.allowed and not move.noop and move.to is JobState.PAUSED


def step(spec: JobSpec, count: FailureCount, end: OccurrenceEnd, state: JobState) -> FailureStep:
    """The job after ``end``: ``spec`` is the job's spec now, ``count`` its count under lock and
    ``state`` its state after the attempt was recorded.

    - not tracked: the count is reset, nothing is sent;
    - a success: the count goes to 0; a job that was failing sends ``job.recovered``;
    - a failure: the count grows; reaching ``on_failure.after`` sends ``job.failing`` once (not
      again until it recovered); reaching ``pause_after_failures`` pauses the job and sends
      ``job.paused`` (when ``on_failure`` is set).
    """
    if not tracked(spec):
        return FailureStep(FailureCount(), pause=False, events=())
    notify = spec.on_failure is not None
    if not end.failed:
        recovered = (EventType.RECOVERED,) if count.failing and notify else ()
        return FailureStep(FailureCount(), pause=False, events=recovered)
    n = count.consecutive + 1
    events: list[EventType] = []
    failing = count.failing and notify
    if spec.on_failure is not None and not failing and n >= spec.on_failure.after:
        events.append(EventType.FAILING)
        failing = True
    pause = spec.pause_after_failures is not None and n >= spec.pause_after_failures and may_pause(state)
    if pause and notify:
        events.append(EventType.PAUSED)
    return FailureStep(FailureCount(n, failing), pause=pause, events=tuple(events))


def event_id(job_id: str, scheduled_for: datetime, kind: EventType) -> str:
    """``<job id>:<scheduled_for>:<type>``: the event's ``webhook-id`` and Idempotency-Key, the
    same on every retry of that event."""
    return f"{job_id}:{format_time(scheduled_for)}:{kind.value}"


@dataclass(frozen=True, slots=True)
class FailureEvent:
    """One event for the outbox: where it goes, and the body the contract defines."""

    kind: EventType
    job_id: uuid.UUID
    shard: int
    owner: str
    target: Target
    scheduled_for: datetime
    fencing_token: int
    body: dict[str, Any]

    @property
    def event_id(self) -> str:
        return event_id(str(self.job_id), self.scheduled_for, self.kind)


def event_body(kind: EventType, spec: JobSpec, end: OccurrenceEnd, count: FailureCount) -> dict[str, Any]:
    """The event's JSON body; ``consecutive_failures`` is the job's count after ``end`` (0 in
    ``job.recovered``)."""
    return {
        "type": kind.value,
        "job_id": str(end.job_id),
        "name": spec.name,
        "labels": dict(spec.labels),
        "scheduled_for": format_time(end.scheduled_for),
        "attempts": end.attempts,
        "consecutive_failures": count.consecutive,
        "outcome": end.outcome.value,
        "status_code": end.status_code,
        "error": end.error,
        "at": format_time(end.at),
    }


def events_of(
    spec: JobSpec, end: OccurrenceEnd, result: FailureStep, *, shard: int, owner: str
) -> list[FailureEvent]:
    """The outbox rows of one step (none without ``on_failure``)."""
    if spec.on_failure is None:
        return []
    return [
        FailureEvent(
            kind=kind,
            job_id=end.job_id,
            shard=shard,
            owner=owner,
            target=spec.on_failure.target,
            scheduled_for=end.scheduled_for,
            fencing_token=end.fencing_token,
            body=event_body(kind, spec, end, result.count),
        )
        for kind in result.events
    ]
