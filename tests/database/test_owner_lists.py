"""An owner's lists of every state without an (owner, job_id) index (migration 0011).

``list_jobs`` and ``list_jobs_by_name_prefix`` merge one range of ``jobs_owner_state`` per state
in job id order. Here: the pages come out in job id order across states, with nothing missed or
repeated, and the plan stays a merge of the five ranges in job id order, as the planner plans it
for the values and as the generic plan a prepared statement switches to. The merge's first form
(the five ranges as one union, ordered and limited once) was planned at 100,000 jobs of an owner
as a sort of every matching row, 222 ms for a page of 1,001; each range's own ORDER BY/LIMIT is
what keeps it a merge.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from duetime.core.model import Broker, JobSpec, JobState, OneOffSchedule, QueueTarget
from duetime.storage.bulk import BulkJob, analyze_jobs, seed_jobs
from duetime.storage.postgres import PostgresStore
from duetime.storage.queries import Q
from duetime.storage.shardmap import ShardMap
from tests.support.plans import analyzed

BIG = 10_000  # jobs of the owner whose lists are planned (another owner has three times as many)


def _spec(name: str | None) -> JobSpec:
    at = datetime.now(UTC) + timedelta(days=1)
    return JobSpec(target=QueueTarget(broker=Broker.REDIS, topic="t"), schedule=OneOffSchedule(at), name=name)


@pytest.fixture(scope="module")
async def listed(pg_dsn: str) -> AsyncIterator[str]:
    """``BIG`` jobs of "erin" (a third completed, a sixth paused, the rest scheduled, named
    ``job-<n>``), and three times as many of another owner; analyzed."""
    dsn = pg_dsn
    now = datetime.now(UTC)
    await seed_jobs([dsn] * 16, (BulkJob("erin", _spec(f"job-{i}")) for i in range(BIG)), now)
    await seed_jobs([dsn] * 16, (BulkJob("frank", _spec(None)) for _ in range(3 * BIG)), now)
    conn = await asyncpg.connect(dsn)
    try:
        ids = [r["job_id"] for r in await conn.fetch("SELECT job_id FROM jobs WHERE owner = 'erin'")]
        await conn.execute(
            "UPDATE jobs SET state = 'completed', next_run_at = NULL WHERE job_id = ANY($1::uuid[])", ids[::3]
        )
        await conn.execute("UPDATE jobs SET state = 'paused' WHERE job_id = ANY($1::uuid[])", ids[1::6])
    finally:
        await conn.close()
    await analyze_jobs([dsn])
    yield dsn


def test_the_merge_names_every_state_once() -> None:
    """A state added to the model and not to the lists would be missing from every list."""
    for name in ("list_jobs", "list_jobs_by_name_prefix"):
        for state in JobState:
            assert Q[name].count(f"state = '{state.value}'") == 1, (name, state)


async def test_pages_of_every_state_come_in_job_id_order(listed: str) -> None:
    store = await PostgresStore.open(ShardMap.single(listed), pool_size=2)
    conn = await asyncpg.connect(listed)
    try:
        expected = [
            r["job_id"]
            for r in await conn.fetch("SELECT job_id FROM jobs WHERE owner = 'erin' ORDER BY job_id")
        ]
        seen: list[uuid.UUID] = []
        cursor = None
        while True:
            page = await store.list_jobs("erin", state=None, limit=997, cursor=cursor)
            seen.extend(uuid.UUID(j.id) for j in page.items)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == expected
        states = {j.state for j in (await store.list_jobs("erin", state=None, limit=50, cursor=None)).items}
        assert states == {JobState.SCHEDULED, JobState.PAUSED, JobState.COMPLETED}
        by_prefix = await store.list_jobs("erin", state=None, limit=5000, cursor=None, name_prefix="job-1")
        named = {
            r["job_id"]
            for r in await conn.fetch(
                "SELECT job_id FROM jobs WHERE owner = 'erin' AND spec->>'name' LIKE 'job-1%'"
            )
        }
        assert [uuid.UUID(j.id) for j in by_prefix.items] == sorted(named)[:5000]
        paused = await store.list_jobs(
            "erin", state=JobState.PAUSED, limit=5000, cursor=None, name_prefix="job-1"
        )
        assert paused.items and all(j.state is JobState.PAUSED for j in paused.items)
    finally:
        await conn.close()
        await store.close()


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("list_jobs", ("erin", uuid.UUID(int=0), 101)),
        ("list_jobs", ("erin", uuid.UUID(int=0), 1001)),
        ("list_jobs_by_name_prefix", ("erin", "job-", uuid.UUID(int=0), None, 101)),
        ("list_jobs_by_name_prefix", ("erin", "job-", uuid.UUID(int=0), "paused", 101)),
    ],
)
async def test_a_page_reads_about_as_many_rows_as_it_lists(
    listed: str, name: str, args: tuple[Any, ...]
) -> None:
    limit = args[-1]
    conn = await asyncpg.connect(listed)
    try:
        plans = await analyzed(conn, Q[name], *args)
    finally:
        await conn.close()
    for mode, nodes in zip(("custom", "generic"), plans, strict=True):
        kinds = [n["Node Type"] for n in nodes]
        # The branches merged in job id order (the first form sorted the union of every
        # matching row), and no branch reads the table whole.
        assert kinds[:2] == ["Limit", "Merge Append"], (mode, kinds)
        assert "Seq Scan" not in kinds, (mode, kinds)
        assert nodes[0]["Actual Rows"] == limit
        scans = [n for n in nodes if n["Node Type"] in ("Index Scan", "Bitmap Heap Scan")]
        assert scans, (mode, kinds)
