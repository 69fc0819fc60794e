"""Migration 0018 (change history) on a database with jobs, history and a run in flight.

Every job is at spec_version 1 after the upgrade, and so is everything it ran before (its history
rows and its ``last_run``); its history of changes starts at the first change after the upgrade,
numbered 1. A run the previous release fenced (nothing of ``fenced_revision``) records the job's
version when it ends.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from duetime.core.changes import ChangeAction
from duetime.core.ids import new_job_id, shard_of
from duetime.storage.migrate import migrate
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.support.migrations import database_before

SPEC = {"target": {"type": "queue", "broker": "nats", "topic": "t"}, "schedule": {"cron": "@hourly"}}
ENGINE = "engine-1"


@pytest.fixture
async def old_db(run_tag: str) -> AsyncIterator[str]:
    async with database_before(18, f"duetime_test_{run_tag}_m18") as dsn:
        yield dsn


async def test_jobs_and_history_read_as_version_1_and_changes_start_at_1(old_db: str) -> None:
    occurrence = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    idle, running = new_job_id(), new_job_id()
    last_run = {
        "scheduled_for": "2026-01-01T00:00:00Z",
        "attempt": 1,
        "started_at": "2026-01-01T00:00:00Z",
        "finished_at": "2026-01-01T00:00:01Z",
        "outcome": "succeeded",
        "status_code": 200,
        "error": None,
        "lateness_ms": 3,
    }
    conn = await asyncpg.connect(old_db)
    try:
        await conn.execute(
            "INSERT INTO jobs (job_id, shard, owner, spec, state, next_run_at, scheduled_for, last_run)"
            " VALUES ($1, $2, 'o', $3::jsonb, 'scheduled', now() + interval '1 hour', now(), $4::jsonb)",
            idle,
            shard_of(idle),
            json.dumps(SPEC),
            json.dumps(last_run),
        )
        await conn.execute(
            "INSERT INTO runs (job_id, shard, scheduled_for, attempt, started_at, finished_at, outcome)"
            " VALUES ($1, $2, '2026-01-01T00:00:00Z', 1, now(), now(), 'succeeded')",
            idle,
            shard_of(idle),
        )
        # A run the previous release fenced: fenced_* under its lease, no fenced_revision.
        await conn.execute(
            "INSERT INTO jobs (job_id, shard, owner, spec, state, phase, next_run_at, scheduled_for,"
            " attempt, lease_token, claimed_by, leased_until, run_until, fenced_token, fenced_for,"
            " fenced_due, fenced_attempt, fenced_version, fenced_kind) VALUES ($1, $2, 'o', $3::jsonb,"
            " 'scheduled', 'running', $4, $4, 0, 3, $5, now() + interval '1 minute',"
            " now() + interval '1 minute', 3, $4, $4, 0, 1, 'scheduled')",
            running,
            shard_of(running),
            json.dumps(SPEC),
            occurrence,
            ENGINE,
        )
    finally:
        await conn.close()
    assert "0018_change_history.sql" in await migrate(old_db)
    store = await PostgresStore.open(ShardMap.single(old_db), pool_size=2)
    try:
        job = await store.get_job("o", idle)
        assert job.spec_version == 1 and job.last_run is not None and job.last_run.spec_version == 1
        [run] = (await store.list_runs("o", idle, limit=10, cursor=None)).items
        assert run.spec_version == 1
        assert (await store.list_changes("o", idle, limit=10, cursor=None)).items == []
        await store.pause_job("o", idle)
        [paused] = (await store.list_changes("o", idle, limit=10, cursor=None)).items
        assert (paused.seq, paused.action, paused.spec_version) == (1, ChangeAction.PAUSE, 1)

        # The run in flight: a PATCH during it moves the job to version 2; the run fenced by the
        # previous release has no version of its own, so it records the job's.
        current = await store.get_job("o", running)
        await store.update_job("o", running, replace(current.spec, payload=1))
        assert (await store.expire_running_of(ENGINE, [shard_of(running)])).applied == 1
        [expired] = (await store.list_runs("o", running, limit=10, cursor=None)).items
        assert (expired.outcome.value, expired.spec_version) == ("lease_expired", 2)
    finally:
        await store.close()
