"""A burst larger than the fencer gets through within one lease.

The million-run stall: every run due at T had a claim lease until T + lease. The fencer took the
fired entries in order, slower than that, so the later ones lapsed while still waiting in the
engine's lanes; the janitor released them, the claim loops re-claimed them under new tokens and
appended the new entries behind the old ones, whose fences were then rejected. Once the backlog
ahead of an entry took longer than a lease, every entry lapsed before the fencer reached it and
nothing started any more. These tests slow the run queue down so that a small burst outlasts a
one-second lease, and check the outcome (tokens, rejected fences, claims), never a duration.
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from duetime.core.model import Broker, JobSpec, OneOffSchedule, QueueTarget
from duetime.core.runpath import FencedRun
from duetime.engine.service import Engine, EngineConfig
from duetime.runqueue import metrics
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.bulk import BulkJob, analyze_jobs, seed_jobs
from duetime.storage.migrate import migrate
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.conftest import ADMIN_DSN

pytestmark = pytest.mark.timeout(120)

JOBS = 600
LEASE_S = 1.0


@pytest.fixture
async def dsn() -> AsyncIterator[str]:
    """A database of its own: its rows are due, and a shared database's engines would claim them."""
    name = f"duetime_test_burstlease_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = f"{ADMIN_DSN.rpartition('/')[0]}/{name}"
    try:
        await migrate(url)
        yield url
    finally:
        admin = await asyncpg.connect(ADMIN_DSN)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


class SlowQueue:
    """A run queue whose workers take one run per ``pause`` seconds; ``gate`` can stop them."""

    def __init__(self, pause: float) -> None:
        self.pause = pause
        self.runs: list[FencedRun] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.all_fenced = asyncio.Event()  # every job of the burst has been put at least once
        self._seen: set[uuid.UUID] = set()

    async def put(self, run: FencedRun) -> None:
        await self.gate.wait()
        self.runs.append(run)
        self._seen.add(run.job_id)
        if len(self._seen) >= JOBS:
            self.all_fenced.set()
        await asyncio.sleep(self.pause)

    async def get(self) -> FencedRun:  # pragma: no cover - the engine only puts
        raise NotImplementedError

    def qsize(self) -> int:
        return 0

    def get_nowait(self) -> FencedRun | None:
        return None


def _total(counter: object) -> float:
    return float(
        sum(x.value for m in counter.collect() for x in m.samples if x.name.endswith("_total"))  # type: ignore[attr-defined]
    )


async def _seed(url: str, due: datetime) -> list[uuid.UUID]:
    spec = JobSpec(target=QueueTarget(broker=Broker.REDIS, topic="burst-lease"), schedule=OneOffSchedule(due))
    ids = await seed_jobs([url] * 16, (BulkJob("night", spec) for _ in range(JOBS)), datetime.now(UTC))
    await analyze_jobs([url])
    return ids


def _config(engine_id: str) -> EngineConfig:
    return EngineConfig(
        engine_id=engine_id,
        lookahead_s=30.0,
        poll_interval_s=0.2,
        lease_s=LEASE_S,
        janitor_interval_s=0.2,
        fence_batch=50,
    )


async def test_a_burst_longer_than_a_lease_is_claimed_and_fenced_once(dsn: str) -> None:
    """Regression (the million-run stall): runs waiting in a live, draining engine keep their
    claims. Before, with the burst taking ~3 leases to fence, most rows were released and
    re-claimed (lease_token 2, 3, ...) and their first entries' fences rejected."""
    due = datetime.now(UTC) + timedelta(seconds=1)
    ids = await _seed(dsn, due)
    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=4)
    # Fenced runs keep their leases (nobody calls them here): only the claims are the point.
    keeper = LeaseKeeper(store, lease_s=60.0, heartbeat_s=0.2)
    queue = SlowQueue(pause=3 * LEASE_S / JOBS)  # the whole burst takes about three leases
    engine = Engine(store, queue, keeper, _config("burst-lease-a"))
    rejected_before = _total(metrics.FENCE_REJECTED)
    claims_before = _total(metrics.CLAIMS)
    keeper.start()
    await engine.start()
    try:
        await queue.all_fenced.wait()
    finally:
        await engine.stop()
        await keeper.stop()
        tokens = await store.pool_for_shard(0).fetch(
            "SELECT lease_token, count(*) AS n FROM jobs WHERE job_id = ANY($1::uuid[]) GROUP BY 1", ids
        )
        await store.close()
    assert {r["lease_token"]: r["n"] for r in tokens} == {1: JOBS}  # each row claimed once
    assert len(queue.runs) == JOBS  # each fenced once
    assert _total(metrics.FENCE_REJECTED) - rejected_before == 0
    assert _total(metrics.CLAIMS) - claims_before == JOBS
    assert _total(metrics.CLAIMS_KEPT) > 0  # the burst did outlast its leases


async def test_a_stuck_fencer_lets_its_claims_lapse_for_the_janitor(dsn: str) -> None:
    """Keeping claims must not hide runs inside an engine that stopped draining: when the fencer
    takes nothing for a whole lease, the claims lapse and the janitor releases them."""
    due = datetime.now(UTC) + timedelta(seconds=1)
    ids = await _seed(dsn, due)
    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=4)
    keeper = LeaseKeeper(store, lease_s=30.0, heartbeat_s=10.0)
    queue = SlowQueue(pause=0.0)
    queue.gate.clear()  # the workers never take anything: the fencer blocks on its first put
    engine = Engine(store, queue, keeper, _config("burst-lease-b"))
    await engine.start()
    try:
        # The janitor releases lapsed claims and the claim loops take them again: new tokens.
        while True:
            retaken = await store.pool_for_shard(0).fetchval(
                "SELECT count(*) FROM jobs WHERE job_id = ANY($1::uuid[]) AND lease_token > 1", ids
            )
            if retaken >= JOBS // 2:
                break
            await asyncio.sleep(0.1)
    finally:
        queue.gate.set()
        await engine.stop()
        await store.close()


async def test_keep_waiting_claims_touches_only_the_engines_own_claims_near_lapse(dsn: str) -> None:
    due = datetime.now(UTC) - timedelta(seconds=1)
    await _seed(dsn, due)
    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=2)
    try:
        pool = store.pool_for_shard(0)
        shard = await pool.fetchval("SELECT shard FROM jobs GROUP BY shard ORDER BY count(*) DESC LIMIT 1")
        mine = await store.claim_due(shard, "me", lookahead_s=60, lease_s=1, limit=10)
        theirs = await store.claim_due(shard, "them", lookahead_s=60, lease_s=1, limit=10)
        later = await store.claim_due(shard, "me", lookahead_s=60, lease_s=600, limit=10)
        fenced = await store.claim_due(shard, "me", lookahead_s=60, lease_s=1, limit=10)
        await store.fence_runs(fenced, lease_s=1)
        kept = await store.keep_waiting_claims(shard, "me", within_s=30, extend_s=300, limit=5000)
        rows = {
            r["job_id"]: r
            for r in await pool.fetch(
                "SELECT job_id, lease_token, phase, claimed_by, leased_until - now() AS left FROM jobs"
            )
        }
    finally:
        await store.close()
    assert kept == len(mine) == 10
    for r in mine:
        assert rows[r.job_id]["lease_token"] == r.lease_token  # the token never moves
        assert rows[r.job_id]["left"] > timedelta(seconds=200)
    for r in theirs + fenced:
        assert rows[r.job_id]["left"] < timedelta(seconds=5)
    for r in later:
        assert timedelta(seconds=500) < rows[r.job_id]["left"] < timedelta(seconds=700)
