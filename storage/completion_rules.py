"""The decisions of a fenced write (attempts finished, missed occurrences skipped, lapsed
leases expired), apart from reading and writing the rows: which rows a write may touch, what each
becomes (``core.lifecycle`` from the row as locked), its history, its failure count.

Both stores use this one copy, as they do ``storage/registry_rules.py`` and
``storage/flow_rules.py``: ``PostgresStore`` (storage/postgres/completion.py) hands it the rows
``lock_for_completion`` read, as ``LockedRow``, and writes the ``CompletionBatch`` it fills with
one statement per kind of write; ``MemoryStore`` hands it its rows and applies the batch to them.
No driver here: the in-memory store loads neither asyncpg nor ``storage.postgres``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from duetime.core import codec, failures, jitter
from duetime.core.failures import FailureCount, FailureEvent, OccurrenceEnd
from duetime.core.ids import new_job_id
from duetime.core.lifecycle import (
    OVERLAP_SKIP_REASON,
    RowPlan,
    after_attempt,
    after_occurrence_attempt,
    retry_window_exceeded,
    split_point,
)
from duetime.core.model import JobSpec, JobState, Outcome, Phase, Run
from duetime.core.retry import WINDOW_EXCEEDED
from duetime.core.runpath import AttemptReport, FencedRun, RunSpec, Skip, Verdict
from duetime.core.spectext import spec_from_text
from duetime.core.states import PHASE_EVENTS, RunEvent, phase_allows


class LockedRow(NamedTuple):
    """A row of ``jobs`` as ``lock_for_completion`` reads it under lock: its columns in the
    statement's order (``PostgresStore`` builds one from a record by position; a test holds the
    two in step), the spec as its text."""

    job_id: uuid.UUID
    shard: int
    owner: str
    spec: str
    spec_version: int
    state: str
    phase: str
    lease_token: int
    scheduled_for: datetime | None
    next_run_at: datetime | None
    attempt: int
    run_kind: str
    resume_at: datetime | None
    pending_triggers: Sequence[datetime] | None
    parent_id: uuid.UUID | None
    handed_upto: datetime | None
    split_at: datetime | None
    backfill_seq: int | None
    consecutive_failures: int
    failing: bool
    fenced_token: int | None
    fenced_for: datetime | None
    fenced_due: datetime | None
    fenced_attempt: int | None
    fenced_version: int | None
    fenced_kind: str | None
    # The API's spec_version, and what the fence found of it (migration 0018: ran_under).
    spec_revision: int
    fenced_revision: int | None

    def plan(self) -> RowPlan:
        """The scheduling columns as the core's ``RowPlan``."""
        return RowPlan(
            state=JobState(self.state),
            next_run_at=self.next_run_at,
            scheduled_for=self.scheduled_for,
            attempt=self.attempt,
            run_kind=self.run_kind,
            resume_at=self.resume_at,
            pending_triggers=tuple(sorted(self.pending_triggers or ())),
            handed_upto=self.handed_upto,
        )


class CatchUp(NamedTuple):
    """An occurrence row a catch-up inserts (``insert_catch_up``): its id, its job, its
    occurrence, and its place in a chain run one at a time (None: due now, beside the others)."""

    job_id: uuid.UUID
    parent_id: uuid.UUID
    scheduled_for: datetime
    position: int | None


# What a fenced write is about: an attempt to finish, or missed occurrences to skip.
_Leased = TypeVar("_Leased", AttemptReport, Skip)


@dataclass(frozen=True, slots=True)
class PlanWrite:
    """One row's update by ``apply_plans``: the plan ``core.lifecycle`` computed, and what the
    statement needs besides it. ``flush`` turns a batch of these into the statement's arrays."""

    job_id: uuid.UUID
    plan: RowPlan
    last_run: dict[str, Any] | None = None  # the history row's JSON; None keeps the row's own
    split_at: datetime | None = None
    # The pending trigger this plan started: it is taken off the row's list (and any before it).
    consumed_trigger: datetime | None = None
    # A recurring job whose schedule ended keeps its state while occurrence rows of it are left.
    hold: bool = False
    # The occurrence of an attempt that succeeded: the job's last success unless a later one is
    # kept already (migration 0019).
    succeeded_for: datetime | None = None


@dataclass(frozen=True, slots=True)
class HistoryWrite:
    """One history row for ``insert_runs``: the run under the job's own id, and its lease."""

    job_id: uuid.UUID
    shard: int
    run: Run
    fencing_token: int


# Which phases each write may find a row in is the phase table's (core.states.PHASE_EVENTS).


def finishable(phase: str) -> bool:
    """An attempt can be finished from a claimed row (a stale report) or a running one."""
    return phase_allows(RunEvent.COMPLETE, phase)


def skippable(phase: str) -> bool:
    """Missed occurrences are skipped only on a row still claimed (not fired yet)."""
    return phase_allows(RunEvent.SKIP, phase)


def failure_parents(reports: Sequence[AttemptReport]) -> list[uuid.UUID]:
    """The jobs whose failure count a batch's occurrence rows may change: locked with the batch,
    in its order, so counting them never takes a lock out of order. Only jobs that count."""
    return sorted(
        {r.run.parent_id for r in reports if r.run.parent_id is not None and failures.tracked(r.spec.parsed)}
    )


def apply_leased(
    writer: CompletionBatch,
    rows: Mapping[uuid.UUID, LockedRow],
    items: Sequence[_Leased],
    *,
    phase_ok: Callable[[str], bool],
    apply: Callable[[CompletionBatch, LockedRow, _Leased, datetime], None],
    now: datetime,
) -> int:
    """``apply`` each item whose row (as ``lock_for_completion`` reads it) still holds its lease;
    returns how many did not (stale: nothing is written for them)."""
    stale = 0
    writer.locked = rows
    for item in items:
        row = rows.get(item.job_id)
        if (
            row is None
            or row.lease_token != item.lease_token
            or not phase_ok(row.phase)
            or item.job_id in writer.seen
        ):
            stale += 1
            continue
        apply(writer, row, item, now)
    return stale


def expire_rows(writer: CompletionBatch, rows: Iterable[LockedRow], now: datetime) -> None:
    """Rows whose lease lapsed or whose holder died: a claimed one is released as it was (it
    never fired, nothing was called), a running one is finished as ``lease_expired`` (its outcome
    is unknown) and retried by policy. A row in any other phase finished meanwhile."""
    lapses = PHASE_EVENTS[RunEvent.LAPSE].from_
    rows = list(rows)
    writer.locked = {row.job_id: row for row in rows}
    for row in rows:
        phase = row.phase
        if phase not in lapses:
            continue
        if phase == Phase.CLAIMED:
            writer.release(row)
            continue
        writer.finish(row, AttemptReport(_running(row), _LAPSED, None, now), now)


def hold(spec: JobSpec, plan: RowPlan) -> bool:
    """A recurring job whose schedule just ended: completed only once no occurrence row is left."""
    return spec.recurring and plan.state is JobState.COMPLETED


_LAPSED = Verdict(
    Outcome.LEASE_EXPIRED,
    True,
    None,
    "the lease lapsed before an outcome was recorded (worker or engine died or stalled)",
)


# Where a running row keeps the attempt it was fenced for: the columns its fence wrote under its
# lease (migration 0013), or, for a row whose fence did not write them, the row's own.
_AS_FENCED = ("fenced_for", "fenced_due", "fenced_attempt", "fenced_version", "fenced_kind")
_AS_ROW = ("scheduled_for", "next_run_at", "attempt", "spec_version", "run_kind")


def _running(row: LockedRow) -> FencedRun:
    """The run a running row read by ``lock_for_completion`` was fenced for (its holder is gone),
    as its fence recorded it: an owner's edit since then writes its new plan onto the row (a new
    schedule: the next occurrence, attempt 0, a new spec version), and the attempt that lapsed is
    still the one that was fenced. Its spec version then differs from the row's, so
    ``CompletionBatch.finish`` lets the owner's new plan stand, as it does for a worker's report.

    The spec's text is the row's, as for a worker's report (``finish`` reads the spec in force
    now; the version says whether the attempt ran under it). A row whose fence recorded nothing
    under its lease (fenced before the upgrade, or by a process of the previous release) is read
    from its own columns, as before."""
    columns = _AS_FENCED if row.fenced_token == row.lease_token else _AS_ROW
    occurrence, due, attempt, version, kind = (getattr(row, c) for c in columns)
    return FencedRun(
        job_id=row.job_id,
        shard=row.shard,
        owner=row.owner,
        lease_token=row.lease_token,
        scheduled_for=occurrence,
        due_at=due,
        attempt=attempt + 1,
        spec=RunSpec(row.spec, version),
        run_kind=kind,
        parent_id=row.parent_id,
    )


def ran_under(row: LockedRow) -> int:
    """The spec_version (the API's: ``spec_revision``, migration 0018) the attempt of a row read by
    ``lock_for_completion`` ran under: what its fence recorded under this lease, so a PATCH during
    the call does not move it; the row's own for a run fenced by a process of an earlier release."""
    if row.fenced_revision is not None and row.fenced_token == row.lease_token:
        return row.fenced_revision
    return row.spec_revision


def locked_spec(text: str, rep: AttemptReport | None) -> JobSpec:
    """The spec of a row read by ``lock_for_completion`` (``text``, as the row holds it): the
    attempt's own parsed spec when the text is unchanged since its fence, otherwise decoded."""
    if rep is not None:
        return rep.spec.reuse(text)
    return spec_from_text(text)


@dataclass(frozen=True, slots=True)
class EndedOccurrence:
    """An occurrence whose last attempt this batch records, of a job that counts its failures."""

    end: OccurrenceEnd
    shard: int
    owner: str
    # The job's own row was finished: its spec as locked. None: an occurrence row's, whose job's
    # spec (the current one, not the row's copy) is read from the job's locked row.
    spec: JobSpec | None


@dataclass(frozen=True, slots=True)
class FailureWrites:
    """What the batch's ended occurrences do to their jobs (core/failures.py): the counts that
    changed, the jobs that pause, the events for the outbox."""

    counts: list[tuple[uuid.UUID, FailureCount]]
    paused: list[uuid.UUID]
    events: list[FailureEvent]


def nominal_due(public_id: uuid.UUID, rep: AttemptReport, spec: JobSpec, run_kind: str) -> datetime:
    """When the attempt's occurrence was due: the job's spread and its jitter included (lateness is
    measured from there); a trigger when it was asked for."""
    if run_kind == "manual":
        return rep.scheduled_for
    return jitter.due_at(public_id, rep.scheduled_for, spec)


def lateness_ms(rep: AttemptReport, due: datetime) -> int | None:
    if rep.started_at is None:
        return None
    return int((rep.started_at - due).total_seconds() * 1000)


def history_error(spec: JobSpec, rep: AttemptReport, due: datetime, now: datetime) -> str | None:
    """The history row's error: the verdict's, or ``WINDOW_EXCEEDED`` when the occurrence is over
    only because its retry could not start in time (the status code stays in its own field)."""
    verdict = rep.verdict
    if retry_window_exceeded(
        spec,
        attempt=rep.attempt,
        outcome=verdict.outcome,
        retryable=verdict.retryable,
        now=now,
        due=due,
        retry_after_s=verdict.retry_after_s,
    ):
        return WINDOW_EXCEEDED
    return verdict.error


class CompletionBatch:
    """What one transaction of fenced writes does, decided and not yet written: the row updates,
    the history, the occurrence rows to delete or insert, the failure counts. Each store writes it
    its own way (``storage.postgres.completion.BatchWriter``: one statement per kind of write;
    ``MemoryStore``: into its rows), so what a row becomes is decided here once.

    Occurrence rows (overlap=allow, backfill) are finished here too: their history goes under the
    parent's id, a finished one is deleted, and what must touch the parent or the occurrence's
    siblings (the job's ``last_run``, the next backfilled run) is kept for after the commit.
    """

    def __init__(self) -> None:
        self.seen: set[uuid.UUID] = set()
        self.plans: list[PlanWrite] = []
        self.runs: list[HistoryWrite] = []
        self.history_count = 0
        self.finished_occurrences: list[uuid.UUID] = []
        self.parent_last: dict[uuid.UUID, dict[str, Any]] = {}
        # The newest occurrence an occurrence row of each job saw succeed in this batch.
        self.parent_success: dict[uuid.UUID, datetime] = {}
        self.backfill_parents: set[uuid.UUID] = set()
        self.catch_up: list[CatchUp] = []
        self.catch_up_shards: set[int] = set()
        # The rows this transaction locked (lock_for_completion), by id.
        self.locked: Mapping[uuid.UUID, LockedRow] = {}
        # Occurrences that ended, of jobs that count their failures; the jobs paused for failing.
        self.ended: list[EndedOccurrence] = []
        self.paused: list[uuid.UUID] = []

    def _history(self, row: LockedRow, run: Run, fencing_token: int) -> dict[str, Any]:
        self.runs.append(HistoryWrite(row.parent_id or row.job_id, row.shard, run, fencing_token))
        self.history_count += 1
        return codec.run_to_json(run)

    def finish(self, row: LockedRow, rep: AttemptReport, now: datetime) -> None:
        self.seen.add(rep.job_id)
        spec = locked_spec(row.spec, rep)
        parent = row.parent_id
        # The attempt's own run kind, as fenced: a new schedule resets the row's to "scheduled"
        # while a manual run of the old one is still in flight.
        due = nominal_due(parent or rep.job_id, rep, spec, rep.run.run_kind)
        verdict = rep.verdict
        run = Run(
            scheduled_for=rep.scheduled_for,
            attempt=rep.attempt,
            started_at=rep.started_at,
            finished_at=rep.finished_at,
            outcome=verdict.outcome,
            status_code=verdict.status_code,
            error=history_error(spec, rep, due, now),
            lateness_ms=lateness_ms(rep, due),
            spec_version=ran_under(row),
        )
        last = self._history(row, run, rep.lease_token)
        current = row.plan()
        succeeded = rep.scheduled_for if verdict.outcome is Outcome.SUCCEEDED else None
        if parent is not None:
            self.parent_last[parent] = last
            if succeeded is not None:
                kept = self.parent_success.get(parent)
                self.parent_success[parent] = succeeded if kept is None else max(kept, succeeded)
            nxt = after_occurrence_attempt(
                spec,
                current,
                attempt=rep.attempt,
                outcome=verdict.outcome,
                retryable=verdict.retryable,
                now=now,
                due=due,
                retry_after_s=verdict.retry_after_s,
            )
            if nxt is None:
                self._occurrence_ended(row, run, rep.lease_token, spec, job_id=parent, own=False, now=now)
                self.finished_occurrences.append(rep.job_id)
                if row.backfill_seq is not None:
                    self.backfill_parents.add(parent)
            else:
                self.plans.append(PlanWrite(rep.job_id, nxt, last))
            return
        if row.spec_version != rep.spec.version:
            # The schedule was replaced while this attempt ran: the owner's new plan stands.
            self.plans.append(
                PlanWrite(rep.job_id, current, last, split_point(spec, current), succeeded_for=succeeded)
            )
            return
        plan = after_attempt(
            rep.job_id,
            spec,
            current,
            attempt=rep.attempt,
            outcome=verdict.outcome,
            retryable=verdict.retryable,
            now=now,
            due=due,
            retry_after_s=verdict.retry_after_s,
        )
        if not plan.retrying:
            self._occurrence_ended(row, run, rep.lease_token, spec, job_id=rep.job_id, own=True, now=now)
        if plan.overlap_skipped:
            last = self._overlap_skips(row, plan, spec.overlap.value, now) or last
        consumed = None
        if len(plan.pending_triggers) < len(current.pending_triggers):
            consumed = current.pending_triggers[0]
        self.plans.append(
            PlanWrite(rep.job_id, plan, last, split_point(spec, plan), consumed, hold(spec, plan), succeeded)
        )

    def _occurrence_ended(
        self,
        row: LockedRow,
        run: Run,
        token: int,
        spec: JobSpec,
        *,
        job_id: uuid.UUID,
        own: bool,
        now: datetime,
    ) -> None:
        """An occurrence's last attempt: kept for the failure count when its job counts (or the
        job's own row still carries a count to reset). Nothing for any other job."""
        if row.state == JobState.CANCELLED:
            return
        counting = failures.tracked(spec) or (own and (row.consecutive_failures or row.failing))
        if not counting:
            return
        end = OccurrenceEnd(
            job_id=job_id,
            scheduled_for=run.scheduled_for,
            attempts=run.attempt,
            outcome=run.outcome,
            status_code=run.status_code,
            error=run.error,
            at=now,
            fencing_token=token,
        )
        self.ended.append(EndedOccurrence(end, row.shard, row.owner, spec if own else None))

    def failure_rows_missing(self) -> list[uuid.UUID]:
        """Jobs of ended occurrences whose rows this transaction has not locked (the janitor's
        occurrence rows: their jobs were not known before the rows were read). Locked after the
        rows, so out of the id order: only for jobs that count failures and have an occurrence
        row whose lease lapsed; a deadlock PostgreSQL breaks there costs the janitor its round,
        and the next round finishes the rows."""
        return sorted({e.end.job_id for e in self.ended} - set(self.locked))

    def failure_writes(self, extra: Mapping[uuid.UUID, LockedRow]) -> FailureWrites:
        """Each ended occurrence through ``core.failures.step``, in occurrence order per job, from
        the job's count as locked; ``extra`` has the rows ``failure_rows_missing`` named."""
        plan_state = {w.job_id: w.plan.state for w in self.plans}
        rows = {**extra, **self.locked}
        counts: dict[uuid.UUID, FailureCount] = {}
        specs: dict[uuid.UUID, JobSpec] = {}
        states: dict[uuid.UUID, JobState] = {}
        paused: list[uuid.UUID] = []
        events: list[FailureEvent] = []
        for e in sorted(self.ended, key=lambda e: (e.end.job_id, e.end.scheduled_for)):
            jid = e.end.job_id
            row = rows.get(jid)
            if row is None or row.parent_id is not None:
                continue  # the job was deleted meanwhile
            if jid not in counts:
                counts[jid] = FailureCount(row.consecutive_failures, row.failing)
                specs[jid] = e.spec if e.spec is not None else locked_spec(row.spec, None)
                states[jid] = plan_state.get(jid, JobState(row.state))
            if states[jid] is JobState.CANCELLED:
                continue
            result = failures.step(specs[jid], counts[jid], e.end, states[jid])
            counts[jid] = result.count
            if result.pause:
                states[jid] = JobState.PAUSED
                paused.append(jid)
            events.extend(failures.events_of(specs[jid], e.end, result, shard=e.shard, owner=e.owner))
        changed = []
        for jid, count in counts.items():
            row = rows[jid]
            if count != FailureCount(row.consecutive_failures, row.failing):
                changed.append((jid, count))
        return FailureWrites(changed, paused, events)

    def _overlap_skips(
        self, row: LockedRow, plan: RowPlan, policy: str, now: datetime
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
        row: LockedRow,
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
                    spec_version=row.spec_revision,
                ),
                row.lease_token,
            )
        return last

    def skip(self, row: LockedRow, item: Skip, now: datetime) -> None:
        self.seen.add(item.job_id)
        reason = "missed while the system was down or the job paused; skipped by the job's misfire policy"
        if item.catch_up:
            reason = (
                "missed while the system was down or the job paused; skipped because a catch-up runs "
                "only the latest occurrences (the engine's run_all cap)"
            )
        last = self._skipped(row, item.skipped, reason, now)
        for position, occurrence in enumerate(item.catch_up, start=1):
            self.catch_up.append(
                CatchUp(new_job_id(item.shard), item.job_id, occurrence, position if item.chained else None)
            )
        if item.catch_up:
            if item.chained:
                self.backfill_parents.add(item.job_id)
            else:
                self.catch_up_shards.add(item.shard)
        spec = locked_spec(row.spec, None)
        current = row.plan()
        if item.next_scheduled_for is None:
            plan = replace(current, state=JobState.COMPLETED, next_run_at=None, attempt=0)
        else:
            plan = replace(
                current,
                next_run_at=jitter.due_at(item.job_id, item.next_scheduled_for, spec),
                scheduled_for=item.next_scheduled_for,
                attempt=0,
            )
        self.plans.append(PlanWrite(item.job_id, plan, last, split_point(spec, plan), hold=hold(spec, plan)))

    def release(self, row: LockedRow) -> None:
        self.seen.add(row.job_id)
        self.plans.append(PlanWrite(row.job_id, row.plan(), split_at=row.split_at))
