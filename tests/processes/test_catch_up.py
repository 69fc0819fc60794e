"""Catch-up that catches up, on real processes: `duetime run` stopped with SIGTERM for 10 s and
started again. Every occurrence an every-second job missed starts within 3 s of the restart (all
together under overlap=allow, back to back under skip), none twice, none lost, and the job is on
time afterwards. Before, each missed occurrence started exactly the outage late, one a second, for
good."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.common import free_port
from tests.processes.test_processes import env_for
from tests.support.node import Owner, parse
from tests.support.processes import DuetimeProcess
from tests.support.receiver import Call, Receiver

OUTAGE_S = 10
CATCH_UP_WITHIN = timedelta(seconds=3)


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=2)
    yield s
    await s.close()


def slot(call: Call) -> datetime:
    return parse(call.headers["Duetime-Scheduled-For"])


async def test_run_all_catches_up_after_a_ten_second_stop(
    pg_dsn: str, store: PostgresStore, receiver: Receiver, tmp_path: Path
) -> None:
    port = free_port()
    env = env_for(pg_dsn, port)
    key, secret = await store.create_api_key("catchup_" + uuid.uuid4().hex[:6])
    jobs: dict[str, dict[str, Any]] = {
        "/allow": {"misfire": "run_all"},  # default grace (60 s): late, not missed
        "/allow-grace1": {"misfire": "run_all", "misfire_grace_s": 1},  # missed: run_all applies
        "/skip": {"misfire": "run_all", "misfire_grace_s": 1, "overlap": "skip"},  # back to back
    }
    first = DuetimeProcess("first", env, ["run"], tmp_path).start()
    await first.ready("serving")
    ids: dict[str, str] = {}
    async with aiohttp.ClientSession() as http:
        owner = Owner("c", key, secret, http, f"http://127.0.0.1:{port}")
        try:
            for path, extra in jobs.items():
                job = await owner.create(
                    {
                        "target": {"type": "webhook", "url": f"{receiver.url}{path}"},
                        "schedule": {"cron": "* * * * * *"},
                        **extra,
                    }
                )
                ids[path] = job["id"]
            for path in jobs:
                await receiver.wait_for(path, 2, within=15)
        finally:
            first.signal(signal.SIGTERM)
            assert await first.wait() == 0
        stopped = datetime.now(UTC)
        before = {path: {slot(c) for c in receiver.on(path)} for path in jobs}
        await asyncio.sleep(OUTAGE_S)
        second = DuetimeProcess("second", env, ["run"], tmp_path).start()
        try:
            await second.ready("serving")
            restarted = datetime.now(UTC)
            started = time.monotonic()
            await asyncio.sleep(8)
            assert time.monotonic() - started >= 8
        finally:
            for job_id in ids.values():
                await owner.call("DELETE", f"/v1/jobs/{job_id}")
            second.signal(signal.SIGTERM)
            assert await second.wait() == 0

    for path in jobs:
        calls = receiver.on(path)
        slots = [slot(c) for c in calls]
        assert len(slots) == len(set(slots)), (path, "an occurrence ran twice")
        ordered = sorted(slots)
        # none lost: every second from the first run to the last one is there
        assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(ordered)), (path, ordered)
        missed = [c for c in calls if slot(c) not in before[path] and slot(c) <= restarted]
        assert len(missed) >= OUTAGE_S, (path, len(missed))
        assert min(slot(c) for c in missed) <= stopped + timedelta(seconds=1)
        # every missed occurrence started within 3 s of the restart
        latest_start = max(c.arrived for c in missed)
        assert latest_start - restarted <= CATCH_UP_WITHIN, (path, latest_start - restarted)
        # and the job is on time afterwards: each later occurrence starts within a second of it
        later = [c for c in calls if slot(c) > restarted + CATCH_UP_WITHIN]
        assert len(later) >= 3, (path, len(later))
        lateness = [c.arrived - slot(c) for c in later]
        assert max(lateness) < timedelta(seconds=1), (path, lateness)

    # under skip the catch-up runs never overlapped: each started after the one before it ended
    # (the receiver answers at once, so arrivals of the backlog are strictly ordered by slot)
    backlog = sorted(
        (c for c in receiver.on("/skip") if slot(c) not in before["/skip"] and slot(c) <= restarted),
        key=slot,
    )
    assert [c.arrived for c in backlog] == sorted(c.arrived for c in backlog)
