"""The retry layer's time bounds on a fake clock: Retry-After parsing and caps, the retry window
(max_duration_s), and what the lifecycle makes of them."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from duetime.core.lifecycle import RowPlan, after_attempt, retry_window_exceeded
from duetime.core.model import JobSpec, JobState, OneOffSchedule, Outcome, QueueTarget, RetryPolicy
from duetime.core.retry import plan_retry, retry_after_s, window_closed

NOW = datetime(2026, 12, 1, 20, 0, 0, tzinfo=UTC)
S = timedelta(seconds=1)


class Zero(random.Random):
    """A random source whose every draw is the range's low end: only the floors are left."""

    def uniform(self, a: float, b: float) -> float:
        return a


class Top(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b


@pytest.mark.parametrize(
    ("status", "header", "expected"),
    [
        (503, "3", 3.0),
        (429, "0", 0.0),
        (503, " 120 ", 120.0),
        (503, "Tue, 01 Dec 2026 20:00:07 GMT", 7.0),
        (429, "Tuesday, 01-Dec-26 20:00:30 GMT", 30.0),  # the obsolete RFC 850 form
        (503, "Tue, 01 Dec 2026 19:59:00 GMT", 0.0),  # already past
        (503, "soon", None),
        (503, "-5", None),
        (503, "1.5", None),
        (503, None, None),
        (500, "3", None),  # only 429 and 503 carry a Retry-After that counts
        (502, "3", None),
        (200, "3", None),
    ],
)
def test_retry_after_parsing(status: int, header: str | None, expected: float | None) -> None:
    assert retry_after_s(status, header, NOW) == expected


def test_retry_after_raises_the_draw_but_not_past_backoff_max() -> None:
    policy = RetryPolicy(backoff_initial_s=1, backoff_max_s=60)
    assert plan_retry(policy, 1, NOW, due=NOW, retry_after=3, rng=Zero()) == NOW + 3 * S
    assert plan_retry(policy, 1, NOW, due=NOW, retry_after=None, rng=Zero()) == NOW
    assert plan_retry(policy, 1, NOW, due=NOW, retry_after=86400, rng=Zero()) == NOW + 60 * S
    # a draw already above the floor stands
    assert (
        plan_retry(
            RetryPolicy(backoff_initial_s=10, backoff_max_s=60), 1, NOW, due=NOW, retry_after=3, rng=Top()
        )
        == NOW + 10 * S
    )


def test_the_window_bounds_when_an_attempt_may_start() -> None:
    policy = RetryPolicy(backoff_initial_s=100, backoff_max_s=100, max_duration_s=30)
    due = NOW - 10 * S
    # a draw of 100 s would start past due + 30 s: brought back to the window's last instant
    assert plan_retry(policy, 1, NOW, due=due, rng=Top()) == due + 30 * S
    # a Retry-After that ends past the window: no attempt can start inside it
    assert window_closed(policy, NOW, due, 25.0)
    assert plan_retry(policy, 1, NOW, due=due, retry_after=25, rng=Zero()) is None
    assert not window_closed(policy, NOW, due, 20.0)
    # the window is over already
    assert plan_retry(policy, 1, due + 31 * S, due=due, rng=Zero()) is None
    # no window: never closed
    assert not window_closed(RetryPolicy(), NOW + timedelta(days=400), NOW, None)


def test_an_exceeded_window_fails_the_occurrence_with_its_attempts_left() -> None:
    job_id = uuid.uuid4()
    spec = JobSpec(
        target=QueueTarget(broker="redis", topic="t"),  # type: ignore[arg-type]
        schedule=OneOffSchedule(run_at=NOW),
        retry=RetryPolicy(max_attempts=100, backoff_initial_s=1, backoff_max_s=10, max_duration_s=5),
    )
    plan = RowPlan(state=JobState.SCHEDULED, next_run_at=NOW, scheduled_for=NOW, attempt=0)
    kw = {"attempt": 1, "outcome": Outcome.FAILED, "retryable": True, "due": NOW}
    inside = after_attempt(job_id, spec, plan, now=NOW + 2 * S, rng=Zero(), **kw)  # type: ignore[arg-type]
    assert inside.state is JobState.SCHEDULED and inside.next_run_at == NOW + 2 * S
    assert not retry_window_exceeded(spec, now=NOW + 2 * S, **kw)  # type: ignore[arg-type]
    past = after_attempt(job_id, spec, plan, now=NOW + 6 * S, rng=Zero(), **kw)  # type: ignore[arg-type]
    assert past.state is JobState.DEAD  # a one-off: dead-lettered, 98 attempts unused
    assert retry_window_exceeded(spec, now=NOW + 6 * S, **kw)  # type: ignore[arg-type]
    # a Retry-After of 4 s after 2 s: the next attempt would start at 6 s, past the window
    waited = after_attempt(job_id, spec, plan, now=NOW + 2 * S, rng=Zero(), retry_after_s=4.0, **kw)  # type: ignore[arg-type]
    assert waited.state is JobState.DEAD
    # a failure that is not retried is not a window matter
    final = {**kw, "retryable": False}
    assert not retry_window_exceeded(spec, now=NOW + 6 * S, **final)  # type: ignore[arg-type]
