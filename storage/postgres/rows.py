"""Rows as the core's records: a job, a history row, the scheduling columns as a ``RowPlan``."""

from __future__ import annotations

import asyncpg

from duetime.core import codec
from duetime.core.lifecycle import RowPlan
from duetime.core.model import ActorType, Job, JobState, Outcome, Paused, Run
from duetime.core.states import ACTIVE_STATES


def plan_of(row: asyncpg.Record) -> RowPlan:
    return RowPlan(
        state=JobState(row["state"]),
        next_run_at=row["next_run_at"],
        scheduled_for=row["scheduled_for"],
        attempt=row["attempt"],
        run_kind=row["run_kind"],
        resume_at=row["resume_at"],
        pending_triggers=tuple(sorted(row["pending_triggers"] or ())),
        handed_upto=row["handed_upto"],
    )


def paused_of(row: asyncpg.Record) -> Paused | None:
    """The Job's ``paused`` object while it is paused (migration 0020), else None."""
    if row["state"] != JobState.PAUSED:
        return None
    return Paused(
        at=row["paused_at"],
        note=row["pause_note"],
        until=row["paused_until"],
        actor=ActorType(row["paused_by"] or ActorType.OWNER),
        key_id=row["paused_key_id"],
    )


def job_from_row(row: asyncpg.Record) -> Job:
    last = row["last_run"]
    return Job(
        id=str(row["job_id"]),
        owner=row["owner"],
        spec=codec.spec_from_json(row["spec"]),
        state=JobState(row["state"]),
        next_run_at=row["next_run_at"] if row["state"] in ACTIVE_STATES else None,
        attempt=row["attempt"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        last_run=codec.run_from_json(last) if last else None,
        spec_version=row["spec_revision"],
        paused=paused_of(row),
    )


def run_from_row(row: asyncpg.Record) -> Run:
    return Run(
        scheduled_for=row["scheduled_for"],
        attempt=row["attempt"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        outcome=Outcome(row["outcome"]),
        status_code=row["status_code"],
        error=row["error"],
        lateness_ms=row["lateness_ms"],
        spec_version=row["spec_version"],
    )
