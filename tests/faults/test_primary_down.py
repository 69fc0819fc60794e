"""One primary down among two: the other primary's shards go on, on time; the down one's runs
start once it is back. Two PRIVATE PostgreSQL clusters (``EmbeddedPostgres`` in temporary
directories, as ``duetime run`` starts its own), shards 0-7 on A (the home database: owners, keys,
membership) and 8-15 on B, one real ``duetime run`` over both.

Before the run path worked database by database, 0 of 153 runs on A started within 10 s while B
was down (the fencer retried whole mixed batches, the lease keeper gave up at the first failing
database), and with A down 0 of 132 on B did.

Every scenario ends with the accounting: lost, started early, duplicated without a lapsed lease,
stuck; and the lateness of each primary's runs, printed as a JSON line.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest

from duetime.core.ids import shard_of
from duetime.embedded_pg import EmbeddedPostgres
from tests.faults.harness import (
    NodeProc,
    account,
    expected_for,
    node_env,
    one_off,
    owner_on,
    whole_second,
)
from tests.faults.recorder import RecorderProcess
from tests.support.pgcluster import migrated_database, private_cluster, start_again, stop_immediately
from tests.support.wait import until

pytestmark = [pytest.mark.timeout(300), pytest.mark.processes]

LEASE_S = 3.0  # node_env's DUETIME_LEASE_S


@pytest.fixture(scope="module")
async def primaries() -> AsyncIterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    async with private_cluster() as a, private_cluster() as b:
        yield a, b


def _lateness_s(recorder: RecorderProcess, due: dict[str, datetime]) -> dict[str, float]:
    """Per job of ``due``: its first call's arrival minus its due instant, in seconds."""
    first: dict[str, float] = {}
    for r in recorder.records():
        if r.job_id in due:
            late = (r.arrived - due[r.job_id]).total_seconds()
            first[r.job_id] = min(first.get(r.job_id, late), late)
    return first


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


@pytest.mark.parametrize("down", ["B", "A (home)"])
async def test_one_primary_down_holds_back_only_its_own_shards(
    down: str,
    primaries: tuple[EmbeddedPostgres, EmbeddedPostgres],
    recorder: RecorderProcess,
    tmp_path: Path,
) -> None:
    await _one_primary_down(down, primaries, recorder, tmp_path, warm=True)


async def test_runs_that_could_not_be_signed_while_the_home_primary_was_down_use_no_attempt(
    primaries: tuple[EmbeddedPostgres, EmbeddedPostgres],
    recorder: RecorderProcess,
    tmp_path: Path,
) -> None:
    """No worker has the owner's signing secret yet when the home primary goes down: B's runs
    cannot be signed, so they wait for it (their leases kept) instead of being recorded as failed
    attempts of the target; once it is back each is called once, as attempt 1."""
    await _one_primary_down("A (home)", primaries, recorder, tmp_path, warm=False)


async def _one_primary_down(
    down: str,
    primaries: tuple[EmbeddedPostgres, EmbeddedPostgres],
    recorder: RecorderProcess,
    tmp_path: Path,
    *,
    warm: bool,
) -> None:
    pg_a, pg_b = primaries
    dsn_a, dsn_b = await migrated_database(pg_a), await migrated_database(pg_b)
    env = {k: v for k, v in node_env(dsn_a).items() if k != "DUETIME_DATABASE_URL"}
    env.update(DUETIME_SHARD_DSNS=f"0-7={dsn_a},8-15={dsn_b}", DUETIME_DATA_DIR=str(tmp_path / "data"))
    node = NodeProc(env, "run", tmp_path / "node.log")
    victim, healthy = (pg_b, "A") if down == "B" else (pg_a, "B")
    victim_down = False
    try:
        url = await node.ready()
        async with owner_on(url, dsn_a) as owner:
            # A call first: a worker that has served the owner holds its signing secret (a
            # running cluster does), which the home database's outage must not take away.
            warmup = [await owner.create(one_off(recorder.url + "/ok", whole_second(1)))] if warm else []
            await recorder.wait_for(len(warmup), within=30)
            due_at = whole_second(9)
            jobs = await owner.create_many([one_off(recorder.url + "/ok", due_at) for _ in range(300)])
            on: dict[str, set[str]] = {"A": set(), "B": set()}
            for job in jobs:
                on["A" if shard_of(uuid.UUID(job["id"])) < 8 else "B"].add(job["id"])
            due = {job["id"]: due_at for job in jobs}
            await asyncio.sleep(max(0.0, (due_at - whole_second(0)).total_seconds() - 5))
            await stop_immediately(victim)  # 5 s before they come due
            victim_down = True
            stopped_at = time.monotonic()
            if warm:
                await until(
                    lambda: len(_lateness_s(recorder, {j: due_at for j in on[healthy]})) == len(on[healthy]),
                    within=30,
                    what=f"every run on the healthy primary {healthy} started",
                )
            healthy_late = list(_lateness_s(recorder, {j: due_at for j in on[healthy]}).values())
            await asyncio.sleep(max(0.0, 15 - (time.monotonic() - stopped_at)))
            held_back = len(_lateness_s(recorder, {j: due_at for j in on[down[0]]}))
            await start_again(victim)
            victim_down = False
            back_at = datetime.now(tz=due_at.tzinfo)
            await until(
                lambda: len(_lateness_s(recorder, due)) == len(jobs),
                within=60,
                what=f"every run on {down} started after its return",
            )
            after_return = [
                late - (back_at - due_at).total_seconds()
                for job_id, late in _lateness_s(recorder, due).items()
                if job_id in on[down[0]] or not warm  # cold: every run waited for the home
            ]
            await owner.settle(within=120)
            everything = [*jobs, *warmup]
            report = await account(owner, recorder, [e for job in everything for e in expected_for(job)])
            attempts = [run for job in jobs for run in await owner.runs(job["id"])]
        alive = node.alive()
    finally:
        if victim_down:
            await start_again(victim)
        await node.stop()
    print(
        json.dumps(
            {
                "scenario": f"primary_down_{down[0]}" + ("" if warm else "_cold_secrets"),
                f"runs_on_{healthy}": len(on[healthy]),
                f"runs_on_{down[0]}": len(on[down[0]]),
                f"p99_lateness_on_{healthy}_s": round(_p99(healthy_late), 3) if healthy_late else None,
                f"started_on_{healthy}_while_{down[0]}_down": len(healthy_late),
                f"started_on_{down[0]}_while_down": held_back,
                f"max_start_after_return_of_{down[0]}_s": round(max(after_return), 3),
                **report.counts(),
            }
        )
    )
    assert alive, node.tail()
    assert report.ok, report.explain()
    assert report.counts()["delivered"] == len(everything), report.explain()
    assert [(r["attempt"], r["outcome"]) for r in attempts] == [(1, "succeeded")] * len(jobs), [
        r for r in attempts if r["attempt"] != 1 or r["outcome"] != "succeeded"
    ][:3]
    if not warm:
        assert max(after_return) <= LEASE_S + 10, "the unsigned runs started once the home was back"
        return
    slowest = sorted(healthy_late)[-5:]
    assert _p99(healthy_late) <= 1.0, f"runs on the healthy primary {healthy} started late: {slowest}"
    assert held_back == 0, "no run of the down primary started while it was down"
    assert max(after_return) <= LEASE_S + 10, "the down primary's runs started within a lease of its return"
