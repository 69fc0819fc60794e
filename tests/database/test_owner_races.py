"""Owner actions racing the engine's fence on one job never deadlock and never answer "database
unavailable" (issue 17, item 6).

A probe with six clients mixing PATCH, pause, resume, trigger, backfill and replay on one job got
503 storage_unavailable while PostgreSQL was healthy: ``fence_runs`` (the engine's batch, which
holds the job's own row and its occurrence rows) locked rows in the order of its input, an owner
action locked the job's row and then its occurrence rows, and PostgreSQL broke the cycle as a
deadlock that the store reported as an outage. Here the same mix runs against a real database
while an "engine" fences the job's rows over and over in descending id order (the order a burst
fences in): every owner action must answer its result or a Conflict, and PostgreSQL must count no
deadlock at all in the test's database.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from duetime.core.errors import Conflict, StorageUnavailable
from duetime.core.model import Broker, CronSchedule, JobSpec, Overlap, QueueTarget
from duetime.storage.ports import FenceRequest
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap

TOKEN = 41
ROUNDS = 60


@pytest.fixture
async def db(own_db: str) -> AsyncIterator[tuple[str, PostgresStore]]:
    store = await PostgresStore.open(ShardMap.single(own_db), pool_size=8)
    yield own_db, store
    await store.close()


@pytest.fixture
async def own_db(run_tag: str) -> AsyncIterator[str]:
    from tests.conftest import _create_db, _drop_db

    name = f"duetime_test_{run_tag}_race{uuid.uuid4().hex[:6]}"
    dsn = await _create_db(name)
    yield dsn
    await _drop_db(name)


def _spec(cron: str = "* * * * *") -> JobSpec:
    return JobSpec(
        target=QueueTarget(broker=Broker.NATS, topic="races.t"),
        schedule=CronSchedule(cron=cron),
        overlap=Overlap.ALLOW,
    )


async def _deadlocks(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_stat_force_next_flush()")
        return int(
            await conn.fetchval("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        )
    finally:
        await conn.close()


async def test_owner_actions_and_a_fence_on_one_job_never_deadlock(db: tuple[str, PostgresStore]) -> None:
    dsn, store = db
    owner = "race_" + uuid.uuid4().hex[:6]
    await store.create_api_key(owner)
    job, _ = await store.create_job(owner, _spec())
    job_id = uuid.UUID(job.id)
    now = datetime.now(UTC)
    await store.backfill_job(
        owner, job_id, now - timedelta(hours=2), now, max_occurrences=1000, pace_per_s=1000.0
    )
    before = await _deadlocks(dsn)
    stop = asyncio.Event()
    fences = 0

    async def engine() -> None:
        nonlocal fences
        conn = await asyncpg.connect(dsn)
        try:
            while not stop.is_set():
                # Claim the family in id order (as claim_due's SKIP LOCKED never waits), then fence
                # it in descending order, the order the engine's due-time batches come in.
                rows = await conn.fetch(
                    "WITH f AS (SELECT job_id FROM jobs WHERE (job_id = $1 OR parent_id = $1) "
                    "AND state = 'scheduled' ORDER BY job_id FOR UPDATE SKIP LOCKED) "
                    "UPDATE jobs j SET phase = 'claimed', lease_token = $2, claimed_by = 'race', "
                    "leased_until = now() + interval '1 minute' FROM f WHERE j.job_id = f.job_id "
                    "RETURNING j.job_id, j.shard, j.next_run_at",
                    job_id,
                    TOKEN,
                )
                items = sorted(
                    (FenceRequest(r["job_id"], r["shard"], TOKEN, r["next_run_at"] or now) for r in rows),
                    key=lambda i: i.job_id,
                    reverse=True,
                )
                if items:
                    await store.fence_runs(items, lease_s=60)
                    fences += 1
                    await conn.execute(
                        "WITH f AS (SELECT job_id FROM jobs WHERE (job_id = $1 OR parent_id = $1) "
                        "ORDER BY job_id FOR UPDATE) UPDATE jobs j SET phase = 'idle', claimed_by = NULL, "
                        "leased_until = NULL, run_until = NULL FROM f WHERE j.job_id = f.job_id",
                        job_id,
                    )
                await asyncio.sleep(0)
        finally:
            await conn.close()

    outcomes: dict[str, int] = {}
    failures: list[BaseException] = []

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(ROUNDS):
            action = rng.choice(["patch", "pause", "resume", "trigger", "backfill", "replay"])
            try:
                if action == "patch":
                    await store.update_job(owner, job_id, _spec(rng.choice(["* * * * *", "*/2 * * * *"])))
                elif action == "pause":
                    await store.pause_job(owner, job_id)
                elif action == "resume":
                    await store.resume_job(owner, job_id)
                elif action == "trigger":
                    await store.trigger_job(owner, job_id)
                elif action == "replay":
                    await store.replay_job(owner, job_id)
                else:
                    t = datetime.now(UTC) - timedelta(minutes=rng.randint(5, 100))
                    await store.backfill_job(
                        owner, job_id, t, t + timedelta(minutes=3), max_occurrences=1000, pace_per_s=1000.0
                    )
                outcomes[f"{action} ok"] = outcomes.get(f"{action} ok", 0) + 1
            except Conflict as exc:
                outcomes[f"{action} {exc.code}"] = outcomes.get(f"{action} {exc.code}", 0) + 1
            except StorageUnavailable as exc:
                failures.append(exc)
            except Exception as exc:
                failures.append(exc)

    runner = asyncio.create_task(engine())
    try:
        await asyncio.gather(*(client(i) for i in range(6)))
    finally:
        stop.set()
        await runner
    assert not failures, [f"{type(f).__name__}: {f} (cause {f.__cause__!r})" for f in failures[:5]]
    assert fences > 5, "the fence ran alongside the owners"
    assert sum(outcomes.values()) == 6 * ROUNDS
    assert await _deadlocks(dsn) == before, outcomes
