"""The checker on synthetic data: it must catch what it exists to catch (a planted loss, an
unattributed duplicate, an early start, a call after a cancel) and accept what is legitimate
(retries, attributed duplicates, dead letters, skips), and its cron reference must be right."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.faults.checker import (
    Expected,
    HistoryRun,
    JobView,
    check,
    cron_occurrences,
)
from tests.faults.recorder import Record, read_records, record_from_json

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def rec(
    job: str, at: datetime, attempt: int, token: int, late_s: float, *, status: int | None = 200
) -> Record:
    key = f"{job}:{at.strftime('%Y-%m-%dT%H:%M:%SZ')}"
    return Record(key, job, at, attempt, token, at + timedelta(seconds=late_s), "/ok", status, "")


def run(
    at: datetime, attempt: int, outcome: str, status: int | None = None, error: str | None = None
) -> HistoryRun:
    return HistoryRun(at, attempt, outcome, status, error, at)


def view(job: str, *runs: HistoryRun, state: str = "scheduled", max_attempts: int = 3) -> JobView:
    return JobView(job, state, max_attempts, list(runs))


def test_a_clean_run_is_all_delivered() -> None:
    expected = [Expected("a", T0), Expected("b", T0)]
    jobs = {"a": view("a", run(T0, 1, "succeeded", 200)), "b": view("b", run(T0, 1, "succeeded", 200))}
    report = check(expected, jobs, [rec("a", T0, 1, 1, 0.01), rec("b", T0, 1, 1, 0.02)])
    assert report.ok, report.explain()
    assert report.counts()["delivered"] == 2


def test_a_planted_loss_is_caught() -> None:
    expected = [Expected("a", T0), Expected("b", T0)]
    jobs = {"a": view("a", run(T0, 1, "succeeded", 200)), "b": view("b")}
    report = check(expected, jobs, [rec("a", T0, 1, 1, 0.01)])
    assert not report.ok
    assert report.buckets["lost"] == [("b", T0)]
    assert "no call and no history" in report.explain()


def test_a_success_the_target_never_saw_is_a_loss() -> None:
    report = check([Expected("a", T0)], {"a": view("a", run(T0, 1, "succeeded", 200))}, [])
    assert report.buckets["lost"] == [("a", T0)]
    assert "never recorded" in report.lost_reasons[("a", T0)]


def test_attempts_that_stop_early_are_a_loss_and_exhausted_ones_a_dead_letter() -> None:
    failing = [run(T0, n, "failed", 503, "HTTP 503") for n in (1, 2)]
    early_stop = check([Expected("a", T0)], {"a": view("a", *failing, max_attempts=3)}, [])
    assert early_stop.buckets["lost"] == [("a", T0)]
    exhausted = check(
        [Expected("a", T0)],
        {"a": view("a", *failing, run(T0, 3, "failed", 503), state="dead", max_attempts=3)},
        [rec("a", T0, n, 1, n, status=503) for n in (1, 2, 3)],
    )
    assert exhausted.ok, exhausted.explain()
    assert exhausted.buckets["dead_lettered"] == [("a", T0)]
    assert exhausted.duplicates == []  # retries after reported failures are not duplicates
    poison = check(
        [Expected("p", T0)],
        {"p": view("p", run(T0, 1, "failed", 400, "HTTP 400"), state="dead")},
        [rec("p", T0, 1, 1, 0.01, status=400)],
    )
    assert poison.buckets["dead_lettered"] == [("p", T0)]


def test_an_unattributed_duplicate_is_caught() -> None:
    # Two calls of attempt 1 under the same token, history says one success: a double fire.
    calls = [rec("a", T0, 1, 1, 0.01), rec("a", T0, 1, 1, 0.02)]
    report = check([Expected("a", T0)], {"a": view("a", run(T0, 1, "succeeded", 200))}, calls)
    assert not report.ok
    assert len(report.unattributed) == 1
    assert "UNATTRIBUTED" in report.explain()


def test_a_call_after_a_recorded_success_is_unattributed_even_after_an_unknown_outcome() -> None:
    calls = [rec("a", T0, 1, 1, 0.0), rec("a", T0, 2, 2, 5.0), rec("a", T0, 3, 3, 9.0)]
    history = view("a", run(T0, 1, "timed_out"), run(T0, 2, "succeeded", 200), run(T0, 3, "succeeded", 200))
    report = check([Expected("a", T0)], {"a": history}, calls)
    assert [d.later.attempt for d in report.duplicates] == [2, 3]
    assert [d.attributed for d in report.duplicates] == [True, False]


def test_duplicates_after_a_lapsed_lease_or_a_timeout_are_attributed() -> None:
    calls = [rec("a", T0, 1, 1, 0.0), rec("a", T0, 2, 2, 4.0)]
    lapsed = check(
        [Expected("a", T0)],
        {"a": view("a", run(T0, 1, "lease_expired"), run(T0, 2, "succeeded", 200))},
        calls,
    )
    assert lapsed.ok, lapsed.explain()
    assert [d.reason for d in lapsed.duplicates] == ["outcome unknown: attempt 1 was lease_expired"]
    unrecorded = check([Expected("a", T0)], {"a": view("a", run(T0, 2, "succeeded", 200))}, calls)
    assert unrecorded.ok and unrecorded.attribution() == {"lease lapsed": 1}
    # the same, with the same token: nobody took the lease over, so nothing excuses it
    same_token = [rec("a", T0, 1, 1, 0.0), rec("a", T0, 2, 1, 4.0)]
    report = check([Expected("a", T0)], {"a": view("a", run(T0, 2, "succeeded", 200))}, same_token)
    assert len(report.unattributed) == 1


def test_an_early_start_is_caught() -> None:
    report = check(
        [Expected("a", T0)], {"a": view("a", run(T0, 1, "succeeded", 200))}, [rec("a", T0, 1, 1, -0.2)]
    )
    assert not report.ok
    assert [r.attempt for r in report.early] == [1]
    jittered = check(
        [Expected("a", T0, due_at=T0 + timedelta(seconds=3))],
        {"a": view("a", run(T0, 1, "succeeded", 200))},
        [rec("a", T0, 1, 1, 1.0)],
    )
    assert len(jittered.early) == 1, "before the jittered due time is early too"


def test_unexpected_calls_and_history_are_caught() -> None:
    other = T0 + timedelta(minutes=1)
    report = check(
        [Expected("a", T0)],
        {"a": view("a", run(T0, 1, "succeeded", 200), run(other, 1, "succeeded", 200))},
        [rec("a", T0, 1, 1, 0.0), rec("a", other, 1, 2, 0.0)],
    )
    assert [r.scheduled_for for r in report.unexpected_calls] == [other]
    assert [h.scheduled_for for _, h in report.unexpected_history] == [other]
    assert not report.ok


def test_withdrawn_occurrences_are_cancelled_and_a_call_after_the_answer_is_caught() -> None:
    answered = T0 - timedelta(seconds=1)
    report = check(
        [Expected("a", T0, withdrawn_at=answered), Expected("b", T0, withdrawn_at=answered)],
        {"a": view("a", state="cancelled"), "b": view("b", run(T0, 1, "succeeded", 200), state="cancelled")},
        [rec("b", T0, 1, 1, 0.0)],
    )
    assert report.buckets["cancelled"] == [("a", T0)]
    assert report.buckets["delivered"] == [("b", T0)]
    assert [r.job_id for r, _ in report.after_action] == ["b"]
    assert not report.ok
    # due after the answer: even a call inside the tolerance is one too many
    soon = T0 + timedelta(milliseconds=100)
    tight = check(
        [Expected("c", T0, withdrawn_at=soon - timedelta(milliseconds=200))],
        {"c": view("c", run(T0, 1, "succeeded", 200), state="paused")},
        [rec("c", T0, 1, 1, 0.1)],
    )
    assert len(tight.after_action) == 1
    # due before the answer and arriving within the tolerance: it passed the fence first
    in_flight = check(
        [Expected("d", T0, withdrawn_at=T0 + timedelta(milliseconds=50))],
        {"d": view("d", run(T0, 1, "succeeded", 200), state="cancelled")},
        [rec("d", T0, 1, 1, 0.3)],
    )
    assert in_flight.ok and in_flight.max_after_action_ms == pytest.approx(250)


def test_skipped_occurrences_are_their_own_bucket() -> None:
    report = check([Expected("a", T0)], {"a": view("a", run(T0, 0, "skipped"))}, [])
    assert report.ok and report.buckets["skipped"] == [("a", T0)]


def test_every_occurrence_lands_in_exactly_one_bucket() -> None:
    occurrences = [Expected(f"j{i}", T0) for i in range(5)]
    jobs = {
        "j0": view("j0", run(T0, 1, "succeeded", 200)),
        "j1": view("j1", run(T0, 1, "failed", 404), state="dead"),
        "j2": view("j2", state="cancelled"),
        "j3": view("j3", run(T0, 0, "skipped")),
        "j4": view("j4"),
    }
    report = check(occurrences, jobs, [rec("j0", T0, 1, 1, 0.0), rec("j1", T0, 1, 1, 0.0, status=404)])
    placed = [occ for bucket in report.buckets.values() for occ in bucket]
    assert sorted(placed) == sorted((e.job_id, e.scheduled_for) for e in occurrences)
    assert {b: len(v) for b, v in report.buckets.items()} == {
        "delivered": 1,
        "dead_lettered": 1,
        "cancelled": 1,
        "skipped": 1,
        "lost": 1,
    }


def test_the_cron_reference_reads_seconds_first_and_is_inclusive() -> None:
    start, end = T0, T0 + timedelta(seconds=10)
    assert cron_occurrences("*/5 * * * * *", start, end) == [start, start + timedelta(seconds=5), end]
    assert cron_occurrences("0 * * * *", T0, T0 + timedelta(hours=2)) == [
        T0,
        T0 + timedelta(hours=1),
        T0 + timedelta(hours=2),
    ]
    assert cron_occurrences("30 12 * * *", T0, T0 + timedelta(minutes=29)) == []


def test_the_recording_format_round_trips_and_a_torn_line_is_ignored(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "rec.jsonl"
    line = (
        '{"key":"0190aaaa-0000-7000-8000-000000000000:2026-03-01T12:00:00Z","attempt":"2",'
        '"token":"7","arrived_ns":1772366400500000000,"path":"/ok","status":200,"body":"{}"}'
    )
    path.write_text(line + "\n" + line[:40])
    [record] = read_records(path)
    assert record == record_from_json(line)
    assert (record.attempt, record.token, record.status) == (2, 7, 200)
    assert record.scheduled_for == T0
    assert record.arrived == T0 + timedelta(milliseconds=500)
