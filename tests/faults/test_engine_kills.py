"""SIGKILL of an engine process (engine + its workers) at each moment of the run path, with the
checker's accounting as the invariant: every occurrence delivered, none lost, every duplicate
attributed to an attempt whose outcome the scheduler could not know.

Moments: mid-claim (the claim loop is leasing batches), after the claim but before the fire,
with fenced runs waiting in the run queue, mid-call (the target is slow), and after the target
answered 2xx but before the outcome was recorded (the recorder sends the SIGKILL itself, right
after handing its answer to the kernel). The killed engine comes back either under the same id
(it takes its claims back at once and expires its unknown calls) or under a new one (the leases
lapse and the janitor rescues them), so both recovery paths are exercised.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.faults.harness import (
    NodeProc,
    Owner,
    account,
    expected_for,
    node_env,
    one_off,
    owner_on,
    seeded,
    whole_second,
)
from tests.faults.recorder import RecorderProcess
from tests.support.wait import until

pytestmark = pytest.mark.timeout(150)


async def _claimed_by(dsn: str, engine_id: str, phase: str = "claimed") -> int:
    conn = await asyncpg.connect(dsn)
    try:
        n: int = await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE claimed_by = $1 AND phase = $2", engine_id, phase
        )
        return n
    finally:
        await conn.close()


MOMENTS = ["mid_claim", "claimed_unfired", "queued", "mid_call", "answered"]


@pytest.mark.parametrize("moment", MOMENTS)
async def test_engine_sigkill(
    moment: str, fault_db: str, api: NodeProc, recorder: RecorderProcess, tmp_path: Path
) -> None:
    _seed, rng = seeded(f"engine_sigkill[{moment}]")
    victim_id = f"victim-{uuid.uuid4().hex[:6]}"
    same_id = moment in ("claimed_unfired", "queued", "answered") or rng.random() < 0.5
    extra: dict[str, str] = {}
    path, jobs, delay = "/ok", 200, 4.0
    if moment == "mid_claim":
        # One row per claim statement and enough rows that claiming lasts seconds, not the
        # ~0.2 s that 600 rows in pairs took on a quiet machine (the kill then came too late).
        extra["DUETIME_CLAIM_BATCH"] = "1"
        jobs = 3000
        # The rows must still be ahead of their due time when the victim claims them, or they
        # fire as they are claimed and never pile up as claimed: creating 3,000 rows through the
        # API and starting the engine took longer than 4 s on a busy 2-core machine.
        delay = 15.0
    elif moment == "queued":
        extra["DUETIME_WORKER_CONCURRENCY"] = "4"
        path, jobs = "/slow/0.5", 24
    elif moment == "mid_call":
        path, jobs = "/slow/2", 30
    elif moment == "answered":
        path, jobs = "/armed", 30
    env = node_env(fault_db, DUETIME_ENGINE_ID=victim_id, **extra)

    spawned: list[NodeProc] = []
    async with owner_on(api.url, fault_db) as owner:
        try:
            created = await _strike(
                moment,
                env,
                owner=owner,
                recorder=recorder,
                load=(path, jobs, delay),
                rng=rng,
                tmp_path=tmp_path,
                spawned=spawned,
            )
        finally:
            for proc in spawned:
                if proc.alive():
                    await proc.kill()
        held = await _claimed_by(fault_db, victim_id) + await _claimed_by(fault_db, victim_id, "running")
        if moment == "mid_claim":
            assert 0 < held < jobs, f"the kill missed the claiming: the victim held {held} of {jobs}"
        print(f"killed {moment}: the victim held {held} rows; restart under the same id: {same_id}")
        after_env = env if same_id else {**env, "DUETIME_ENGINE_ID": f"rescuer-{uuid.uuid4().hex[:6]}"}
        rescuer = NodeProc(after_env, "engine", tmp_path / "rescuer.log")
        try:
            await rescuer.ready()
            await owner.settle(within=60)
        finally:
            assert await rescuer.stop() == 0
        expected = [e for job in created for e in expected_for(job)]
        report = await account(owner, recorder, expected)
    print(json.dumps({"scenario": f"engine_sigkill[{moment}]", **report.counts(), **report.attribution()}))
    assert report.ok, report.explain()
    assert len(report.buckets["delivered"]) == jobs
    if moment in ("mid_call", "answered"):
        assert report.duplicates, "the calls in flight were made again, and must show as attributed"


async def _strike(
    moment: str,
    env: dict[str, str],
    *,
    owner: Owner,
    recorder: RecorderProcess,
    load: tuple[str, int, float],
    rng: random.Random,
    tmp_path: Path,
    spawned: list[NodeProc],
) -> list[dict[str, Any]]:
    """Bring the victim to the moment and kill it there; returns the jobs made. The victim is put
    in ``spawned`` as soon as it exists, so a failure on the way does not leave it running."""
    path, jobs, delay = load
    fault_db, victim_id = env["DUETIME_DATABASE_URL"], env["DUETIME_ENGINE_ID"]
    if moment == "mid_claim":
        due = whole_second(delay)
        # Rows first, engine second: its first claims of many small batches are the target.
        created = await owner.create_many(one_off(recorder.url + path, due) for _ in range(jobs))
        victim = NodeProc(env, "engine", tmp_path / "victim.log")
        spawned.append(victim)
        target = int(jobs * rng.uniform(0.05, 0.6))

        async def some_claimed() -> bool:
            assert victim.alive(), victim.tail()
            return await _claimed_by(fault_db, victim_id) >= target

        await until(some_claimed, within=60, what=f"{target} rows claimed")
    else:
        victim = NodeProc(env, "engine", tmp_path / "victim.log")
        spawned.append(victim)
        await victim.ready()
        # Due a few seconds after the victim is ready, not after it was spawned: its start-up
        # (imports, migrations check, joining the membership) must not eat the window.
        due = whole_second(delay)
        created = await owner.create_many(one_off(recorder.url + path, due) for _ in range(jobs))
        if moment == "claimed_unfired":

            async def all_claimed() -> bool:
                return await _claimed_by(fault_db, victim_id) == jobs

            await until(all_claimed, within=30, what="every row claimed")
        elif moment == "queued":
            await recorder.wait_for(4, within=30)

            async def all_fenced() -> bool:
                return await _claimed_by(fault_db, victim_id, "running") == jobs

            await until(all_fenced, within=30, what="every run fenced")
        elif moment == "mid_call":
            await recorder.wait_for(jobs, within=30)
        else:
            await recorder.arm(victim.pid)
    if moment == "answered":  # the recorder kills it after its next answer
        await asyncio.wait_for(asyncio.to_thread(victim.proc.wait), timeout=30)
    await victim.kill()
    return created
