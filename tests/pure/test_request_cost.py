"""Heavy request work is bounded where it runs and paid for by its owner (issue 32, item 3).

``api.cpupool`` runs it in worker processes with bounded queues (429 at once past them), and
``api.limits`` charges what a request cost against its owner's rate, so an expensive request is
worth many cheap ones.
"""

from __future__ import annotations

import asyncio
import os
import threading
from datetime import UTC, datetime

import pytest

from duetime.api.cpupool import CpuPool
from duetime.api.limits import STEPS_PER_TOKEN, OwnerRateLimiter, RefusalHolds, RequestCost
from duetime.core.errors import RateLimited
from duetime.core.model import CronSchedule
from duetime.core.preview import PreviewJob, run_preview
from duetime.core.workbudget import WorkBudget


def test_an_expensive_request_takes_its_cost_from_the_owners_bucket() -> None:
    now = [0.0]
    limiter = OwnerRateLimiter(10.0, 20.0, clock=lambda: now[0])
    limiter.check("heavy")  # admitted with one token
    limiter.charge("heavy", 99.0)  # then its cost: 100 tokens in all, 80 more than the bucket held
    with pytest.raises(RateLimited) as refused:
        limiter.check("heavy")
    assert refused.value.retry_after_s == 9  # (1 - (-80)) tokens at 10 a second
    limiter.check("light")  # another owner's bucket is its own
    now[0] += 8.2
    limiter.check("heavy")  # the debt repaid, one token back


def test_a_request_cost_counts_search_steps_and_other_work_in_tokens() -> None:
    cost = RequestCost(work=WorkBudget())
    cost.work.spend(5 * STEPS_PER_TOKEN)
    cost.tokens += 2.5
    assert cost.total_tokens() == pytest.approx(7.5)


async def test_the_pool_refuses_at_once_past_its_bounds() -> None:
    release = threading.Event()
    pool = CpuPool(workers=1, max_waiting=1, per_owner=2, processes=False)
    try:
        first = asyncio.create_task(pool.run("a", release.wait, 30.0))
        second = asyncio.create_task(pool.run("a", release.wait, 30.0))  # waits for the worker
        await asyncio.sleep(0.05)
        with pytest.raises(RateLimited) as own_share:
            await pool.run("a", release.wait, 30.0)
        assert own_share.value.code == "rate_limited"  # the owner's share of the queue is used
        with pytest.raises(RateLimited) as busy:
            await pool.run("b", release.wait, 30.0)
        assert busy.value.code == "server_busy" and busy.value.retry_after_s >= 1
        release.set()
        assert await first and await second
        assert await pool.run("b", release.wait, 30.0)  # room again
    finally:
        release.set()
        await pool.close()


def _priority(_: object) -> int:
    return os.nice(0)


def _pid(_: object) -> int:
    return os.getpid()


async def test_previews_run_in_worker_processes_at_a_lower_priority() -> None:
    pool = CpuPool(workers=1, max_waiting=4, per_owner=4)
    try:
        start = datetime(2026, 3, 27, tzinfo=UTC)
        work = PreviewJob(CronSchedule("30 2 * * *", "Europe/Berlin"), start, 3)
        answer = await pool.run("a", run_preview, work)
        assert answer.body is not None and len(answer.body["items"]) == 3
        assert answer.body["items"][2]["dst"] == "gap_shifted" and answer.steps > 0
        assert await pool.run("a", _priority, None) >= os.nice(0) + 10
        assert await pool.run("a", _pid, None) != os.getpid()
    finally:
        await pool.close()


def test_a_client_that_ignores_retry_after_has_its_refusals_held() -> None:
    """Answering 429s back to back was itself a flood (11,000 refusals in 8 s from 8 clients in
    the benchmark; 52,000 in 30 s with the rate limit off, from the preview queue's bounds): past
    a few refusals within a second each further one is held a second."""
    now = [0.0]
    holds = RefusalHolds(per_owner=2, clock=lambda: now[0])
    seen = [holds.hold_for("flooder") for _ in range(8)]
    assert seen[:5] == [0.0] * 5 and seen[5:] == [1.0] * 3
    now[0] += 1.5  # a client that waited as asked starts afresh
    assert holds.hold_for("flooder") == 0.0
    assert holds.hold_for("polite") == 0.0


async def test_held_refusals_are_bounded_per_owner() -> None:
    holds = RefusalHolds(per_owner=2)
    for _ in range(5):
        assert holds.hold_for("flooder") == 0.0
    started = asyncio.get_running_loop().time()
    waits = [asyncio.create_task(holds.hold("flooder")) for _ in range(4)]
    await asyncio.gather(*waits)
    assert asyncio.get_running_loop().time() - started < 1.9  # two held (1 s), two answered at once
    # none held now; a second has passed, so the count starts again: a burst is held again
    assert [holds.hold_for("flooder") for _ in range(6)] == [0.0] * 5 + [1.0]


async def test_holds_keep_working_window_after_window() -> None:
    """The count of 429s being held outlives the one-second windows: a new window once got a
    new record, a 429 held across the change counted down the old one, and after a few windows
    every 429 went out at once (22,000 of them in the benchmark's 30 s)."""
    now = [0.0]
    holds = RefusalHolds(per_owner=3, clock=lambda: now[0])
    for window in range(8):
        seen = [holds.hold_for("flooder") for _ in range(6)]
        assert seen[-1] == 1.0, f"window {window}: not held"
        held = asyncio.create_task(holds.hold("flooder"))
        await asyncio.sleep(0)  # it is being held now
        now[0] += 1.5
        holds.hold_for("flooder")  # a refusal in the next window, while that one is still held
        held.cancel()
        with pytest.raises(asyncio.CancelledError):
            await held
