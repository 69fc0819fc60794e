"""The accounting checker: every expected occurrence in exactly one bucket, every extra call
explained.

Inputs, all gathered from outside the code under test:

* the expected occurrences: one-offs from the ``run_at`` the test chose; cron jobs from
  ``cron_occurrences``, which asks ``croniter`` (an independent implementation), never
  ``core.schedule``;
* the run history, as ``GET /v1/jobs/{id}/runs`` returns it, and each job's state;
* the target's durable recording (``tests.faults.recorder``), written before each answer.

Buckets, exactly one per occurrence: ``delivered`` (the target recorded the call and answered it
2xx), ``dead_lettered`` (history shows failed attempts and the policy gave up: the attempts ran
out or the failure was final), ``cancelled`` (withdrawn by an owner action, or the job is
cancelled/paused), ``skipped`` (history shows ``skipped`` by the misfire policy) or ``lost``
(anything else — including a history that says ``succeeded`` for a call the target never saw).

Findings besides the buckets: duplicates, early starts (a call before the occurrence was due),
unexpected calls or history rows (an occurrence nobody expected), and calls after an owner action
withdrawing them had been answered: any call at all for an occurrence due after the answer (it
cannot have passed the fence before the action), and, for one due before it, a call arriving
later than the answer plus a tolerance (it passed the fence just before the action committed and
was still on its way). Every duplicate is attributed or reported:

* a call for an occurrence the target had already answered 2xx, or the same attempt called twice;
* attributed when history shows the earlier attempt's outcome was unknown to the scheduler
  (``lease_expired``: the holder died or stalled; ``timed_out``: the answer came too late), or
  when the later call carries a larger fencing token and the earlier attempt has no outcome in
  history at all (its lease lapsed before anything was recorded);
* otherwise it is an unattributed duplicate, which fails the check.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.faults.recorder import Record, parse_time

UNKNOWN_OUTCOMES = frozenset({"lease_expired", "timed_out"})
FAILED_OUTCOMES = frozenset({"failed", "timed_out", "lease_expired"})
BUCKETS = ("delivered", "dead_lettered", "cancelled", "skipped", "lost")
_FINAL_ERROR = re.compile(r"^(target_not_allowed|invalid webhook URL|job header|redirect refused)")


@dataclass(frozen=True, slots=True)
class Expected:
    """One occurrence that must be accounted for."""

    job_id: str
    scheduled_for: datetime
    due_at: datetime | None = None  # the earliest a call may arrive (scheduled_for + jitter)
    withdrawn_at: datetime | None = None  # when an owner action withdrawing it was answered

    @property
    def earliest(self) -> datetime:
        return self.due_at if self.due_at is not None else self.scheduled_for


@dataclass(frozen=True, slots=True)
class HistoryRun:
    scheduled_for: datetime
    attempt: int
    outcome: str
    status_code: int | None
    error: str | None
    started_at: datetime | None

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> HistoryRun:
        started = raw.get("started_at")
        return cls(
            scheduled_for=parse_time(str(raw["scheduled_for"])),
            attempt=int(raw["attempt"]),
            outcome=str(raw["outcome"]),
            status_code=raw.get("status_code"),
            error=raw.get("error"),
            started_at=parse_time(started) if started else None,
        )


@dataclass(slots=True)
class JobView:
    """A job as the API shows it: its state, its retry limit and its whole run history."""

    job_id: str
    state: str
    max_attempts: int
    history: list[HistoryRun] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Duplicate:
    key: str
    earlier: Record
    later: Record
    reason: str | None  # None: unattributed

    @property
    def attributed(self) -> bool:
        return self.reason is not None


@dataclass
class Report:
    buckets: dict[str, list[tuple[str, datetime]]] = field(default_factory=lambda: {b: [] for b in BUCKETS})
    lost_reasons: dict[tuple[str, datetime], str] = field(default_factory=dict)
    duplicates: list[Duplicate] = field(default_factory=list)
    early: list[Record] = field(default_factory=list)
    unexpected_calls: list[Record] = field(default_factory=list)
    unexpected_history: list[tuple[str, HistoryRun]] = field(default_factory=list)
    after_action: list[tuple[Record, datetime]] = field(default_factory=list)
    calls: int = 0
    max_after_action_ms: float = 0.0

    @property
    def unattributed(self) -> list[Duplicate]:
        return [d for d in self.duplicates if not d.attributed]

    @property
    def ok(self) -> bool:
        return not (
            self.buckets["lost"]
            or self.unattributed
            or self.early
            or self.unexpected_calls
            or self.unexpected_history
            or self.after_action
        )

    def counts(self) -> dict[str, int]:
        out = {b: len(v) for b, v in self.buckets.items()}
        out.update(
            calls=self.calls,
            duplicates=len(self.duplicates),
            duplicates_attributed=len(self.duplicates) - len(self.unattributed),
            duplicates_unattributed=len(self.unattributed),
            early=len(self.early),
            unexpected_calls=len(self.unexpected_calls),
            unexpected_history=len(self.unexpected_history),
            after_action=len(self.after_action),
        )
        return out

    def attribution(self) -> dict[str, int]:
        return dict(Counter((d.reason or "UNATTRIBUTED").split(":")[0] for d in self.duplicates))

    def explain(self, limit: int = 10) -> str:
        """What went wrong, for an assertion message."""
        lines = [f"counts: {self.counts()}"]
        for occ in self.buckets["lost"][:limit]:
            lines.append(f"LOST {occ[0]} @ {occ[1].isoformat()}: {self.lost_reasons.get(occ, '')}")
        for d in self.unattributed[:limit]:
            lines.append(
                f"UNATTRIBUTED DUPLICATE {d.key}: attempt {d.earlier.attempt} token {d.earlier.token}"
                f" then attempt {d.later.attempt} token {d.later.token}"
            )
        for r in self.early[:limit]:
            lines.append(f"EARLY {r.key} arrived {r.arrived.isoformat()}")
        for r in self.unexpected_calls[:limit]:
            lines.append(f"UNEXPECTED CALL {r.key} attempt {r.attempt}")
        for job_id, h in self.unexpected_history[:limit]:
            lines.append(f"UNEXPECTED HISTORY {job_id} @ {h.scheduled_for.isoformat()} {h.outcome}")
        for r, answered in self.after_action[:limit]:
            lines.append(
                f"AFTER ACTION {r.key} arrived {r.arrived.isoformat()}, answered {answered.isoformat()}"
            )
        return "\n".join(lines)


def _is_2xx(status: int | None) -> bool:
    return status is not None and 200 <= status < 300


def _final_failure(run: HistoryRun) -> bool:
    """A failure the retry policy does not retry: a 4xx other than 408/429, or a refusal."""
    if run.outcome != "failed":
        return False
    code = run.status_code
    if code is not None and 400 <= code < 500 and code not in (408, 429):
        return True
    if code is not None and 300 <= code < 400:
        return True
    return bool(run.error and _FINAL_ERROR.match(run.error))


def check(
    expected: Iterable[Expected],
    jobs: Mapping[str, JobView],
    records: Iterable[Record],
    *,
    early_tolerance: timedelta = timedelta(0),
    action_tolerance: timedelta = timedelta(milliseconds=500),
) -> Report:
    report = Report()
    wanted: dict[tuple[str, datetime], Expected] = {}
    for one in expected:
        wanted[(one.job_id, one.scheduled_for)] = one
    calls: dict[tuple[str, datetime], list[Record]] = defaultdict(list)
    for rec in records:
        report.calls += 1
        calls[(rec.job_id, rec.scheduled_for)].append(rec)
    history: dict[tuple[str, datetime], list[HistoryRun]] = defaultdict(list)
    for job in jobs.values():
        for run in job.history:
            history[(job.job_id, run.scheduled_for)].append(run)

    for occ, recs in calls.items():
        recs.sort(key=lambda r: r.arrived)
        exp = wanted.get(occ)
        if exp is None:
            report.unexpected_calls.extend(recs)
            continue
        for r in recs:
            if r.arrived < exp.earliest - early_tolerance:
                report.early.append(r)
            if exp.withdrawn_at is not None and r.arrived > exp.withdrawn_at:
                late_ms = (r.arrived - exp.withdrawn_at).total_seconds() * 1000
                report.max_after_action_ms = max(report.max_after_action_ms, late_ms)
                # Due after the answer: it cannot have passed the fence before the action, so
                # any call is a violation. Due before it: it may have passed the fence just
                # before the action committed and still be on its way, within the tolerance.
                if exp.earliest > exp.withdrawn_at or r.arrived > exp.withdrawn_at + action_tolerance:
                    report.after_action.append((r, exp.withdrawn_at))
        report.duplicates.extend(_duplicates(recs, history.get(occ, [])))

    for occ, runs in history.items():
        if occ not in wanted:
            report.unexpected_history.extend((occ[0], run) for run in runs)

    for occ, exp in wanted.items():
        bucket, reason = _bucket(exp, jobs.get(exp.job_id), calls.get(occ, []), history.get(occ, []))
        report.buckets[bucket].append(occ)
        if bucket == "lost":
            report.lost_reasons[occ] = reason
    return report


def _duplicates(recs: Sequence[Record], runs: Sequence[HistoryRun]) -> list[Duplicate]:
    by_attempt = {run.attempt: run for run in runs}
    out: list[Duplicate] = []
    for i, later in enumerate(recs):
        # The most telling earlier call: the same attempt called before, else the latest one the
        # target answered 2xx (a success recorded after an unknown outcome must not hide a third
        # call behind the first one's excuse).
        same = [prev for prev in recs[:i] if prev.attempt == later.attempt]
        answered = [prev for prev in recs[:i] if _is_2xx(prev.status)]
        earlier = same[-1] if same else answered[-1] if answered else None
        if earlier is None:
            continue  # a retry after a failure the target itself reported: not a duplicate
        known = by_attempt.get(earlier.attempt)
        reason: str | None = None
        if known is not None and known.outcome in UNKNOWN_OUTCOMES:
            reason = f"outcome unknown: attempt {earlier.attempt} was {known.outcome}"
        elif known is None and later.token > earlier.token:
            reason = (
                f"lease lapsed: token {earlier.token} -> {later.token}, attempt {earlier.attempt} unrecorded"
            )
        out.append(Duplicate(later.key, earlier, later, reason))
    return out


def _bucket(
    exp: Expected, job: JobView | None, recs: Sequence[Record], runs: Sequence[HistoryRun]
) -> tuple[str, str]:
    if any(_is_2xx(r.status) for r in recs):
        return "delivered", ""
    if any(run.outcome == "succeeded" for run in runs):
        return "lost", "history says succeeded, but the target never recorded a 2xx call"
    if any(run.outcome == "skipped" for run in runs):
        return "skipped", ""
    state = job.state if job is not None else "unknown"
    if exp.withdrawn_at is not None or state in ("cancelled", "paused"):
        return "cancelled", ""
    failures = [run for run in runs if run.outcome in FAILED_OUTCOMES]
    if failures:
        max_attempts = job.max_attempts if job is not None else 1
        last = max(failures, key=lambda run: run.attempt)
        if last.attempt >= max_attempts or _final_failure(last):
            return "dead_lettered", ""
        return (
            "lost",
            f"attempts stopped at {last.attempt} of {max_attempts} ({last.outcome}) with job {state}",
        )
    if recs:
        return "lost", f"called {len(recs)} times, never answered 2xx, no outcome in history (job {state})"
    return "lost", f"no call and no history (job {state})"


# ------------------------------------------------------------------ the independent reference


def cron_occurrences(expr: str, start: datetime, end: datetime) -> list[datetime]:
    """Occurrences of a UTC cron expression in [start, end], by croniter (not core.schedule).

    Duetime's 6-field form puts seconds FIRST; croniter puts them LAST, so it is rotated here.
    """
    from croniter import croniter

    fields = expr.split()
    if len(fields) == 6:
        fields = fields[1:] + fields[:1]
    text = " ".join(fields)
    it = croniter(text, (start - timedelta(seconds=1)).astimezone(UTC))
    out: list[datetime] = []
    while True:
        nxt: datetime = it.get_next(datetime)
        nxt = nxt.astimezone(UTC)
        if nxt > end:
            return out
        if nxt >= start:
            out.append(nxt)


def job_view_from_api(job: Mapping[str, Any], runs: Iterable[Mapping[str, Any]]) -> JobView:
    return JobView(
        job_id=str(job["id"]),
        state=str(job["state"]),
        max_attempts=int(job["retry"]["max_attempts"]),
        history=[HistoryRun.from_api(r) for r in runs],
    )
