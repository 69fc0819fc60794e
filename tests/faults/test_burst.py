"""Seeded SIGKILLs of engine processes during a burst, accounted for run by run.

Two engine processes serve all 16 shards; one-off jobs and every-second cron jobs (bounded by
``start_at``/``end_at``, their occurrences computed by croniter) fall due over a window; at seeded
moments an engine is killed — plainly, or by the target right after it answered 2xx — and comes
back under its own id or a new one. The checker must find 0 lost occurrences and 0 unattributed
duplicates.

Size (the default is what CI runs, about half a minute):

    DUETIME_FAULT_RUNS=20000 DUETIME_FAULT_KILLS=20 DUETIME_FAULT_WINDOW_S=60 \\
        .venv/bin/pytest tests/faults/test_burst.py -s

``DUETIME_FAULT_SEED`` replays a run's kill schedule and job mix (timings still vary).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import (
    NodeProc,
    account,
    env_int,
    every_second,
    expected_for,
    node_env,
    one_off,
    owner_on,
    seeded,
    whole_second,
)
from tests.faults.recorder import RecorderProcess

RUNS = env_int("DUETIME_FAULT_RUNS", 1000)
KILLS = env_int("DUETIME_FAULT_KILLS", 3)
WINDOW_S = env_int("DUETIME_FAULT_WINDOW_S", max(8, 3 * KILLS))
CREATE_RATE = 300  # jobs a second the test expects to register, to place the window after it


class Engines:
    """Two engine processes; a killed one is replaced under the same id or a new one."""

    def __init__(self, dsn: str, logs: Path) -> None:
        self._dsn = dsn
        self._logs = logs
        self._generation = 0
        self.procs: list[NodeProc] = []
        self.ids: list[str] = []

    async def start(self) -> None:
        for slot in range(2):
            self.ids.append(f"burst{slot}-{uuid.uuid4().hex[:4]}")
            self.procs.append(self._spawn(slot))
        for proc in self.procs:
            await proc.ready()

    def _spawn(self, slot: int) -> NodeProc:
        self._generation += 1
        env = node_env(self._dsn, DUETIME_ENGINE_ID=self.ids[slot])
        return NodeProc(env, "engine", self._logs / f"engine{slot}-{self._generation}.log")

    async def replace(self, slot: int, same_id: bool) -> None:
        if not same_id:
            self.ids[slot] = f"burst{slot}-{uuid.uuid4().hex[:4]}"
        self.procs[slot] = self._spawn(slot)
        await self.procs[slot].ready()

    async def stop(self) -> None:
        for proc in self.procs:
            await proc.stop()


@pytest.mark.timeout(300 + RUNS // 50 + 3 * WINDOW_S)
async def test_seeded_kills_during_a_burst_lose_nothing(
    fault_db: str, api: NodeProc, recorder: RecorderProcess, tmp_path: Path
) -> None:
    seed, rng = seeded("burst")
    cron_jobs = max(2, RUNS // 5 // (WINDOW_S + 1))
    one_offs = RUNS - cron_jobs * (WINDOW_S + 1)
    lead = 4 + RUNS / CREATE_RATE
    engines = Engines(fault_db, tmp_path)
    await engines.start()
    kills: list[dict[str, Any]] = []
    try:
        async with owner_on(api.url, fault_db) as owner:
            start = whole_second(lead)
            end = start + timedelta(seconds=WINDOW_S)

            def path() -> str:
                roll = rng.random()
                return "/ok" if roll < 0.8 else "/slow/0.4" if roll < 0.95 else "/armed"

            specs = [
                one_off(recorder.url + path(), start + timedelta(seconds=rng.uniform(0, WINDOW_S)))
                for _ in range(one_offs)
            ]
            specs += [every_second(recorder.url + path(), start, end) for _ in range(cron_jobs)]
            rng.shuffle(specs)
            began = time.monotonic()
            created = await owner.create_many(specs)
            print(f"registered {len(created)} jobs in {time.monotonic() - began:.1f} s")
            # A slow registration (a busy machine) must not squeeze the kills together: they are
            # spread over the window from whichever comes later, its start or now.
            kill_base = max(start, whole_second(0))
            offsets = sorted(rng.uniform(0.5, WINDOW_S) for _ in range(KILLS))
            plan = [(o, rng.randrange(2), rng.choice(["same_id", "new_id", "after_answer"])) for o in offsets]
            for offset, slot, mode in plan:
                wait = (kill_base + timedelta(seconds=offset) - datetime.now(UTC)).total_seconds()
                if wait > 0:
                    await asyncio.sleep(wait)
                victim = engines.procs[slot]
                if mode == "after_answer":
                    await recorder.arm(victim.pid)
                    try:
                        await asyncio.wait_for(asyncio.to_thread(victim.proc.wait), timeout=3)
                    except TimeoutError:
                        victim.signal(signal.SIGKILL)  # no armed call came: kill it plainly
                await victim.kill()
                kills.append({"at_s": round(offset, 2), "engine": slot, "mode": mode})
                await engines.replace(slot, same_id=mode != "new_id")
            await owner.settle(within=120 + RUNS / 200)
            expected = [e for job in created for e in expected_for(job)]
            report = await account(owner, recorder, expected)
    finally:
        await engines.stop()
    figures = {
        "scenario": "burst",
        "seed": seed,
        "runs_expected": len(expected),
        "kills": len(kills),
        **report.counts(),
        "attribution": report.attribution(),
    }
    print(json.dumps(figures))
    print("kills:", kills)
    assert report.ok, report.explain()
    assert len(kills) == KILLS
    assert report.counts()["lost"] == 0 and not report.unattributed
