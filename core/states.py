"""The state machine as data: what an owner action does in each job state, and what each run-path
event does to a row's phase. Pure.

Two tables, because a row carries two independent things (see docs/state-machine.md): the owner's
lifecycle ``state`` and the run path's ``phase``. The code that decides asks these tables
(``owner_move`` for an owner action, ``PHASE_EVENTS[...]`` for which phases an event may find);
the SQL that carries an event out spells the same guards in its WHERE and SET clauses, and
tests/unit/test_states.py reads every named statement and checks its guards against the table.
docs/state-machine.md shows the tables as ``render_tables()`` draws them (a test keeps it equal).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from duetime.core.errors import Conflict
from duetime.core.model import JobState, Phase

# ---------------------------------------------------------------------------------- owner actions


class OwnerAction(enum.StrEnum):
    """What an owner can do to a job through the API (the verb in the 409's message)."""

    UPDATE = "update"  # PATCH /v1/jobs/{id}
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"  # DELETE /v1/jobs/{id}
    TRIGGER = "trigger"
    REPLAY = "replay"
    BACKFILL = "backfill"


@dataclass(frozen=True, slots=True)
class OwnerMove:
    """One cell of the owner table.

    ``allowed`` False: refused with 409 ``job_<state>``. ``noop``: allowed and changes nothing (a
    repeated pause, resume or cancel). Otherwise the job ends up in ``to`` (None: the state stays
    as it is; the action changes the schedule or queues runs, not the lifecycle)."""

    allowed: bool
    to: JobState | None = None
    noop: bool = False


_REFUSED = OwnerMove(allowed=False)
_NOOP = OwnerMove(allowed=True, noop=True)
_STAYS = OwnerMove(allowed=True)


def _moves_to(state: JobState) -> OwnerMove:
    return OwnerMove(allowed=True, to=state)


_S, _P, _C = JobState.SCHEDULED, JobState.PAUSED, JobState.COMPLETED
_X, _D = JobState.CANCELLED, JobState.DEAD

#: state × owner action. Every action has a cell for every state.
OWNER_TABLE: dict[OwnerAction, dict[JobState, OwnerMove]] = {
    OwnerAction.UPDATE: {_S: _STAYS, _P: _STAYS, _C: _REFUSED, _X: _REFUSED, _D: _STAYS},
    OwnerAction.PAUSE: {_S: _moves_to(_P), _P: _NOOP, _C: _REFUSED, _X: _REFUSED, _D: _REFUSED},
    OwnerAction.RESUME: {_S: _NOOP, _P: _moves_to(_S), _C: _REFUSED, _X: _REFUSED, _D: _REFUSED},
    OwnerAction.CANCEL: {
        _S: _moves_to(_X),
        _P: _moves_to(_X),
        _C: _moves_to(_X),
        _X: _NOOP,
        _D: _moves_to(_X),
    },
    OwnerAction.TRIGGER: {_S: _STAYS, _P: _REFUSED, _C: _REFUSED, _X: _REFUSED, _D: _REFUSED},
    OwnerAction.REPLAY: {_S: _REFUSED, _P: _REFUSED, _C: _REFUSED, _X: _REFUSED, _D: _moves_to(_S)},
    OwnerAction.BACKFILL: {_S: _STAYS, _P: _REFUSED, _C: _REFUSED, _X: _REFUSED, _D: _REFUSED},
}

#: What a refused action's message tells the owner to do instead, by the job's state.
REFUSAL_HINT: dict[JobState, str] = {
    _C: "; a completed job stays completed, create a new one",
    _X: "; a cancelled job stays cancelled, create a new one",
    _D: "; replay it first (POST /v1/jobs/{id}/replay)",
    _P: "; resume it first (POST /v1/jobs/{id}/resume)",
    _S: "",
}

#: Which owner actions are allowed from which state (the table's allowed cells); anything else 409.
OWNER_TRANSITIONS: dict[str, frozenset[JobState]] = {
    action.value: frozenset(s for s, move in cells.items() if move.allowed)
    for action, cells in OWNER_TABLE.items()
}

#: The states a job is live in: it has (or will have) a next run the API shows, and counts
#: against the owner's cap of active jobs.
ACTIVE_STATES: frozenset[JobState] = frozenset({_S, _P})


def owner_move(action: OwnerAction, state: JobState) -> OwnerMove:
    """The table's cell for ``action`` on a job in ``state``; a refused cell raises the 409."""
    move = OWNER_TABLE[action][state]
    if not move.allowed:
        message = f"cannot {action.value} a job that is {state.value}{REFUSAL_HINT[state]}"
        raise Conflict(message, code=f"job_{state.value}")
    return move


# ---------------------------------------------------------------------------------- run-path events


class RunEvent(enum.StrEnum):
    """What happens to a row in the run path."""

    CLAIM = "claim"
    RETAKE = "retake"
    KEEP = "keep"
    FENCE = "fence"
    RELEASE = "release"
    RETURN_UNSTARTED = "return_unstarted"
    REVOKE = "revoke"
    HEARTBEAT = "heartbeat"
    TAKE = "take"
    KEEP_PUBLISHED = "keep_published"
    COMPLETE = "complete"
    FINISH_ORDINARY = "finish_ordinary"
    SKIP = "skip"
    CARRY = "carry"
    LAPSE = "lapse"
    RESTART = "restart"
    SPLIT = "split"
    DROP_IDLE_OCCURRENCES = "drop_idle_occurrences"
    WITHDRAW_SPLITS = "withdraw_splits"
    DRAIN = "drain"
    MOVE_SHARD = "move_shard"
    MEASURE_BACKLOG = "measure_backlog"
    RETIRE = "retire"
    PAUSE_FAILING = "pause_failing"


@dataclass(frozen=True, slots=True)
class PhaseStep:
    """One row of the phase table: from which phases (and job states) an event may take a row,
    and the phase it leaves it in.

    ``to`` None: the phase does not change. ``deletes``: the row goes (an occurrence row, or a
    finished job that retention removes).
    ``sets_state``: the job state the event writes, if any. ``guard``: where the from-phases
    are checked -- ``"sql"`` in the statement's WHERE, ``"python"`` by the caller under the row's
    lock (it reads ``from_`` from this table). ``statements``: the named SQL that carries it out.
    """

    from_: frozenset[Phase]
    to: Phase | None
    why: str
    statements: tuple[str, ...]
    states: frozenset[JobState] | None = None
    sets_state: JobState | None = None
    deletes: bool = False
    guard: str = "sql"


_IDLE, _CLAIMED, _RUNNING = Phase.IDLE, Phase.CLAIMED, Phase.RUNNING
BUSY_PHASES: frozenset[Phase] = frozenset({_CLAIMED, _RUNNING})


def _ph(*phases: Phase) -> frozenset[Phase]:
    return frozenset(phases)


#: phase × event.
PHASE_EVENTS: dict[RunEvent, PhaseStep] = {
    RunEvent.CLAIM: PhaseStep(
        _ph(_IDLE),
        _CLAIMED,
        "an engine leases a due row into its wheel (new token, SKIP LOCKED)",
        ("claim_due",),
        states=frozenset({_S}),
    ),
    RunEvent.RETAKE: PhaseStep(
        _ph(_CLAIMED),
        None,
        "an engine restarted under its id, or whose claim answer was lost, takes its claims back (new token)",
        ("retake_claims",),
    ),
    RunEvent.KEEP: PhaseStep(
        _ph(_CLAIMED),
        None,
        "an engine keeps the claims waiting in its wheel from lapsing",
        ("keep_waiting_claims",),
    ),
    RunEvent.FENCE: PhaseStep(
        _ph(_CLAIMED),
        _RUNNING,
        "the wheel fired: the call may start if the token matches; the row keeps what was fenced "
        "(`fenced_*`: occurrence, due time, attempt, spec version, run kind, under this token), "
        "so an expiry finishes that attempt whatever an owner's edit wrote since; an occurrence later "
        "than the row's (`run_once`) keeps the row's as the oldest one folded (`folded_from`, "
        "`folded_into`); it returns the run's context (the job's last success and creation)",
        ("fence_runs",),
        states=frozenset({_S}),
    ),
    RunEvent.RELEASE: PhaseStep(
        _ph(_CLAIMED), _IDLE, "an engine stops and gives back what it has not fired", ("release_claims",)
    ),
    RunEvent.RETURN_UNSTARTED: PhaseStep(
        _ph(_RUNNING),
        _IDLE,
        "a worker stops with fenced runs it never called (they waited for a host that backs off): "
        "given back unused, unless an owner's edit rewrote the row since the fence",
        ("return_unstarted",),
    ),
    RunEvent.REVOKE: PhaseStep(
        _ph(_CLAIMED),
        _IDLE,
        "an owner's pause, cancel or schedule PATCH gives a claimed row's lease back",
        ("write_job", "cascade_state", "bulk_write_state", "bulk_cascade_state"),
    ),
    RunEvent.HEARTBEAT: PhaseStep(
        BUSY_PHASES, None, "a fenced run's lease is extended while it waits or is called", ("extend_leases",)
    ),
    RunEvent.TAKE: PhaseStep(
        _ph(_RUNNING),
        None,
        "a worker takes a published run's lease over (NATS run queue): `taken_by` is set, `claimed_by`"
        " keeps the publisher",
        ("take_runs",),
    ),
    RunEvent.KEEP_PUBLISHED: PhaseStep(
        _ph(_RUNNING),
        None,
        "an engine keeps published runs' leases until a worker takes them",
        ("extend_published",),
    ),
    RunEvent.COMPLETE: PhaseStep(
        BUSY_PHASES,
        _IDLE,
        "an attempt's outcome is recorded under its lease: history, then what comes next",
        ("lock_for_completion", "apply_plans"),
        guard="python",
    ),
    RunEvent.FINISH_ORDINARY: PhaseStep(
        _ph(_RUNNING),
        _IDLE,
        "complete's common case in one statement: a succeeded attempt of a row still as its fence left "
        "it (the plan is core.lifecycle's); any other row goes the general way",
        ("finish_ordinary",),
        states=frozenset({_S}),
    ),
    RunEvent.SKIP: PhaseStep(
        _ph(_CLAIMED),
        _IDLE,
        "the misfire policy skips a claimed row's missed occurrences",
        ("lock_for_completion", "apply_plans"),
        guard="python",
    ),
    RunEvent.CARRY: PhaseStep(
        _ph(_RUNNING),
        None,
        "the janitor: a run that outlived its claim's lease has the lease index's key (leased_until) "
        "carried up to its run's lease (run_until)",
        ("carry_run_leases",),
    ),
    RunEvent.LAPSE: PhaseStep(
        BUSY_PHASES,
        _IDLE,
        "the janitor: a claimed row's lease lapsed (released as it was) or a running one's (lease_expired, "
        "for the attempt as fenced)",
        ("expired_leases", "apply_plans"),
    ),
    RunEvent.RESTART: PhaseStep(
        _ph(_RUNNING),
        _IDLE,
        "an engine restarts: the calls of its previous life finish as lease_expired, each for the attempt "
        "as fenced",
        ("running_of_engine", "published_of_engine", "apply_plans"),
    ),
    RunEvent.SPLIT: PhaseStep(
        _ph(_RUNNING),
        None,
        "overlap=allow: a row in flight (or waiting for a retry) hands its next occurrence to a row of "
        "its own",
        ("overlap_due",),
        states=frozenset({_S}),
    ),
    RunEvent.DROP_IDLE_OCCURRENCES: PhaseStep(
        _ph(_IDLE),
        None,
        "a cancel deletes the occurrence rows not in flight",
        ("drop_idle_occurrences", "bulk_drop_idle_occurrences"),
        deletes=True,
    ),
    RunEvent.WITHDRAW_SPLITS: PhaseStep(
        _ph(_IDLE, _CLAIMED),
        None,
        "a schedule PATCH withdraws the occurrence rows overlap=allow split off that have not started",
        ("drop_split_occurrences",),
        deletes=True,
    ),
    RunEvent.DRAIN: PhaseStep(
        _ph(_IDLE),
        None,
        "a recurring job whose schedule ended and whose last occurrence row is gone is completed",
        ("complete_drained_jobs", "complete_drained_jobs_of_shard"),
        states=frozenset({_S}),
        sets_state=_C,
    ),
    RunEvent.MOVE_SHARD: PhaseStep(
        _ph(_IDLE),
        None,
        "a logical shard moves to another database only while all its rows are idle",
        ("shard_rows",),
    ),
    RunEvent.MEASURE_BACKLOG: PhaseStep(
        _ph(_IDLE),
        None,
        "a reading only: how long the oldest due row no engine has claimed has waited (a gauge)",
        ("oldest_unclaimed_due",),
        states=frozenset({_S}),
    ),
    RunEvent.RETIRE: PhaseStep(
        _ph(_IDLE),
        None,
        "retention deletes a job finished for longer than DUETIME_FINISHED_JOB_RETENTION_S, only "
        "while it and its occurrence rows are idle",
        ("retention_finished_jobs", "retention_lock_finished"),
        states=frozenset({_C, _X, _D}),
        deletes=True,
    ),
    RunEvent.PAUSE_FAILING: PhaseStep(
        _ph(_CLAIMED),
        _IDLE,
        "a job reached pause_after_failures consecutive failed occurrences and pauses as an owner's "
        "pause does (core/failures.py): a claimed row gives its lease back, in the completion's "
        "transaction for the job's row and right after it for its occurrence rows",
        ("pause_failing_jobs", "cascade_failure_pause"),
        states=frozenset({_S}),
        sets_state=_P,
    ),
}

#: Statements that guard on the job state alone (no phase), and the states they let through.
STATE_READS: dict[str, frozenset[JobState]] = {
    "count_active_jobs": ACTIVE_STATES,
    "release_next_backfill": frozenset(JobState) - {_X},
    "release_stalled_backfills": frozenset({_S}),
    "cascade_state": frozenset(JobState) - {_X},
    "bulk_cascade_state": frozenset(JobState) - {_X},
}


def phase_allows(event: RunEvent, phase: str) -> bool:
    """Whether ``event`` may take a row found in ``phase`` (for the events guarded in Python)."""
    return phase in PHASE_EVENTS[event].from_


# ---------------------------------------------------------------------------------- the doc


def _names(values: frozenset[JobState] | frozenset[Phase], order: tuple[str, ...]) -> str:
    return ", ".join(v for v in order if v in {x.value for x in values})


_STATE_ORDER = tuple(s.value for s in JobState)
_PHASE_ORDER = tuple(p.value for p in Phase)


def _owner_cell(state: JobState, move: OwnerMove) -> str:
    if not move.allowed:
        return f"409 `job_{state.value}`"
    if move.noop:
        return "no-op"
    if move.to is None:
        return "stays"
    return f"→ {move.to.value}"


def render_owner_table() -> str:
    """state × owner action, as docs/state-machine.md shows it (markdown)."""
    states = list(JobState)
    lines = [
        "| action | " + " | ".join(s.value for s in states) + " |",
        "|---|" + "---|" * len(states),
    ]
    for action, cells in OWNER_TABLE.items():
        lines.append(f"| `{action.value}` | " + " | ".join(_owner_cell(s, cells[s]) for s in states) + " |")
    return "\n".join(lines) + "\n"


def render_phase_table() -> str:
    """phase × event, as docs/state-machine.md shows it (markdown)."""
    lines = [
        "| event | from phase | to phase | job state | statements | what happens |",
        "|---|---|---|---|---|---|",
    ]
    for event, step in PHASE_EVENTS.items():
        to = "(row deleted)" if step.deletes else (step.to.value if step.to else "(unchanged)")
        state = _names(step.states, _STATE_ORDER) if step.states else "any"
        if step.sets_state is not None:
            state += f" → {step.sets_state.value}"
        statements = ", ".join(f"`{s}`" for s in step.statements)
        if step.guard == "python":
            statements += " (phase checked under lock)"
        phases = _names(step.from_, _PHASE_ORDER)
        lines.append(f"| {event.value} | {phases} | {to} | {state} | {statements} | {step.why} |")
    return "\n".join(lines) + "\n"
