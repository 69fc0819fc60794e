"""The completion writer: attempts finished and missed occurrences skipped under their leases,
what each row becomes decided by ``core.lifecycle`` from the row as it is under lock, in one
transaction per database and one statement per kind of write."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from duetime.core import codec, failures, jitter
from duetime.core.changes import AUTO_PAUSE_REASON, UNNAMED, ActorType, ChangeAction
from duetime.core.failures import FailureCount, FailureEvent, OccurrenceEnd
from duetime.core.ids import new_job_id
from duetime.core.lifecycle import (
    OVERLAP_SKIP_REASON,
    RowPlan,
    after_attempt,
    after_occurrence_attempt,
    ends_one_off,
    retry_window_exceeded,
    split_point,
)
from duetime.core.model import JobSpec, JobState, Outcome, Phase, Run
from duetime.core.retry import WINDOW_EXCEEDED
from duetime.core.runpath import AttemptReport, FencedRun, RunSpec, Skip, Verdict
from duetime.core.spectext import spec_from_text
from duetime.core.states import PHASE_EVENTS, RunEvent, phase_allows
from duetime.storage.ports import CompletionStats
from duetime.storage.postgres.changes import record_changes
from duetime.storage.postgres.pools import StoreBase, translated, utcnow
from duetime.storage.postgres.rows import plan_of
from duetime.storage.queries import Q

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


@dataclass(frozen=True, slots=True)
class HistoryWrite:
    """One history row for ``insert_runs``: the run under the job's own id, and its lease."""

    job_id: uuid.UUID
    shard: int
    run: Run
    fencing_token: int


def _plan_arrays(plans: Sequence[PlanWrite]) -> list[list[Any]]:
    """``apply_plans``' parameters, $1..$13 in order: one array per column of the plans."""
    return [
        [w.job_id for w in plans],
        [w.plan.state.value for w in plans],
        [w.plan.next_run_at for w in plans],
        [w.plan.scheduled_for for w in plans],
        [w.plan.attempt for w in plans],
        [w.plan.run_kind for w in plans],
        [w.plan.resume_at for w in plans],
        [w.consumed_trigger is not None for w in plans],
        [w.consumed_trigger for w in plans],
        [w.last_run for w in plans],
        [w.split_at for w in plans],
        [w.plan.handed_upto for w in plans],
        [w.hold for w in plans],
    ]


def _history_arrays(runs: Sequence[HistoryWrite]) -> list[list[Any]]:
    """``insert_runs``' parameters, $1..$12 in order."""
    return [
        [h.job_id for h in runs],
        [h.shard for h in runs],
        [h.run.scheduled_for for h in runs],
        [h.run.attempt for h in runs],
        [h.run.started_at for h in runs],
        [h.run.finished_at for h in runs],
        [h.run.outcome.value for h in runs],
        [h.run.status_code for h in runs],
        [h.run.error for h in runs],
        [h.run.lateness_ms for h in runs],
        [h.fencing_token for h in runs],
        [h.run.spec_version for h in runs],
    ]


class CompletionPart(StoreBase):
    """Fenced writes of ``PostgresStore``."""

    #: Finish the ordinary attempts of a batch with ``finish_ordinary`` (one statement) before the
    #: general path takes the rest. Off: every report goes the general way (the tests that compare
    #: the two paths' rows turn it off on one store).
    finish_ordinary: bool = True

    async def complete_runs(self, reports: Sequence[AttemptReport]) -> CompletionStats:
        """Finish attempts under their leases, in one transaction per database.

        A report whose token no longer matches (the lease lapsed and was taken over, or the
        owner revoked it) changes nothing and is counted as stale.
        """
        if not self.finish_ordinary:
            return await self._under_lease(reports, finishable, BatchWriter.finish, failure_parents)
        applied = stale = history = 0
        now = utcnow()
        async with translated():
            for dsn, group in self.by_db(reports).items():
                also = failure_parents(group)
                ordinary = OrdinaryBatch.of(group, also, now)
                writer = BatchWriter()
                async with self.pool_for_dsn(dsn).acquire() as conn:
                    async with conn.transaction():
                        rest: Sequence[AttemptReport] = group
                        if offered := set(ordinary.job_ids):
                            # Locks the whole batch (and ``also``) in job id order, finishes the
                            # ordinary rows; the rest, already locked, go the general way below.
                            # It answers with the ordinary ones it left (usually none), not with
                            # the hundreds it finished.
                            left = set(
                                await conn.fetchval(
                                    Q["finish_ordinary"],
                                    [g.job_id for g in group if g.job_id not in offered],
                                    also,
                                    *ordinary.arrays(),
                                )
                            )
                            applied += len(offered) - len(left)
                            history += len(offered) - len(left)
                            rest = [g for g in group if g.job_id not in offered or g.job_id in left]
                        if rest:
                            rows = {
                                r["job_id"]: r
                                for r in await conn.fetch(
                                    Q["lock_for_completion"], [g.job_id for g in rest], also
                                )
                            }
                            stale += apply_leased(
                                writer, rows, rest, phase_ok=finishable, apply=BatchWriter.finish, now=now
                            )
                            await writer.flush(conn)
                    applied += len(writer.seen)
                    history += writer.history_count
                    self._hints.wake(await writer.after_commit(conn))
        return CompletionStats(applied=applied, stale=stale, history=history)

    async def skip_missed(self, items: Sequence[Skip]) -> CompletionStats:
        """Record skipped occurrences and move claimed rows on to their next occurrence."""
        return await self._under_lease(items, skippable, BatchWriter.skip)

    async def _under_lease(
        self,
        items: Sequence[_Leased],
        phase_ok: Callable[[str], bool],
        apply: Callable[[BatchWriter, asyncpg.Record, _Leased, datetime], None],
        also_lock: Callable[[Sequence[_Leased]], list[uuid.UUID]] = lambda _: [],
    ) -> CompletionStats:
        """The fenced write shared by completions and skips: lock the rows, drop the items whose
        lease no longer holds (counted stale), let ``apply`` decide the rest, write in one go.
        ``also_lock``: rows besides the items' own that the write may change (failure counts)."""
        applied = stale = history = 0
        now = utcnow()
        async with translated():
            for dsn, group in self.by_db(items).items():
                async with self.pool_for_dsn(dsn).acquire() as conn:
                    writer = BatchWriter()
                    async with conn.transaction():
                        rows = {
                            r["job_id"]: r
                            for r in await conn.fetch(
                                Q["lock_for_completion"], [g.job_id for g in group], also_lock(group)
                            )
                        }
                        stale += apply_leased(writer, rows, group, phase_ok=phase_ok, apply=apply, now=now)
                        await writer.flush(conn)
                    applied += len(writer.seen)
                    history += writer.history_count
                    self._hints.wake(await writer.after_commit(conn))
        return CompletionStats(applied=applied, stale=stale, history=history)


@dataclass(frozen=True, slots=True)
class Expired:
    """What ``expire_locked`` wrote, and the writer whose ``after_commit`` is still to run."""

    stats: CompletionStats
    writer: BatchWriter


async def expire_locked(conn: asyncpg.Connection, ids: list[uuid.UUID]) -> Expired:
    """Rows whose holder is gone, locked here in ``conn``'s transaction: a claimed one is given back
    as it was; a running one had an attempt nobody recorded, finished as ``lease_expired``. The
    caller commits, then runs the writer's ``after_commit``."""
    writer = BatchWriter()
    expire_rows(writer, await conn.fetch(Q["lock_for_completion"], ids, []), utcnow())
    await writer.flush(conn)
    return Expired(CompletionStats(applied=len(writer.seen), history=writer.history_count), writer)


# The decisions of a fenced write, apart from reading and writing the rows: shared with the
# in-memory store (storage/memory.py), so both compute what a row becomes the same way. Which
# phases each write may find a row in is the phase table's (core.states.PHASE_EVENTS).


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
    writer: BatchWriter,
    rows: Mapping[uuid.UUID, Any],
    items: Sequence[_Leased],
    *,
    phase_ok: Callable[[str], bool],
    apply: Callable[[BatchWriter, Any, _Leased, datetime], None],
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
            or row["lease_token"] != item.lease_token
            or not phase_ok(row["phase"])
            or item.job_id in writer.seen
        ):
            stale += 1
            continue
        apply(writer, row, item, now)
    return stale


def expire_rows(writer: BatchWriter, rows: Iterable[Any], now: datetime) -> None:
    """Rows whose lease lapsed or whose holder died: a claimed one is released as it was (it
    never fired, nothing was called), a running one is finished as ``lease_expired`` (its outcome
    is unknown) and retried by policy. A row in any other phase finished meanwhile."""
    lapses = PHASE_EVENTS[RunEvent.LAPSE].from_
    rows = list(rows)
    writer.locked = {row["job_id"]: row for row in rows}
    for row in rows:
        phase = row["phase"]
        if phase not in lapses:
            continue
        if phase == Phase.CLAIMED:
            writer.release(row)
            continue
        writer.finish(row, AttemptReport(_running(row), _LAPSED, None, now), now)


def _hold(spec: JobSpec, plan: RowPlan) -> bool:
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


def _running(row: asyncpg.Record) -> FencedRun:
    """The run a running row read by ``lock_for_completion`` was fenced for (its holder is gone),
    as its fence recorded it: an owner's edit since then writes its new plan onto the row (a new
    schedule: the next occurrence, attempt 0, a new spec version), and the attempt that lapsed is
    still the one that was fenced. Its spec version then differs from the row's, so
    ``BatchWriter.finish`` lets the owner's new plan stand, as it does for a worker's report.

    The spec's text is the row's, as for a worker's report (``finish`` reads the spec in force
    now; the version says whether the attempt ran under it). A row whose fence recorded nothing
    under its lease (fenced before the upgrade, or by a process of the previous release) is read
    from its own columns, as before."""
    columns = _AS_FENCED if row["fenced_token"] == row["lease_token"] else _AS_ROW
    occurrence, due, attempt, version, kind = (row[c] for c in columns)
    return FencedRun(
        job_id=row["job_id"],
        shard=row["shard"],
        owner=row["owner"],
        lease_token=row["lease_token"],
        scheduled_for=occurrence,
        due_at=due,
        attempt=attempt + 1,
        spec=RunSpec(row["spec"], version),
        run_kind=kind,
        parent_id=row["parent_id"],
    )


def _ran_under(row: asyncpg.Record) -> int:
    """The spec_version (the API's: ``spec_revision``, migration 0018) the attempt of a row read by
    ``lock_for_completion`` ran under: what its fence recorded under this lease, so a PATCH during
    the call does not move it; the row's own for a run fenced by a process of an earlier release."""
    fenced: int | None = row["fenced_revision"]
    if fenced is not None and row["fenced_token"] == row["lease_token"]:
        return fenced
    current: int = row["spec_revision"]
    return current


def _locked_spec(row: asyncpg.Record, rep: AttemptReport | None) -> JobSpec:
    """The spec of a row read by ``lock_for_completion`` (as text): the attempt's own parsed spec
    when the text is unchanged since its fence, otherwise decoded from the row."""
    text: str = row["spec"]
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


def _event_arrays(events: Sequence[FailureEvent]) -> list[list[Any]]:
    """``insert_failure_events``' parameters, $1..$9 in order."""
    return [
        [e.event_id for e in events],
        [e.job_id for e in events],
        [e.shard for e in events],
        [e.owner for e in events],
        [e.kind.value for e in events],
        [e.scheduled_for for e in events],
        [e.fencing_token for e in events],
        [codec.target_to_json(e.target) for e in events],
        [e.body for e in events],
    ]


def _nominal_due(public_id: uuid.UUID, rep: AttemptReport, spec: JobSpec, run_kind: str) -> datetime:
    """When the attempt's occurrence was due: its jitter included; a trigger when it was asked for."""
    if run_kind == "manual":
        return rep.scheduled_for
    return jitter.due_at(public_id, rep.scheduled_for, spec.jitter_s)


def _lateness_ms(rep: AttemptReport, due: datetime) -> int | None:
    if rep.started_at is None:
        return None
    return int((rep.started_at - due).total_seconds() * 1000)


def _history_error(spec: JobSpec, rep: AttemptReport, due: datetime, now: datetime) -> str | None:
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


_SUCCEEDED, _SCHEDULED = Outcome.SUCCEEDED, JobState.SCHEDULED  # an enum member's lookup is not free


class _Ended:
    """The columns every attempt the one statement finishes has: which row, under which lease,
    and its history row (``finish_ordinary``'s arrays in this order, $3..$13 and $21..$31)."""

    __slots__ = (
        "attempts",
        "errors",
        "finished_at",
        "job_ids",
        "last_runs",
        "lateness",
        "ran_for",
        "started_at",
        "status_codes",
        "tokens",
        "versions",
    )

    def __init__(self) -> None:
        self.job_ids: list[uuid.UUID] = []
        self.tokens: list[int] = []
        self.versions: list[int] = []
        self.ran_for: list[datetime] = []
        self.attempts: list[int] = []
        self.last_runs: list[str] = []
        self.started_at: list[datetime | None] = []
        self.finished_at: list[datetime] = []
        self.status_codes: list[int | None] = []
        self.errors: list[str | None] = []
        self.lateness: list[int | None] = []

    def append(self, rep: AttemptReport, error: str | None, lateness: int | None) -> None:
        run = rep.run
        verdict = rep.verdict
        self.job_ids.append(run.job_id)
        self.tokens.append(run.lease_token)
        self.versions.append(run.spec.version)
        self.ran_for.append(run.scheduled_for)
        self.attempts.append(run.attempt)
        self.last_runs.append(
            codec.history_text(
                scheduled_for=run.scheduled_for,
                attempt=run.attempt,
                started_at=rep.started_at,
                finished_at=rep.finished_at,
                outcome=verdict.outcome,
                status_code=verdict.status_code,
                error=error,
                lateness_ms=lateness,
            )
        )
        self.started_at.append(rep.started_at)
        self.finished_at.append(rep.finished_at)
        self.status_codes.append(verdict.status_code)
        self.errors.append(error)
        self.lateness.append(lateness)

    def arrays(self) -> list[list[Any]]:
        return [
            self.job_ids,
            self.tokens,
            self.versions,
            self.ran_for,
            self.attempts,
            self.last_runs,
            self.started_at,
            self.finished_at,
            self.status_codes,
            self.errors,
            self.lateness,
        ]


class _Rescheduled(_Ended):
    """A recurring job's attempt: the columns of ``_Ended`` and what its row becomes ($14..$20)."""

    __slots__ = ("handed_upto", "next_attempts", "next_for", "next_run_at", "overlaps", "split_at", "states")

    def __init__(self) -> None:
        super().__init__()
        self.overlaps: list[str | None] = []
        self.states: list[str] = []
        self.next_run_at: list[datetime | None] = []
        self.next_for: list[datetime | None] = []
        self.next_attempts: list[int] = []
        self.split_at: list[datetime | None] = []
        self.handed_upto: list[datetime | None] = []

    def arrays(self) -> list[list[Any]]:
        return [
            *super().arrays(),
            self.overlaps,
            self.states,
            self.next_run_at,
            self.next_for,
            self.next_attempts,
            self.split_at,
            self.handed_upto,
        ]


class OrdinaryBatch:
    """The ordinary attempts of a batch, in columns: ``finish_ordinary``'s arrays, $3..$31.

    Ordinary: the attempt succeeded, on a job's own row (not an occurrence row), run on its
    schedule (not a trigger), with the spec its worker parsed, the job's only report in the
    batch, not a job whose failure count the batch's occurrence rows may change. What its row
    becomes is ``core.lifecycle.after_attempt``'s answer for the row as its fence left it
    (scheduled, this occurrence, the attempts before this one, no trigger waiting, no overlap
    hand-over); the statement applies it only where the row under lock still is exactly that,
    and leaves any other row to the general path, which decides from the row as locked. A plan
    that records more than this attempt (occurrences an overlap policy passed over) or must wait
    for occurrence rows (a schedule that ended) is not ordinary.

    For a success, ``after_attempt`` reads no part of the spec a PATCH can change without a new
    ``spec_version`` except the overlap policy (compared in the statement): retries and the
    failure count (0, and not failing, checked) do not come into it.

    Two sets of columns: a recurring job's attempt (``rescheduled``) carries what its row becomes;
    a one-off's (``once``) does not, because that answer is always the same (completed, no next
    run: ``core.lifecycle.ends_one_off``), which the statement writes as constants. A burst is
    one-offs: the plan, and seven of eighteen values per run to encode and send, are not
    computed for them (issue 16, tenth session).
    """

    __slots__ = ("once", "rescheduled")

    def __init__(self) -> None:
        self.rescheduled = _Rescheduled()
        self.once = _Ended()

    @property
    def job_ids(self) -> list[uuid.UUID]:
        return self.rescheduled.job_ids + self.once.job_ids

    @classmethod
    def of(cls, reports: Sequence[AttemptReport], also: Sequence[uuid.UUID], now: datetime) -> OrdinaryBatch:
        batch = cls()
        once: set[uuid.UUID] = set()
        twice: set[uuid.UUID] = set(also)
        for rep in reports:
            (twice if rep.job_id in once else once).add(rep.job_id)
        for rep in reports:
            if rep.job_id not in twice:
                batch.add(rep, now)
        return batch

    def add(self, rep: AttemptReport, now: datetime) -> bool:
        """Take ``rep`` if it is ordinary (see the class); False leaves it to the general path."""
        run = rep.run
        verdict = rep.verdict
        if verdict.outcome is not _SUCCEEDED or run.parent_id is not None or run.run_kind != "scheduled":
            return False
        spec = run.spec.parsed_already  # the worker's parse; never decoded here
        if spec is None:
            return False
        job_id = run.job_id
        due = _nominal_due(job_id, rep, spec, "scheduled")
        # The row as the fence left it. Its attempt column still counts the attempts before this
        # one (the statement checks that); after_attempt's first step is to set this one's number,
        # so the plan is handed that number already and the step copies nothing.
        fenced = RowPlan(_SCHEDULED, run.due_at, run.scheduled_for, run.attempt)
        if ends_one_off(spec, fenced, outcome=verdict.outcome):
            self.once.append(rep, _history_error(spec, rep, due, now), _lateness_ms(rep, due))
            return True
        plan = after_attempt(
            job_id,
            spec,
            fenced,
            attempt=run.attempt,
            outcome=verdict.outcome,
            retryable=verdict.retryable,
            now=now,
            due=due,
            retry_after_s=verdict.retry_after_s,
        )
        if (
            plan.retrying
            or plan.overlap_skipped
            or plan.pending_triggers
            or plan.run_kind != "scheduled"
            or plan.resume_at is not None
            or _hold(spec, plan)
        ):
            return False
        columns = self.rescheduled
        columns.append(rep, _history_error(spec, rep, due, now), _lateness_ms(rep, due))
        columns.overlaps.append(spec.overlap.value if spec.recurring else None)
        columns.states.append(plan.state.value)
        columns.next_run_at.append(plan.next_run_at)
        columns.next_for.append(plan.scheduled_for)
        columns.next_attempts.append(plan.attempt)
        columns.split_at.append(split_point(spec, plan))
        columns.handed_upto.append(plan.handed_upto)
        return True

    def arrays(self) -> list[list[Any]]:
        """$3..$31: the recurring jobs' attempts, then the one-offs'."""
        return [*self.rescheduled.arrays(), *self.once.arrays()]


class BatchWriter:
    """Collects the row updates and history of one transaction and writes each as one statement.

    Occurrence rows (overlap=allow, backfill) are finished here too: their history goes under the
    parent's id, a finished one is deleted, and what must touch the parent or the occurrence's
    siblings (the job's ``last_run``, the next backfilled run) is kept for ``after_commit``.
    """

    def __init__(self) -> None:
        self.seen: set[uuid.UUID] = set()
        self.plans: list[PlanWrite] = []
        self.runs: list[HistoryWrite] = []
        self.history_count = 0
        self.finished_occurrences: list[uuid.UUID] = []
        self.parent_last: dict[uuid.UUID, dict[str, Any]] = {}
        self.backfill_parents: set[uuid.UUID] = set()
        # catch-up occurrence rows: (row id, parent id, scheduled_for, position in a chain or None)
        self.catch_up: list[tuple[uuid.UUID, uuid.UUID, datetime, int | None]] = []
        self.catch_up_shards: set[int] = set()
        # The rows this transaction locked (lock_for_completion), by id.
        self.locked: Mapping[uuid.UUID, Any] = {}
        # Occurrences that ended, of jobs that count their failures; the jobs paused for failing.
        self.ended: list[EndedOccurrence] = []
        self.paused: list[uuid.UUID] = []

    def _history(self, row: asyncpg.Record, run: Run, fencing_token: int) -> dict[str, Any]:
        self.runs.append(HistoryWrite(row["parent_id"] or row["job_id"], row["shard"], run, fencing_token))
        self.history_count += 1
        return codec.run_to_json(run)

    def finish(self, row: asyncpg.Record, rep: AttemptReport, now: datetime) -> None:
        self.seen.add(rep.job_id)
        spec = _locked_spec(row, rep)
        parent = row["parent_id"]
        # The attempt's own run kind, as fenced: a new schedule resets the row's to "scheduled"
        # while a manual run of the old one is still in flight.
        nominal_due = _nominal_due(parent or rep.job_id, rep, spec, rep.run.run_kind)
        verdict = rep.verdict
        run = Run(
            scheduled_for=rep.scheduled_for,
            attempt=rep.attempt,
            started_at=rep.started_at,
            finished_at=rep.finished_at,
            outcome=verdict.outcome,
            status_code=verdict.status_code,
            error=_history_error(spec, rep, nominal_due, now),
            lateness_ms=_lateness_ms(rep, nominal_due),
            spec_version=_ran_under(row),
        )
        last = self._history(row, run, rep.lease_token)
        current = plan_of(row)
        if parent is not None:
            self.parent_last[parent] = last
            nxt = after_occurrence_attempt(
                spec,
                current,
                attempt=rep.attempt,
                outcome=verdict.outcome,
                retryable=verdict.retryable,
                now=now,
                due=nominal_due,
                retry_after_s=verdict.retry_after_s,
            )
            if nxt is None:
                self._occurrence_ended(row, run, rep.lease_token, spec, job_id=parent, own=False, now=now)
                self.finished_occurrences.append(rep.job_id)
                if row["backfill_seq"] is not None:
                    self.backfill_parents.add(parent)
            else:
                self.plans.append(PlanWrite(rep.job_id, nxt, last))
            return
        if row["spec_version"] != rep.spec.version:
            # The schedule was replaced while this attempt ran: the owner's new plan stands.
            self.plans.append(PlanWrite(rep.job_id, current, last, split_point(spec, current)))
            return
        plan = after_attempt(
            rep.job_id,
            spec,
            current,
            attempt=rep.attempt,
            outcome=verdict.outcome,
            retryable=verdict.retryable,
            now=now,
            due=nominal_due,
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
            PlanWrite(rep.job_id, plan, last, split_point(spec, plan), consumed, _hold(spec, plan))
        )

    def _occurrence_ended(
        self,
        row: asyncpg.Record,
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
        if row["state"] == JobState.CANCELLED:
            return
        counting = failures.tracked(spec) or (own and (row["consecutive_failures"] or row["failing"]))
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
        self.ended.append(EndedOccurrence(end, row["shard"], row["owner"], spec if own else None))

    def failure_rows_missing(self) -> list[uuid.UUID]:
        """Jobs of ended occurrences whose rows this transaction has not locked (the janitor's
        occurrence rows: their jobs were not known before the rows were read). Locked after the
        rows, so out of the id order: only for jobs that count failures and have an occurrence
        row whose lease lapsed; a deadlock PostgreSQL breaks there costs the janitor its round,
        and the next round finishes the rows."""
        return sorted({e.end.job_id for e in self.ended} - set(self.locked))

    def failure_writes(self, extra: Mapping[uuid.UUID, Any]) -> FailureWrites:
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
            if row is None or row["parent_id"] is not None:
                continue  # the job was deleted meanwhile
            if jid not in counts:
                counts[jid] = FailureCount(row["consecutive_failures"], row["failing"])
                specs[jid] = e.spec if e.spec is not None else _locked_spec(row, None)
                states[jid] = plan_state.get(jid, JobState(row["state"]))
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
            if count != FailureCount(row["consecutive_failures"], row["failing"]):
                changed.append((jid, count))
        return FailureWrites(changed, paused, events)

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
                    spec_version=row["spec_revision"],
                ),
                row["lease_token"],
            )
        return last

    def skip(self, row: asyncpg.Record, item: Skip, now: datetime) -> None:
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
                (new_job_id(item.shard), item.job_id, occurrence, position if item.chained else None)
            )
        if item.catch_up:
            if item.chained:
                self.backfill_parents.add(item.job_id)
            else:
                self.catch_up_shards.add(item.shard)
        spec = _locked_spec(row, None)
        current = plan_of(row)
        if item.next_scheduled_for is None:
            plan = replace(current, state=JobState.COMPLETED, next_run_at=None, attempt=0)
        else:
            plan = replace(
                current,
                next_run_at=jitter.due_at(item.job_id, item.next_scheduled_for, spec.jitter_s),
                scheduled_for=item.next_scheduled_for,
                attempt=0,
            )
        self.plans.append(PlanWrite(item.job_id, plan, last, split_point(spec, plan), hold=_hold(spec, plan)))

    def release(self, row: asyncpg.Record) -> None:
        self.seen.add(row["job_id"])
        self.plans.append(PlanWrite(row["job_id"], plan_of(row), split_at=row["split_at"]))

    async def flush(self, conn: asyncpg.Connection) -> None:
        if self.catch_up:
            # Before the plans: a job whose schedule ends with its catch-up must see these rows
            # in apply_plans' hold, or it would be completed before they run.
            cols = list(zip(*self.catch_up, strict=True))
            await conn.execute(Q["insert_catch_up"], *[list(c) for c in cols])
        if self.plans:
            await conn.execute(Q["apply_plans"], *_plan_arrays(self.plans))
        if self.runs:
            await conn.execute(Q["insert_runs"], *_history_arrays(self.runs))
        if self.finished_occurrences:
            await conn.execute(Q["delete_occurrences"], self.finished_occurrences)
        if self.ended:
            # After apply_plans: a pause must land on the state the plans wrote.
            missing = self.failure_rows_missing()
            extra = (
                {r["job_id"]: r for r in await conn.fetch(Q["lock_for_completion"], missing, [])}
                if missing
                else {}
            )
            writes = self.failure_writes(extra)
            if writes.counts:
                await conn.execute(
                    Q["apply_failure_counts"],
                    [jid for jid, _ in writes.counts],
                    [c.consecutive for _, c in writes.counts],
                    [c.failing for _, c in writes.counts],
                )
            if writes.paused:
                paused = await conn.fetch(Q["pause_failing_jobs"], writes.paused)
                self.paused = writes.paused
                if paused:  # their auto_pause records, by Duetime, the count as the reason
                    await record_changes(
                        conn,
                        [r["job_id"] for r in paused],
                        ChangeAction.AUTO_PAUSE,
                        UNNAMED,
                        actor=ActorType.DUETIME,
                        reasons=[AUTO_PAUSE_REASON % r["consecutive_failures"] for r in paused],
                    )
            if writes.events:
                await conn.execute(Q["insert_failure_events"], *_event_arrays(writes.events))

    async def after_commit(self, conn: asyncpg.Connection) -> set[int]:
        """What touches rows other than the ones locked: in statements of their own, after the
        commit, so they never take locks in the opposite order of an owner action. Losing them
        to a crash costs a stale ``last_run`` (the history has the run) or a backfilled run that
        waits for the janitor's next round. Returns the shards that have a run due now."""
        shards: set[int] = set(self.catch_up_shards)
        if self.paused:
            await conn.execute(Q["cascade_failure_pause"], self.paused)
        if self.backfill_parents:
            rows = await conn.fetch(Q["release_next_backfill"], list(self.backfill_parents))
            shards |= {r["shard"] for r in rows}
        if self.parent_last:
            parents = list(self.parent_last)
            await conn.execute(Q["parent_last_run"], parents, list(self.parent_last.values()))
            await conn.execute(Q["complete_drained_jobs"], parents)
        return shards
