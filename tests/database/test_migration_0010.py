"""Migration 0010 (the HOT fence) on a database with runs in flight and rows of every phase.

The database is migrated up to 0009 and given an idle, a claimed and a running row, then migrated
to the end: the running row keeps its lease as its run's lease (run_until), the others get none,
the rule "idle exactly when nobody holds it" holds, and a row breaking it is refused afterwards.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from duetime.core.ids import new_job_id, shard_of
from duetime.storage.migrate import migrate
from tests.support.migrations import database_before

SPEC = {"target": {"type": "queue", "broker": "nats", "topic": "t"}, "schedule": {"cron": "@hourly"}}


@pytest.fixture
async def old_db(run_tag: str) -> AsyncIterator[str]:
    async with database_before(10, f"duetime_test_{run_tag}_m10") as dsn:
        yield dsn


async def _insert(conn: asyncpg.Connection, phase: str, leased_until: datetime | None) -> uuid.UUID:
    job_id = new_job_id()
    await conn.execute(
        "INSERT INTO jobs (job_id, shard, owner, spec, state, phase, next_run_at, scheduled_for,"
        " lease_token, claimed_by, leased_until) VALUES ($1, $2, 'o', $3::jsonb, 'scheduled', $4,"
        " $5, $5, 1, $6, $7)",
        job_id,
        shard_of(job_id),
        json.dumps(SPEC),
        phase,
        datetime.now(UTC),
        None if phase == "idle" else "engine-1",
        leased_until,
    )
    return job_id


async def test_a_run_in_flight_keeps_its_lease_across_the_upgrade(old_db: str) -> None:
    lease = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=30)
    conn = await asyncpg.connect(old_db)
    try:
        idle = await _insert(conn, "idle", None)
        claimed = await _insert(conn, "claimed", lease)
        running = await _insert(conn, "running", lease)
    finally:
        await conn.close()
    assert (await migrate(old_db))[0] == "0010_hot_fence.sql"  # then the later ones
    conn = await asyncpg.connect(old_db)
    try:
        rows = {
            r["job_id"]: (r["leased_until"], r["run_until"])
            for r in await conn.fetch("SELECT job_id, leased_until, run_until FROM jobs")
        }
        assert rows == {idle: (None, None), claimed: (lease, None), running: (lease, lease)}
        with pytest.raises(asyncpg.CheckViolationError, match="jobs_idle_iff_unheld"):
            await conn.execute("UPDATE jobs SET phase = 'idle' WHERE job_id = $1", running)
        with pytest.raises(asyncpg.CheckViolationError, match="jobs_idle_iff_unheld"):
            await conn.execute("UPDATE jobs SET claimed_by = 'engine-2' WHERE job_id = $1", idle)
    finally:
        await conn.close()
