"""The completion writer: attempts finished and missed occurrences skipped under their leases,
in one transaction per database and one statement per kind of write. What each row becomes is
decided by ``storage.completion_rules`` (``core.lifecycle``, from the row as it is under lock),
the rules the in-memory store applies too; what is PostgreSQL's own is here: reading the rows
under lock, the statements' arrays, and the one-statement path for ordinary successes
(``OrdinaryBatch``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, TypeVar

import asyncpg

from duetime.core import codec
from duetime.core.changes import AUTO_PAUSE_REASON, UNNAMED, ActorType, ChangeAction
from duetime.core.failures import FailureEvent
from duetime.core.lifecycle import RowPlan, after_attempt, ends_one_off, split_point
from duetime.core.model import JobState, Outcome
from duetime.core.runpath import AttemptReport, Skip
from duetime.storage.completion_rules import (
    CompletionBatch,
    HistoryWrite,
    LockedRow,
    PlanWrite,
    apply_leased,
    expire_rows,
    failure_parents,
    finishable,
    history_error,
    hold,
    lateness_ms,
    nominal_due,
    skippable,
)
from duetime.storage.ports import CompletionStats
from duetime.storage.postgres.changes import record_changes
from duetime.storage.postgres.pools import StoreBase, translated, utcnow
from duetime.storage.queries import Q

# What a fenced write is about: an attempt to finish, or missed occurrences to skip.
_Leased = TypeVar("_Leased", AttemptReport, Skip)

#: ``lock_for_completion``'s columns, in order: a ``LockedRow`` is built from a record by position.
_LOCKED_COLUMNS: Final = LockedRow._fields


def locked_rows(records: Sequence[asyncpg.Record]) -> dict[uuid.UUID, LockedRow]:
    """The records ``lock_for_completion`` read, as the completion rules' typed rows, by id. Built
    by position (a tuple's own constructor: the general path reads hundreds of rows a batch); the
    first record's column names are checked against the fields, so a statement and a record that
    drift apart fail loudly instead of mixing columns up."""
    if records and tuple(records[0].keys()) != _LOCKED_COLUMNS:
        raise AssertionError(
            f"lock_for_completion reads {tuple(records[0].keys())}, LockedRow expects {_LOCKED_COLUMNS}"
        )
    return {row.job_id: row for row in map(LockedRow._make, records)}


def _plan_arrays(plans: Sequence[PlanWrite]) -> list[list[Any]]:
    """``apply_plans``' parameters, $1..$14 in order: one array per column of the plans."""
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
        [w.succeeded_for for w in plans],
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
                            rows = locked_rows(
                                await conn.fetch(Q["lock_for_completion"], [g.job_id for g in rest], also)
                            )
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
        apply: Callable[[CompletionBatch, LockedRow, _Leased, datetime], None],
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
                        rows = locked_rows(
                            await conn.fetch(
                                Q["lock_for_completion"], [g.job_id for g in group], also_lock(group)
                            )
                        )
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
    expire_rows(writer, locked_rows(await conn.fetch(Q["lock_for_completion"], ids, [])).values(), utcnow())
    await writer.flush(conn)
    return Expired(CompletionStats(applied=len(writer.seen), history=writer.history_count), writer)


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
        due = nominal_due(job_id, rep, spec, "scheduled")
        # The row as the fence left it. Its attempt column still counts the attempts before this
        # one (the statement checks that); after_attempt's first step is to set this one's number,
        # so the plan is handed that number already and the step copies nothing.
        fenced = RowPlan(_SCHEDULED, run.due_at, run.scheduled_for, run.attempt)
        if ends_one_off(spec, fenced, outcome=verdict.outcome):
            self.once.append(rep, history_error(spec, rep, due, now), lateness_ms(rep, due))
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
            or hold(spec, plan)
        ):
            return False
        columns = self.rescheduled
        columns.append(rep, history_error(spec, rep, due, now), lateness_ms(rep, due))
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


class BatchWriter(CompletionBatch):
    """A ``CompletionBatch`` written to PostgreSQL: each kind of write as one statement of arrays
    (``flush``, in the transaction that locked the rows), then what touches other rows
    (``after_commit``, in statements of their own)."""

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
            extra = locked_rows(await conn.fetch(Q["lock_for_completion"], missing, [])) if missing else {}
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
            await conn.execute(
                Q["parent_last_run"],
                parents,
                list(self.parent_last.values()),
                [self.parent_success.get(p) for p in parents],
            )
            await conn.execute(Q["complete_drained_jobs"], parents)
        return shards
