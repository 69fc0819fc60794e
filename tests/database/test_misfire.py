"""Missed-run policies after an outage: jobs registered while no engine runs, then an engine
starts 10 s later and applies each job's policy to what it missed."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from datetime import UTC, datetime, timedelta

import aiohttp

from duetime.app import Node
from tests.support.node import Owner, fast_settings, parse
from tests.support.receiver import Receiver


async def test_missed_run_policies_after_a_ten_second_outage(pg_dsn: str, receiver: Receiver) -> None:
    api_only = Node(fast_settings(pg_dsn), engine=False, workers=False)
    await api_only.start()
    try:
        await _outage_and_recovery(api_only, pg_dsn, receiver)
    finally:
        await api_only.stop()  # also when an assertion fails: no listening socket left behind


async def _outage_and_recovery(api_only: Node, pg_dsn: str, receiver: Receiver) -> None:
    assert api_only.store is not None and api_only.url is not None
    key, secret = await api_only.store.create_api_key("misfire_" + uuid.uuid4().hex[:6])
    ids: dict[str, str] = {}
    async with aiohttp.ClientSession() as http:
        owner = Owner("m", key, secret, http, api_only.url)
        for policy in ("run_once", "run_all", "skip"):
            job = await owner.create(
                {
                    "target": {"type": "webhook", "url": f"{receiver.url}/{policy}"},
                    "schedule": {"cron": "* * * * * *"},
                    "misfire": policy,
                    "misfire_grace_s": 1,
                }
            )
            ids[policy] = job["id"]
        await asyncio.sleep(10)  # the outage: nothing claims, nothing fires
        engine = Node(fast_settings(pg_dsn), api=False)
        recovered_at = datetime.now(UTC)
        await engine.start()
        try:
            await receiver.wait_for("/run_all", 9, within=30)
            await asyncio.sleep(3)
        finally:
            for job_id in ids.values():
                await owner.call("DELETE", f"/v1/jobs/{job_id}")
            await engine.stop()

        def slots(policy: str) -> list[datetime]:
            return [parse(c.headers["Duetime-Scheduled-For"]) for c in receiver.on(f"/{policy}")]

        once = slots("run_once")
        # run_once: the backlog collapses into one run carrying the most recent missed occurrence,
        # then the schedule goes on second by second
        first_once = once[0]
        assert once[0] >= min(slots("run_all")) + timedelta(seconds=7)  # the latest missed, not the oldest
        assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(once))
        # only the one collapsed run carries an occurrence missed during the outage
        assert sum(1 for s in once if s < recovered_at - timedelta(seconds=2)) <= 1, once
        # run_all: every missed occurrence ran, none twice (all at once: overlap=allow, the
        # default, starts them together, so they arrive in any order)
        every = sorted(slots("run_all"))
        assert len(every) == len(set(every))
        assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(every)), every
        assert every[0] < first_once - timedelta(seconds=7)
        # skip: the missed occurrences are in the history as skipped, not called
        skipped_calls = slots("skip")
        assert all(s >= first_once - timedelta(seconds=2) for s in skipped_calls), (skipped_calls, first_once)
        _, runs = await owner.call("GET", f"/v1/jobs/{ids['skip']}/runs?limit=100")
        outcomes = [r["outcome"] for r in runs["items"]]
        assert outcomes.count("skipped") >= 7, outcomes
