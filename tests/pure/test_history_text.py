"""``codec.history_text``, the ``last_run`` JSON the completion's one statement stores, says what
``codec.run_to_json`` says for the same run: the two completion paths keep the same ``last_run``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core import codec
from duetime.core.model import Outcome, Run

_times = st.datetimes(
    min_value=datetime(1, 1, 1),
    max_value=datetime(9999, 12, 30),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7, minutes=-30))]),
)


_runs = st.builds(
    Run,
    scheduled_for=_times,
    attempt=st.integers(0, 10**6),
    started_at=st.none() | _times,
    finished_at=st.none() | _times,
    outcome=st.sampled_from(list(Outcome)),
    status_code=st.none() | st.integers(100, 599),
    error=st.none() | st.text(),
    lateness_ms=st.none() | st.integers(-(10**12), 10**12),
)


@settings(max_examples=400)
@given(run=_runs)
def test_history_text_is_run_to_json(run: Run) -> None:
    text = codec.history_text(
        scheduled_for=run.scheduled_for,
        attempt=run.attempt,
        started_at=run.started_at,
        finished_at=run.finished_at,
        outcome=run.outcome,
        status_code=run.status_code,
        error=run.error,
        lateness_ms=run.lateness_ms,
    )
    # spec_version is the one key the statement adds itself, from the row (finish_ordinary).
    assert json.loads(text) == {k: v for k, v in codec.run_to_json(run).items() if k != "spec_version"}
