"""Migration 0020 (pause until) on a database with a paused job.

A job paused before the upgrade shows a ``paused`` object with no time and an owner as its actor,
and no end: it stays paused until a resume.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import asyncpg
import pytest

from duetime.core.ids import new_job_id, shard_of
from duetime.core.model import ActorType, JobState, Paused
from duetime.storage.migrate import migrate
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.support.migrations import database_before

SPEC = {"target": {"type": "queue", "broker": "nats", "topic": "t"}, "schedule": {"cron": "@hourly"}}


@pytest.fixture
async def old_db(run_tag: str) -> AsyncIterator[str]:
    async with database_before(20, f"duetime_test_{run_tag}_m20") as dsn:
        yield dsn


async def test_a_job_paused_before_shows_a_pause_without_an_end(old_db: str) -> None:
    job_id = new_job_id()
    conn = await asyncpg.connect(old_db)
    try:
        await conn.execute(
            "INSERT INTO jobs (job_id, shard, owner, spec, state, next_run_at, scheduled_for)"
            " VALUES ($1, $2, 'o', $3::jsonb, 'paused', now(), now())",
            job_id,
            shard_of(job_id),
            json.dumps(SPEC),
        )
    finally:
        await conn.close()
    applied = await migrate(old_db)
    assert applied[0] == "0020_pause_until.sql"
    store = await PostgresStore.open(ShardMap.single(old_db), pool_size=2)
    try:
        job = await store.get_job("o", job_id)
        assert job.state is JobState.PAUSED
        assert job.paused == Paused(at=None, note=None, until=None, actor=ActorType.OWNER, key_id=None)
        assert await store.end_pauses(shard_of(job_id), limit=500) == 0
        assert (await store.resume_job("o", job_id)).paused is None
    finally:
        await store.close()
