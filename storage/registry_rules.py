"""Rules every implementation of the ``Registry`` port applies the same way (PostgreSQL and the
in-memory store): how an API key is stored and what a page cursor is. One copy, so the stores
cannot answer differently. (Which owner action a job's state allows, and what a refusal says, is
the core's owner table: ``core.states.owner_move``.)

A cursor here is the store's own: raw keys in base64url. Clients never see one: the API seals
each for the owner it answers and opens it again before it reaches a store (api/cursors.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from duetime.core.errors import Conflict, InvalidRequest
from duetime.core.lifecycle import RowPlan
from duetime.core.model import JobSpec, JobState, Overlap

#: The cursor of a first page of jobs (ids are listed in ascending order, after the cursor).
FIRST_JOB = uuid.UUID(int=0)
#: The cursor of a first page of runs (run ids are listed in descending order, before the cursor).
MAX_RUN_ID = (1 << 63) - 1

_BAD_CURSOR = "cursor is not one this server issued; pass next_cursor from the previous page unchanged"


def hash_key(api_key: str) -> bytes:
    """API keys are stored as their SHA-256 only: a leaked table gives no usable key."""
    return hashlib.sha256(api_key.encode()).digest()


def key_prefix(api_key: str) -> str:
    """What is kept of a key besides its hash, and names it: ``dt_`` and 7 random characters.
    ``duetime keys list`` shows it, ``keys revoke`` takes it, and a change record names the key
    that made the change by it (its ``key_id``)."""
    return api_key[:10]


def encode_cursor(value: bytes) -> str:
    return base64.urlsafe_b64encode(value).decode().rstrip("=")


def decode_cursor(cursor: str, size: int) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest(_BAD_CURSOR, code="invalid_cursor", field="cursor") from exc
    if len(raw) != size:
        raise InvalidRequest(_BAD_CURSOR, code="invalid_cursor", field="cursor")
    return raw


def encode_text_cursor(key: str) -> str:
    """A cursor that carries a text key (a host name): its UTF-8, as ``encode_cursor`` writes it."""
    return encode_cursor(key.encode())


def decode_text_cursor(cursor: str, *, max_bytes: int) -> str:
    """The text key of a cursor ``encode_text_cursor`` made; anything else is refused.

    Only the exact string we would have issued passes (base64 decoding drops characters outside
    its alphabet, so ``"!!!"`` would otherwise read as an empty key), and never a key that could
    not have come from a row: empty, too long, not UTF-8, or holding a control character (a NUL
    would make PostgreSQL fail the query with a 500).
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = raw.decode("utf-8")
    except (binascii.Error, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise InvalidRequest(_BAD_CURSOR, code="invalid_cursor", field="cursor") from exc
    if not 0 < len(raw) <= max_bytes or not key.isprintable() or encode_text_cursor(key) != cursor:
        raise InvalidRequest(_BAD_CURSOR, code="invalid_cursor", field="cursor")
    return key


def job_cursor(cursor: str | None) -> uuid.UUID:
    """The id a page of jobs starts after."""
    return uuid.UUID(bytes=decode_cursor(cursor, 16)) if cursor else FIRST_JOB


def run_cursor(cursor: str | None) -> int:
    """The run id a page of runs starts before."""
    before = int.from_bytes(decode_cursor(cursor, 8), "big") if cursor else MAX_RUN_ID
    if before > MAX_RUN_ID:
        raise InvalidRequest(_BAD_CURSOR, code="invalid_cursor", field="cursor")
    return before


# The spec fields that decide when a job's runs are due: a change of any one starts the job over
# from its new timing (core.lifecycle.update_step).
_TIMING_FIELDS = (("schedule", None), ("jitter_s", 0), ("spread_s", 0))


def timing_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether an update changes when the job's runs are due, comparing stored spec JSON. A field
    missing from a spec stored before it existed reads as its default, so an update that only
    adds ``spread_s: 0`` to an old job changes nothing."""
    return any(old.get(name, default) != new.get(name, default) for name, default in _TIMING_FIELDS)


#: The cursor of a first page of a job's changes (listed newest first, before the cursor).
MAX_CHANGE_SEQ = (1 << 31) - 1


def change_cursor(cursor: str | None) -> int:
    """The change ``seq`` a page of a job's changes starts before."""
    before = int.from_bytes(decode_cursor(cursor, 4), "big") if cursor else MAX_CHANGE_SEQ
    if before > MAX_CHANGE_SEQ:  # seq is an int4: a larger one is forged, never issued
        raise InvalidRequest(_BAD_CURSOR, code="invalid_cursor", field="cursor")
    return before


def encode_change_cursor(seq: int) -> str:
    return encode_cursor(seq.to_bytes(4, "big"))


def name_taken(name: str, holder: uuid.UUID | str) -> Conflict:
    """A create or rename that would take a name another job (not cancelled) holds."""
    return Conflict(
        f"the name {name!r} is held by job {holder}; names are unique per owner among jobs that are "
        "not cancelled. Use another name, rename or cancel that job, or PUT /v1/jobs/by-name/"
        f"{name} to update it",
        code="name_taken",
    )


def refuse_apply(state: JobState, job_id: uuid.UUID | str, name: str) -> None:
    """A PUT by name that would change a completed or dead job answers 409, as PATCH does."""
    if state is JobState.DEAD:
        raise Conflict(
            f"cannot change job {job_id} ({name!r}): it is dead; replay it first "
            "(POST /v1/jobs/{id}/replay), then PUT again",
            code="job_dead",
        )
    if state is JobState.COMPLETED:
        raise Conflict(
            f"cannot change job {job_id} ({name!r}): it is completed; a completed job stays completed: "
            "cancel it and PUT again to make a new one",
            code="job_completed",
        )


#: The states each bulk action changes (the single call refuses the others or changes nothing),
#: and the state it leaves them in.
BULK_APPLIES: dict[str, frozenset[JobState]] = {
    "pause": frozenset({JobState.SCHEDULED}),
    "resume": frozenset({JobState.PAUSED}),
    "cancel": frozenset({JobState.SCHEDULED, JobState.PAUSED, JobState.COMPLETED, JobState.DEAD}),
}
BULK_TARGET: dict[str, JobState] = {
    "pause": JobState.PAUSED,
    "resume": JobState.SCHEDULED,
    "cancel": JobState.CANCELLED,
}


def bulk_states(action: str, state: JobState | None) -> frozenset[JobState]:
    """The states a bulk ``action`` selects, narrowed to ``state`` when the caller gave one."""
    applies = BULK_APPLIES[action]
    return applies if state is None else applies & {state}


#: Outcomes of a last attempt that make an occurrence "failed" (what replay of an occurrence takes).
FAILED_OUTCOMES = frozenset({"failed", "timed_out", "lease_expired"})


def require_failed_occurrence(final_outcome: str | None, scheduled_for: str) -> None:
    """Refuse a replay of an occurrence whose history has no failed final attempt."""
    if final_outcome in FAILED_OUTCOMES:
        return
    seen = "has no run in the history" if final_outcome is None else f"ended {final_outcome}"
    raise Conflict(
        f"occurrence {scheduled_for} {seen}; only an occurrence whose last attempt failed can be "
        "replayed (GET /v1/jobs/{id}/runs lists them)",
        code="occurrence_not_failed",
    )


def owner_runs_cursor(cursor: str | None) -> tuple[datetime, uuid.UUID, int] | None:
    """Where a page of an owner's runs across jobs starts: before (finished_at, job id, run id).

    The job id breaks ties between databases (run ids are per database), so the order is one
    total order over every shard, newest first.
    """
    if not cursor:
        return None
    raw = decode_cursor(cursor, 8 + 16 + 8)
    micros = int.from_bytes(raw[:8], "big", signed=True)
    try:
        finished = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    except OverflowError as exc:
        raise InvalidRequest(_BAD_CURSOR, code="invalid_cursor", field="cursor") from exc
    run_id = int.from_bytes(raw[24:], "big")
    if run_id > MAX_RUN_ID:  # run ids are int8: a larger one is forged, never issued
        raise InvalidRequest(_BAD_CURSOR, code="invalid_cursor", field="cursor")
    return finished, uuid.UUID(bytes=raw[8:24]), run_id


def encode_owner_runs_cursor(finished: datetime, job_id: uuid.UUID, run_id: int) -> str:
    micros = (finished - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    return encode_cursor(micros.to_bytes(8, "big", signed=True) + job_id.bytes + run_id.to_bytes(8, "big"))


def check_pending_triggers(waiting: int, max_pending: int) -> None:
    """Refuse one more queued trigger when ``max_pending`` (> 0) already wait: each is a call of
    someone's URL later, so an owner may not queue them without bound (409 too_many_triggers)."""
    if 0 < max_pending <= waiting:
        raise Conflict(
            f"this job already has {waiting} triggered runs waiting, the most this server queues "
            f"per job ({max_pending}, DUETIME_MAX_PENDING_TRIGGERS); wait for them to run",
            code="too_many_triggers",
        )


def replay_plan(spec: JobSpec, pending: int, last_seq: int, now: datetime, max_pending: int) -> ReplayRun:
    """Where a replayed occurrence goes, by the rules both stores keep (issue 32, item 1).

    At most ``max_pending`` (> 0; DUETIME_MAX_PENDING_TRIGGERS) replayed or backfilled runs of a
    job wait at a time (409 ``too_many_replays``): a replay is a call of someone's URL, and a
    thousand of them ran at once. It follows the job's ``overlap`` as a backfilled run does: under
    ``allow`` it runs now; under ``skip`` and ``buffer_one`` it joins the end of the job's line of
    occurrence rows (``seq``), released when the one before it ends, and runs now only when the
    line is empty.
    """
    if 0 < max_pending <= pending:
        raise Conflict(
            f"this job already has {pending} replayed or backfilled runs waiting, the most this "
            f"server queues per job ({max_pending}, DUETIME_MAX_PENDING_TRIGGERS); wait for them to run",
            code="too_many_replays",
        )
    if spec.overlap is Overlap.ALLOW:
        return ReplayRun(due_at=now, seq=None)
    return ReplayRun(due_at=now if pending == 0 else None, seq=last_seq + 1)


@dataclass(frozen=True, slots=True)
class ReplayRun:
    """A replayed occurrence row: when it is due (None: after the row before it in the line) and
    its place in the job's line (None: not in it)."""

    due_at: datetime | None
    seq: int | None


def check_trigger_step(before: RowPlan, after: RowPlan, max_pending: int) -> None:
    """The trigger cap, judged on what the owner table made of a trigger: only a trigger that
    queues (a run of the job is already under way) counts against it."""
    if len(after.pending_triggers) > len(before.pending_triggers):
        check_pending_triggers(len(before.pending_triggers), max_pending)
