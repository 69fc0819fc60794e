"""Migration 0006 on a database that has jobs from before names were unique.

The database is migrated up to 0005, filled with duplicate names the old API allowed, then
migrated to the end: the oldest job of each (owner, name) keeps the name, the others are renamed
"<name>:dup-<id>", cancelled jobs and occurrence rows are handled, and the unique index holds.
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


@pytest.fixture
async def old_db(run_tag: str) -> AsyncIterator[str]:
    async with database_before(6, f"duetime_test_{run_tag}_m6") as dsn:
        yield dsn


SPEC = {"target": {"type": "queue", "broker": "nats", "topic": "t"}, "schedule": {"cron": "@hourly"}}


async def _insert(
    conn: asyncpg.Connection,
    owner: str,
    name: str | None,
    created: datetime,
    *,
    state: str = "scheduled",
    parent: uuid.UUID | None = None,
) -> uuid.UUID:
    job_id = new_job_id()
    await conn.execute(
        "INSERT INTO jobs (job_id, shard, owner, spec, state, created_at, updated_at, parent_id)"
        " VALUES ($1, $2, $3, $4::jsonb, $5, $6, $6, $7)",
        job_id,
        shard_of(job_id),
        owner,
        json.dumps({**SPEC, "name": name}),
        state,
        created,
        parent,
    )
    return job_id


async def test_duplicate_names_are_kept_by_the_oldest_and_renamed_elsewhere(old_db: str) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    conn = await asyncpg.connect(old_db)
    try:
        oldest = await _insert(conn, "o1", "report", t0)
        second = await _insert(conn, "o1", "report", t0 + timedelta(days=1))
        third = await _insert(conn, "o1", "report", t0 + timedelta(days=2), state="paused")
        child = await _insert(conn, "o1", "report", t0 + timedelta(days=3), parent=third)
        cancelled = await _insert(conn, "o1", "report", t0 - timedelta(days=1), state="cancelled")
        other_owner = await _insert(conn, "o2", "report", t0 + timedelta(days=5))
        legacy = await _insert(conn, "o1", "nightly report ü", t0)
        unnamed = [await _insert(conn, "o1", None, t0) for _ in range(2)]
    finally:
        await conn.close()

    assert (await migrate(old_db))[0] == "0006_names_labels_retention.sql"  # then the later ones

    conn = await asyncpg.connect(old_db)
    try:
        names = {
            r["job_id"]: r["name"] for r in await conn.fetch("SELECT job_id, spec->>'name' AS name FROM jobs")
        }
        assert names[oldest] == "report"
        assert names[second] == f"report:dup-{second}"
        assert names[third] == f"report:dup-{third}"
        assert names[child] == f"report:dup-{third}"  # an occurrence row follows its job
        assert names[cancelled] == "report"  # a cancelled job holds no name: left alone
        assert names[other_owner] == "report"
        assert names[legacy] == "nightly report ü"
        assert all(names[u] is None for u in unnamed)
        with pytest.raises(asyncpg.UniqueViolationError):
            await _insert(conn, "o1", "report", t0 + timedelta(days=9))
        await _insert(conn, "o1", "report", t0 + timedelta(days=9), state="cancelled")
    finally:
        await conn.close()
