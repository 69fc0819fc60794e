"""One live engine per id, with real `duetime run` processes sharing a database.

Before: a second process started under an id a live one held expired the first's runs in flight
(its restart step takes them for a dead predecessor's), so a call still running was made again, a
duplicate without a lapsed lease; and the two then fought over the membership row.

Now: the second refuses to start, naming the holder (the id is a session-level lock on the home
database, held for the process's life); a frozen holder keeps its id; a restart after a crash goes
on under the same id at once, as before.
"""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import pytest

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
from tests.support.wait import until

pytestmark = [pytest.mark.timeout(180), pytest.mark.processes]


def _env(dsn: str, tmp_path: Path, engine_id: str, name: str) -> dict[str, str]:
    return node_env(dsn, DUETIME_ENGINE_ID=engine_id, DUETIME_DATA_DIR=str(tmp_path / name))


async def test_a_second_live_engine_under_the_same_id_refuses_to_start(
    fault_db: str, recorder: RecorderProcess, tmp_path: Path
) -> None:
    engine_id = f"dup-{uuid.uuid4().hex[:6]}"
    first = NodeProc(_env(fault_db, tmp_path, engine_id, "a"), "run", tmp_path / "first.log")
    second: NodeProc | None = None
    try:
        url = await first.ready()
        async with owner_on(url, fault_db) as owner:
            # A call that runs 6 s: in flight while the second process tries to start.
            job = await owner.create(one_off(recorder.url + "/slow/6", whole_second(1)))
            await recorder.wait_for(1, within=30)
            second = NodeProc(_env(fault_db, tmp_path, engine_id, "b"), "run", tmp_path / "second.log")
            code = await second.proc_wait(within=60)
            refused = second.tail()
            await owner.settle(within=60)
            report = await account(owner, recorder, expected_for(job))
        alive = first.alive()
    finally:
        if second is not None:
            await second.stop()
        await first.stop()
    print(json.dumps({"scenario": "duplicate_engine_id", "second_exit": code, **report.counts()}))
    assert code not in (0, None), "the second process did not refuse to start"
    assert "is in use by a live engine" in refused and "DUETIME_ENGINE_ID" in refused, refused
    assert alive, first.tail()
    assert report.ok, report.explain()
    assert report.calls == 1, "the run in flight was not called again"


async def test_a_frozen_holder_keeps_its_id_and_goes_on_when_it_runs_again(
    fault_db: str, recorder: RecorderProcess, tmp_path: Path
) -> None:
    """A frozen process is not a dead one: it holds its id (its session with the home database
    lives on), a new process under the id refuses to start, and the frozen one goes on once it
    runs again. Taking the id over would have expired its runs in flight while it could still
    finish them."""
    engine_id = f"frz-{uuid.uuid4().hex[:6]}"
    first = NodeProc(_env(fault_db, tmp_path, engine_id, "a"), "run", tmp_path / "first.log")
    second: NodeProc | None = None
    try:
        url = await first.ready()
        first.signal(signal.SIGSTOP)
        second = NodeProc(_env(fault_db, tmp_path, engine_id, "b"), "run", tmp_path / "second.log")
        code = await second.proc_wait(within=60)
        refused = second.tail()
        first.signal(signal.SIGCONT)
        async with owner_on(url, fault_db) as owner:
            job = await owner.create(one_off(recorder.url + "/ok", whole_second(2)))
            await owner.settle(within=60)
            report = await account(owner, recorder, expected_for(job))
        alive = first.alive()
    finally:
        if second is not None:
            await second.stop()
        await first.stop()
    assert code not in (0, None), "the second process started beside a frozen holder"
    assert "is in use by a live engine" in refused, refused
    assert alive, first.tail()
    assert report.ok, report.explain()


async def test_a_restart_after_a_crash_goes_on_under_the_same_id(
    fault_db: str, recorder: RecorderProcess, tmp_path: Path
) -> None:
    engine_id = f"crash-{uuid.uuid4().hex[:6]}"
    first = NodeProc(_env(fault_db, tmp_path, engine_id, "a"), "run", tmp_path / "first.log")
    await first.ready()
    await first.kill()
    again = NodeProc(_env(fault_db, tmp_path, engine_id, "b"), "run", tmp_path / "again.log")
    try:
        url = await again.ready()
        async with owner_on(url, fault_db) as owner:
            job = await owner.create(one_off(recorder.url + "/ok", whole_second(2)))
            await until(lambda: recorder.records() != [], within=30, what="the run after the restart")
            await owner.settle(within=60)
            report = await account(owner, recorder, expected_for(job))
    finally:
        await again.stop()
    assert report.ok, report.explain()
