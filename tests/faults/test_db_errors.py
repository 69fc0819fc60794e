"""Database errors that are not outages, raised under a running ``duetime run`` by a trigger: the
database answers, but a statement of Duetime's is refused with a chosen SQLSTATE (a deadlock, a
serialization failure, a lock or statement timeout), as a busy production primary does now and
then. Each is a reason to write again, never a reason to stop writing.

Before the supervised writers, one deadlock on the history insert ended the completion writer for
good: every run due afterwards was called and then stayed ``running`` with its lease kept alive,
while /readyz answered 200.

Every scenario ends with the accounting: lost, started early, duplicated without a lapsed lease,
stuck (still scheduled after the settle bound).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from tests.faults.harness import (
    NodeProc,
    account,
    expected_for,
    metric,
    node_env,
    one_off,
    owner_on,
    whole_second,
)
from tests.faults.recorder import RecorderProcess
from tests.support.wait import until

pytestmark = [pytest.mark.timeout(240), pytest.mark.processes]

# Raises ``sqlstate`` on the first ``times`` inserts into the history (each statement, whatever
# its row count), then lets them through. A sequence counts the hits: nextval is not rolled back
# with the transaction the error aborts, so the count survives the failure it causes.
_INJECT = """
CREATE SEQUENCE fault_hits;
CREATE FUNCTION fault_raise() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('fault_hits') <= {times} THEN
        RAISE EXCEPTION 'injected by the test' USING ERRCODE = '{sqlstate}';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER fault_on_history BEFORE INSERT ON runs
    FOR EACH STATEMENT EXECUTE FUNCTION fault_raise();
"""


async def _inject(dsn: str, sqlstate: str, times: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(_INJECT.format(sqlstate=sqlstate, times=times))
    finally:
        await conn.close()


async def _hits(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT last_value FROM fault_hits"))
    finally:
        await conn.close()


@pytest.mark.parametrize(
    "sqlstate",
    [
        "40P01",  # deadlock_detected
        "40001",  # serialization_failure
        "55P03",  # lock_not_available (lock_timeout)
        "57014",  # query_canceled (statement_timeout)
    ],
)
async def test_a_refused_history_insert_is_written_again_and_every_run_completes(
    sqlstate: str, fault_db: str, recorder: RecorderProcess, tmp_path: Path
) -> None:
    times = 3
    node = NodeProc(node_env(fault_db, DUETIME_DATA_DIR=str(tmp_path / "data")), "run", tmp_path / "node.log")
    try:
        url = await node.ready()
        async with owner_on(url, fault_db) as owner:
            # Two runs first, so the fault hits writers that have already written (as it was seen).
            first = whole_second(2)
            warmup = await owner.create_many([one_off(recorder.url + "/ok", first) for _ in range(2)])
            await _inject(fault_db, sqlstate, times)
            due = first + timedelta(seconds=3)
            jobs = await owner.create_many([one_off(recorder.url + "/ok", due) for _ in range(20)])
            jobs += warmup
            await owner.settle(within=90)
            report = await account(owner, recorder, [e for job in jobs for e in expected_for(job)])
            hits = await _hits(fault_db)
            await until(
                lambda: _restarted_or_retried(url),
                within=10,
                what="a retried write counted in /metrics",
            )
        alive = node.alive()
    finally:
        await node.stop()
    print(json.dumps({"scenario": f"history_insert_{sqlstate}", "hits": hits, **report.counts()}))
    assert hits > times, "the trigger refused the history insert and then let it through"
    assert alive, node.tail()
    assert report.ok, report.explain()
    assert report.counts()["delivered"] == 22, report.explain()


async def _restarted_or_retried(url: str) -> bool:
    return await metric(url, "duetime_storage_retries_total") > 0
