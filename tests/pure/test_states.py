"""The state machine's tables (core.states): what they allow, that every SQL statement's phase and
state guards say the same, that the misfire rule's SQL is the one the claims carry, and that
docs/state-machine.md shows the tables as they are."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duetime.core import misfire
from duetime.core.errors import Conflict
from duetime.core.lifecycle import OwnerStep, RowPlan, owner_step, update_step
from duetime.core.model import Broker, CronSchedule, JobSpec, JobState, Phase, QueueTarget
from duetime.core.states import (
    OWNER_TABLE,
    OWNER_TRANSITIONS,
    PHASE_EVENTS,
    STATE_READS,
    OwnerAction,
    owner_move,
    render_owner_table,
    render_phase_table,
)
from duetime.storage.queries import Q

DOC = Path(__file__).resolve().parents[2] / "docs" / "state-machine.md"
ALL_PHASES = frozenset(Phase)
ALL_STATES = frozenset(JobState)


def test_every_action_has_a_cell_for_every_state() -> None:
    assert set(OWNER_TABLE) == set(OwnerAction)
    for cells in OWNER_TABLE.values():
        assert set(cells) == set(JobState)


def test_the_allowed_cells_are_the_transitions_the_api_has_always_answered() -> None:
    s, p, d = JobState.SCHEDULED, JobState.PAUSED, JobState.DEAD
    before = {
        "update": {s, p, d},
        "pause": {s, p},
        "resume": {s, p},
        "trigger": {s},
        "replay": {d},
        "backfill": {s},
        "cancel": set(JobState),
    }
    assert before == OWNER_TRANSITIONS


@pytest.mark.parametrize(
    ("action", "state", "message"),
    [
        (
            "trigger",
            "paused",
            "cannot trigger a job that is paused; resume it first (POST /v1/jobs/{id}/resume)",
        ),
        (
            "update",
            "completed",
            "cannot update a job that is completed; a completed job stays completed, create a new one",
        ),
        ("pause", "dead", "cannot pause a job that is dead; replay it first (POST /v1/jobs/{id}/replay)"),
        ("replay", "scheduled", "cannot replay a job that is scheduled"),
    ],
)
def test_a_refused_cell_is_the_409_with_what_to_do_instead(action: str, state: str, message: str) -> None:
    with pytest.raises(Conflict) as caught:
        owner_move(OwnerAction(action), JobState(state))
    assert caught.value.code == f"job_{state}"
    assert caught.value.message == message


def test_repeats_are_no_ops_and_moves_name_their_target() -> None:
    assert owner_move(OwnerAction.PAUSE, JobState.PAUSED).noop
    assert owner_move(OwnerAction.CANCEL, JobState.CANCELLED).noop
    assert owner_move(OwnerAction.PAUSE, JobState.SCHEDULED).to is JobState.PAUSED
    assert owner_move(OwnerAction.REPLAY, JobState.DEAD).to is JobState.SCHEDULED
    assert owner_move(OwnerAction.TRIGGER, JobState.SCHEDULED).to is None  # the state stays


# ---------------------------------------------------------------------------------- SQL guards


@dataclass
class Guards:
    phase_from: frozenset[Phase] | None = None  # the phases the WHERE lets through
    phase_to: Phase | None = None  # SET phase = ...
    revoke: tuple[Phase, Phase] | None = None  # SET phase = CASE WHEN phase = a THEN b ELSE phase END
    state_in: frozenset[JobState] | None = None
    state_to: JobState | None = None


def _sql(name: str) -> str:
    text = re.sub(r"--[^\n]*", "", Q[name])
    return re.sub(r"\s+", " ", text)


def _narrow(current: frozenset[Phase] | None, allowed: frozenset[Phase]) -> frozenset[Phase]:
    return allowed if current is None else current & allowed


def guards(name: str) -> Guards:
    """The phase and state guards of one statement, read off its text."""
    sql = _sql(name)
    g = Guards()
    revoke = re.search(
        r"phase = CASE WHEN (?:\$\d+::bool AND )?phase = '(\w+)' THEN '(\w+)' ELSE phase END", sql
    )
    if revoke:
        g.revoke = (Phase(revoke[1]), Phase(revoke[2]))
        sql = sql.replace(revoke[0], "")
    for m in re.finditer(r"FILTER \(WHERE phase <> '(\w+)'\)", sql):  # counts what is not in it
        g.phase_from = _narrow(g.phase_from, frozenset({Phase(m[1])}))
    sql = re.sub(r"FILTER \(WHERE [^)]*\)", "", sql)
    for m in re.finditer(r"(SET|,) (?:\w+\.)?phase = '(\w+)'", sql):
        g.phase_to = Phase(m[2])
    for m in re.finditer(r"(WHERE |AND |OR |\()(?:\w+\.)?phase (=|<>) '(\w+)'", sql):
        one = frozenset({Phase(m[3])})
        g.phase_from = _narrow(g.phase_from, one if m[2] == "=" else ALL_PHASES - one)
    for m in re.finditer(r"(SET|,) (?:\w+\.)?state = '(\w+)'", sql):
        g.state_to = JobState(m[2])
    for m in re.finditer(r"(WHERE|AND|OR) (?:\w+\.)?state (=|<>) '(\w+)'", sql):
        state = frozenset({JobState(m[3])})
        let = state if m[2] == "=" else ALL_STATES - state
        g.state_in = let if g.state_in is None else g.state_in & let
    for m in re.finditer(r"(?:\w+\.)?state IN \(([^)]*)\)", sql):
        g.state_in = frozenset(JobState(v.strip(" '")) for v in m[1].split(","))
    return g


def _mentions_phase(name: str) -> bool:
    g = guards(name)
    return g.phase_from is not None or g.phase_to is not None or g.revoke is not None


def test_every_statement_that_guards_or_moves_a_phase_is_an_event_of_the_table() -> None:
    listed = {s for step in PHASE_EVENTS.values() for s in step.statements}
    assert listed <= set(Q), f"the table names statements that do not exist: {listed - set(Q)}"
    unlisted = sorted(n for n in Q if _mentions_phase(n) and n not in listed)
    assert unlisted == [], f"statements with phase guards that no event of core.states names: {unlisted}"


@pytest.mark.parametrize("event", list(PHASE_EVENTS))
def test_each_events_statements_carry_its_guards(event: str) -> None:
    step = PHASE_EVENTS[event]  # type: ignore[index]
    moved_to: set[Phase] = set()
    for name in step.statements:
        g = guards(name)
        if g.revoke is not None:
            assert (frozenset({g.revoke[0]}), g.revoke[1]) == (step.from_, step.to), name
            continue
        if g.phase_to is not None:
            moved_to.add(g.phase_to)
        if g.phase_from is not None:
            assert g.phase_from == step.from_, f"{name}: WHERE lets {g.phase_from}, table {step.from_}"
        if step.states is not None and g.state_to is None:
            assert g.state_in == step.states, f"{name}: state guard {g.state_in}, table {step.states}"
        if step.sets_state is not None:
            assert g.state_to == step.sets_state, name
    if step.guard == "sql":
        assert any(guards(n).phase_from is not None or guards(n).revoke for n in step.statements), (
            f"{event}: the table says the SQL checks the phase, and none of its statements does"
        )
    else:
        assert all(guards(n).phase_from is None for n in step.statements)
    if step.to is not None and not any(guards(n).revoke for n in step.statements):
        assert moved_to == {step.to}, f"{event}: statements set phase {moved_to}, table {step.to}"
    if step.to is None:
        assert moved_to == set(), f"{event}: the table says the phase stays, statements set {moved_to}"


@pytest.mark.parametrize("name", list(STATE_READS))
def test_state_only_guards_match_the_table(name: str) -> None:
    assert guards(name).state_in == STATE_READS[name]


def test_the_claims_carry_the_misfire_rule_verbatim() -> None:
    rule = re.sub(r"\s+", " ", misfire.MISSED_SQL)
    for name in ("claim_due", "retake_claims"):
        assert f"CASE WHEN {rule} THEN j.spec END AS misfire_spec" in _sql(name), name


def test_the_misfire_rule_in_python() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    late = now - timedelta(seconds=61)
    base = {"run_kind": "scheduled", "attempt": 0, "parent_id": None, "next_run_at": late, "grace_s": 60}
    assert misfire.missed(**base, now=now)  # type: ignore[arg-type]
    for change in (
        {"run_kind": "manual"},
        {"attempt": 1},
        {"parent_id": uuid.uuid4()},
        {"next_run_at": now - timedelta(seconds=60)},
        {"grace_s": 61},
    ):
        assert not misfire.missed(**{**base, **change}, now=now), change  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- the doc


def test_the_doc_shows_the_tables_as_the_code_draws_them() -> None:
    text = DOC.read_text(encoding="utf-8")
    for render in (render_owner_table, render_phase_table):
        assert render() in text, (
            f"docs/state-machine.md is stale: paste the output of duetime.core.states.{render.__name__}()"
        )


# ---------------------------------------------------------------------------------- owner steps


def _plan(state: JobState, **changes: object) -> RowPlan:
    at = datetime(2026, 12, 1, tzinfo=UTC)
    return replace(RowPlan(state=state, next_run_at=at, scheduled_for=at, attempt=0), **changes)  # type: ignore[arg-type]


NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def test_owner_steps_write_the_tables_target_state_and_revoke_only_what_stops_a_run() -> None:
    paused = owner_step(OwnerAction.PAUSE, _plan(JobState.SCHEDULED), now=NOW, idle=True)
    assert paused is not None and paused.plan.state is JobState.PAUSED and paused.revoke
    resumed = owner_step(OwnerAction.RESUME, _plan(JobState.PAUSED), now=NOW, idle=True)
    assert resumed is not None and resumed.plan.state is JobState.SCHEDULED and not resumed.revoke
    cancelled = owner_step(
        OwnerAction.CANCEL, _plan(JobState.DEAD, pending_triggers=(NOW,)), now=NOW, idle=True
    )
    assert cancelled is not None and cancelled.revoke
    assert (cancelled.plan.state, cancelled.plan.next_run_at, cancelled.plan.pending_triggers) == (
        JobState.CANCELLED,
        None,
        (),
    )
    replayed = owner_step(OwnerAction.REPLAY, _plan(JobState.DEAD, attempt=5), now=NOW, idle=True)
    assert replayed is not None and not replayed.revoke
    assert (replayed.plan.state, replayed.plan.attempt, replayed.plan.next_run_at) == (
        JobState.SCHEDULED,
        0,
        NOW,
    )


def test_repeats_are_no_ops_and_refusals_raise_before_anything_is_planned() -> None:
    assert owner_step(OwnerAction.PAUSE, _plan(JobState.PAUSED), now=NOW, idle=True) is None
    assert owner_step(OwnerAction.CANCEL, _plan(JobState.CANCELLED), now=NOW, idle=True) is None
    with pytest.raises(Conflict):
        owner_step(OwnerAction.TRIGGER, _plan(JobState.PAUSED), now=NOW, idle=True)
    with pytest.raises(Conflict):
        update_step(uuid.uuid4(), None, _plan(JobState.COMPLETED), timing_changed=True, now=NOW)  # type: ignore[arg-type]


def test_a_trigger_steps_in_front_when_idle_and_queues_behind_a_busy_run() -> None:
    now_run = owner_step(OwnerAction.TRIGGER, _plan(JobState.SCHEDULED), now=NOW, idle=True)
    assert now_run is not None and now_run.plan.run_kind == "manual" and now_run.plan.next_run_at == NOW
    queued = owner_step(OwnerAction.TRIGGER, _plan(JobState.SCHEDULED), now=NOW, idle=False)
    assert (
        queued is not None and queued.plan.run_kind == "scheduled" and queued.plan.pending_triggers == (NOW,)
    )
    retrying = owner_step(OwnerAction.TRIGGER, _plan(JobState.SCHEDULED, attempt=2), now=NOW, idle=True)
    assert retrying is not None and retrying.plan.pending_triggers == (NOW,)


def test_a_new_schedule_starts_over_keeps_a_paused_job_paused_and_revokes() -> None:
    spec = JobSpec(target=QueueTarget(Broker.REDIS, "t"), schedule=CronSchedule("0 * * * *"))
    job_id = uuid.uuid4()
    step = update_step(
        job_id, spec, _plan(JobState.PAUSED, pending_triggers=(NOW,)), timing_changed=True, now=NOW
    )
    assert step.revoke and step.plan.state is JobState.PAUSED and step.plan.pending_triggers == (NOW,)
    assert step.plan.scheduled_for == datetime(2026, 12, 1, 13, tzinfo=UTC)
    same = _plan(JobState.SCHEDULED)
    assert update_step(job_id, spec, same, timing_changed=False, now=NOW) == OwnerStep(same, revoke=False)
