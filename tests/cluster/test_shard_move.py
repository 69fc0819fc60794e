"""Moving one logical shard from one primary to another with `duetime shards move`, the procedure
of docs/operations.md: restart the engines without the shard, move its rows, switch
DUETIME_SHARD_DSNS, restart. Jobs of the shard that are scheduled across the move all fire, once,
from their new database; its history and Idempotency-Keys move with it."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
import uuid
import zlib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from duetime.core.ids import SHARDS, shard_of
from duetime.core.model import CronSchedule, JobSpec, OneOffSchedule, WebhookTarget
from duetime.storage.base import IdempotencyRequest
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.common import ReceiverProcess
from tests.cluster.harness import Arrivals, Cluster, new_owner, until, utcnow

MOVED = 5


def _env(shard_dsns: str) -> dict[str, str]:
    # The in-process run queue: the move does not depend on how runs reach workers.
    return {
        "DUETIME_SHARD_DSNS": shard_dsns,
        "DUETIME_HTTP_PORT": "0",
        "DUETIME_WEBHOOK_ALLOW_PRIVATE": "1",
        "DUETIME_POLL_INTERVAL_S": "0.5",
        "DUETIME_JANITOR_INTERVAL_S": "0.5",
        "DUETIME_LEASE_S": "4",
        "DUETIME_HEARTBEAT_S": "1",
        "DUETIME_SHUTDOWN_GRACE_S": "10",
        "DUETIME_DB_POOL_SIZE": "4",
    }


def _keys_on(owner: str, shard: int, n: int) -> list[str]:
    """Idempotency-Keys whose job (and key record) land on ``shard``."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        key = f"move-{i}"
        if zlib.crc32(f"{owner}\x00{key}".encode()) % SHARDS == shard:
            out.append(key)
        i += 1
    return out


def _move(shard_dsns: str, shard: int, to: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "duetime", "shards", "move", "--shard", str(shard), "--to", to],
        env={**os.environ, **_env(shard_dsns)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def _claimed(store: PostgresStore, dsn: str) -> bool:
    sql = "SELECT count(*) FROM jobs WHERE shard = $1 AND phase = 'claimed'"
    return await _count(store, dsn, sql) > 0


async def _count(store: PostgresStore, dsn: str, sql: str) -> int:
    n: int = await store.pool_for_dsn(dsn).fetchval(sql, MOVED)
    return n


@pytest.fixture
async def old_store(two_primaries: tuple[str, str]) -> AsyncIterator[PostgresStore]:
    a, b = two_primaries
    s = await PostgresStore.open(ShardMap.from_dsns([a] * 8 + [b] * 8), pool_size=2)
    yield s
    await s.close()


@pytest.mark.timeout(180)
async def test_a_shard_moves_between_primaries_and_its_jobs_still_fire_once(
    two_primaries: tuple[str, str],
    old_store: PostgresStore,
    receiver_process: ReceiverProcess,
    tmp_path: Path,
) -> None:
    a, b = two_primaries
    old_map, new_map = f"0-7={a},8-15={b}", f"0-4={a},5={b},6-7={a},8-15={b}"
    cluster = Cluster(_env(old_map), tmp_path)
    try:
        await cluster.engine("all", "0-15")
        owner = new_owner()
        await old_store.create_api_key(owner)
        url = f"{receiver_process.url}/move"
        # Every second, on the moved shard: history before the move, runs after it.
        crons = []
        for key in _keys_on(owner, MOVED, 3):
            spec = JobSpec(target=WebhookTarget(url=url), schedule=CronSchedule("*/1 * * * * *"))
            job, _ = await old_store.create_job(
                owner, spec, idempotency=IdempotencyRequest(key, hashlib.sha256(key.encode()).digest())
            )
            crons.append(job.id)
        # One-off jobs due after the move, on the moved shard and elsewhere.
        due = (utcnow() + timedelta(seconds=25)).replace(microsecond=0)
        one_offs: list[str] = []
        while sum(1 for j in one_offs if shard_of(uuid.UUID(j)) == MOVED) < 30:
            job, _ = await old_store.create_job(
                owner, JobSpec(target=WebhookTarget(url=url), schedule=OneOffSchedule(due))
            )
            one_offs.append(job.id)
        while True:
            seen = Arrivals.of(await receiver_process.dump()).by_job
            if all(len(seen.get(c, [])) >= 2 for c in crons):
                break
            await asyncio.sleep(0.2)

        # 1. Drain: the engine serving the shard restarts without it.
        assert await cluster.procs["all"].terminate() == 0
        await cluster.engine("others", "0-4,6-15")
        runs_before = await _count(old_store, a, "SELECT count(*) FROM runs WHERE shard = $1")
        jobs_before = await _count(old_store, a, "SELECT count(*) FROM jobs WHERE shard = $1")
        assert runs_before >= 6 and jobs_before == 33
        # Each job's change history (its create) moves with it (migration 0018).
        changes_before = await _count(old_store, a, "SELECT count(*) FROM job_changes WHERE shard = $1")
        assert changes_before == 33

        # 2. Move.
        done = _move(old_map, MOVED, b)
        assert done.returncode == 0, done.stderr
        assert f"DUETIME_SHARD_DSNS={new_map}" in done.stdout, done.stdout
        assert await _count(old_store, a, "SELECT count(*) FROM jobs WHERE shard = $1") == 0
        assert await _count(old_store, a, "SELECT count(*) FROM runs WHERE shard = $1") == 0
        assert await _count(old_store, b, "SELECT count(*) FROM jobs WHERE shard = $1") == jobs_before
        assert await _count(old_store, b, "SELECT count(*) FROM runs WHERE shard = $1") == runs_before
        assert await _count(old_store, a, "SELECT count(*) FROM job_changes WHERE shard = $1") == 0
        assert (
            await _count(old_store, b, "SELECT count(*) FROM job_changes WHERE shard = $1") == changes_before
        )

        # 3. Switch the map and restart.
        assert await cluster.procs["others"].terminate() == 0
        cluster.env = _env(new_map)
        moved_at = utcnow()
        await cluster.engine("all-new", "0-15")

        new_store = await PostgresStore.open(
            ShardMap.from_dsns([a] * 5 + [b] + [a] * 2 + [b] * 8), pool_size=2
        )
        try:
            # The key records moved with their jobs: a repeated create finds the same job.
            key = _keys_on(owner, MOVED, 1)[0]
            again, created = await new_store.create_job(
                owner,
                JobSpec(target=WebhookTarget(url=url), schedule=CronSchedule("*/1 * * * * *")),
                idempotency=IdempotencyRequest(key, hashlib.sha256(key.encode()).digest()),
            )
            assert (again.id, created) == (crons[0], False)
            [record] = (await new_store.list_changes(owner, uuid.UUID(crons[0]), limit=10, cursor=None)).items
            assert (record.seq, record.action.value) == (1, "create")
            deadline = asyncio.get_running_loop().time() + 60
            while True:
                arrivals = Arrivals.of(await receiver_process.dump())
                if set(one_offs) <= arrivals.by_job.keys() or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.5)
            assert set(one_offs) <= arrivals.by_job.keys(), "a one-off job was lost in the move"
            assert all(len(arrivals.by_job[j]) == 1 for j in one_offs), "a one-off job fired twice"
            after = moved_at.timestamp() * 1e9
            for c in crons:  # the recurring jobs kept firing from their new database
                assert any(t > after for _, _, t in arrivals.by_job[c]), c
            await asyncio.sleep(1.5)

            # The engine records a run after its call came back: the receiver can have seen a
            # call whose history row is not written yet.
            async def recorded_on_b() -> bool:
                return await _count(new_store, b, "SELECT count(*) FROM runs WHERE shard = $1") > runs_before

            await until(recorded_on_b, within=30, what="runs of the moved shard recorded on its new database")
            assert await _count(new_store, a, "SELECT count(*) FROM jobs WHERE shard = $1") == 0
        finally:
            await new_store.close()
    finally:
        codes = await cluster.stop_all()
        assert all(code == 0 for code in codes.values()), (codes, cluster.logs())


@pytest.mark.timeout(120)
async def test_the_move_is_refused_while_rows_of_the_shard_are_claimed(
    two_primaries: tuple[str, str], old_store: PostgresStore, tmp_path: Path
) -> None:
    a, b = two_primaries
    old_map = f"0-7={a},8-15={b}"
    cluster = Cluster(_env(old_map), tmp_path)
    try:
        await cluster.engine("all", "0-15")
        owner = new_owner()
        await old_store.create_api_key(owner)
        key = _keys_on(owner, MOVED, 1)[0]
        await old_store.create_job(
            owner,
            JobSpec(
                target=WebhookTarget(url="http://127.0.0.1:9/x"),
                schedule=OneOffSchedule(utcnow() + timedelta(seconds=40)),
            ),
            idempotency=IdempotencyRequest(key, b"h"),
        )
        # Inside the lookahead: the engine claims it into its wheel.
        await until(lambda: _claimed(old_store, a), within=30, what="the engine to claim the job")
        refused = _move(old_map, MOVED, b)
        assert refused.returncode == 1  # the operation was refused; the command line was fine
        assert "claimed or running" in refused.stderr
        assert await _count(old_store, a, "SELECT count(*) FROM jobs WHERE shard = $1") == 1
        assert await _count(old_store, b, "SELECT count(*) FROM jobs WHERE shard = $1") == 0
        # Shard 0 is the home database (owners, keys): not movable this way.
        home = _move(old_map, 0, b)
        assert home.returncode == 2 and "--shard" in home.stderr
    finally:
        codes = await cluster.stop_all()
        assert all(code == 0 for code in codes.values()), (codes, cluster.logs())
