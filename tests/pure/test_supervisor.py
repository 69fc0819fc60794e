"""The supervisor: a task that fails is restarted with backoff and counted; one that keeps failing
is reported (so /readyz turns red) until a restarted body runs long enough to count as up."""

from __future__ import annotations

import asyncio

from duetime.supervisor import TASK_RESTARTS, Supervisor, task_kind
from tests.support.wait import until


def _restarts(kind: str) -> float:
    return TASK_RESTARTS.labels(kind)._value.get()  # type: ignore[no-any-return]


async def test_a_failing_body_is_restarted_until_it_returns() -> None:
    sup = Supervisor(min_backoff_s=0.01, max_backoff_s=0.05)
    lives: list[int] = []

    async def body() -> None:
        lives.append(1)
        if len(lives) < 4:
            raise RuntimeError(f"life {len(lives)}")

    before = _restarts("test-returns")
    await asyncio.wait_for(sup.spawn("test-returns-3", body), timeout=10)
    assert len(lives) == 4
    assert _restarts("test-returns") - before == 3
    assert sup.down() == {}


async def test_a_task_down_longer_than_allowed_makes_the_process_not_ready_until_it_is_up() -> None:
    sup = Supervisor(min_backoff_s=0.01, max_backoff_s=0.02, up_after_s=0.3)
    healthy = asyncio.Event()
    stop = asyncio.Event()

    async def body() -> None:
        if not healthy.is_set():
            raise ConnectionError("the database is away")
        await stop.wait()

    task = sup.spawn("test-flaky", body)
    await until(lambda: sup.not_ready(0.2) is not None, within=10, what="the task reported down")
    reason = sup.not_ready(0.2)
    assert reason is not None and "test-flaky" in reason and "the database is away" in reason
    healthy.set()
    await until(lambda: sup.not_ready(0.0) is None, within=10, what="the task up again after running a while")
    stop.set()
    await asyncio.wait_for(task, timeout=10)


async def test_no_restart_once_the_owner_stops() -> None:
    sup = Supervisor(min_backoff_s=0.01)
    lives = 0

    async def body() -> None:
        nonlocal lives
        lives += 1
        raise RuntimeError("failing while stopping")

    await asyncio.wait_for(sup.spawn("test-stopping", body, keep_going=lambda: False), timeout=10)
    assert lives == 1


def test_copies_of_a_task_share_one_label() -> None:
    assert task_kind("duetime-claim-12") == "duetime-claim"
    assert task_kind("duetime-fencer") == "duetime-fencer"
