"""A completion reuses the spec its worker parsed only while the row's spec text is unchanged."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from duetime.core import codec
from duetime.core.model import Broker, JobSpec, OneOffSchedule, Outcome, QueueTarget, RetryPolicy
from duetime.core.runpath import AttemptReport, FencedRun, RunSpec, Verdict
from duetime.storage.completion_rules import locked_spec

AT = datetime(2026, 12, 1, tzinfo=UTC)


def _report(spec: JobSpec, text: str) -> AttemptReport:
    run = FencedRun(
        job_id=uuid.uuid4(),
        shard=0,
        owner="o",
        lease_token=1,
        scheduled_for=AT,
        due_at=AT,
        attempt=1,
        spec=RunSpec(text, 1, spec),  # the fence's text, and the spec the worker parsed from it
        run_kind="scheduled",
    )
    return AttemptReport(run, Verdict(Outcome.FAILED, True), started_at=AT, finished_at=AT)


def _spec(attempts: int) -> JobSpec:
    return JobSpec(
        target=QueueTarget(broker=Broker.REDIS, topic="t"),
        schedule=OneOffSchedule(AT),
        retry=RetryPolicy(max_attempts=attempts),
    )


def test_an_unchanged_spec_is_the_one_the_worker_parsed() -> None:
    spec = _spec(3)
    text = json.dumps(codec.spec_to_json(spec))
    assert locked_spec(text, _report(spec, text)) is spec


def test_a_spec_changed_since_the_fence_is_read_from_the_row() -> None:
    old, new = _spec(3), _spec(1)
    old_text, new_text = json.dumps(codec.spec_to_json(old)), json.dumps(codec.spec_to_json(new))
    got = locked_spec(new_text, _report(old, old_text))
    assert got == new and got.retry.max_attempts == 1
    # a report without a fence's text (the NATS run queue, the janitor) always reads the row
    assert locked_spec(old_text, _report(old, "")) == old
    assert locked_spec(old_text, None) == old
