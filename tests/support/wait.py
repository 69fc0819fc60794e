"""Waiting for what a test asserts, within a bound: one helper for every poll of state that another
task, process or server brings about later (JetStream's ack counts, Prometheus counters fed by a
loop, ``pg_stat_*`` views, a log line another process writes). A test that reads such state once,
right after causing it, passes or fails by luck; this reads it until it holds or the bound runs
out, and then fails saying what it waited for and what it last saw."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def until(
    check: Callable[[], Awaitable[bool] | bool], *, within: float, what: str, every: float = 0.05
) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(every)


async def settles(
    read: Callable[[], Awaitable[T]], want: T, *, within: float, what: str, every: float = 0.05
) -> T:
    """Read ``read()`` until it equals ``want``; fail with the last value seen after ``within`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        got = await read()
        if got == want:
            return got
        if loop.time() >= deadline:
            raise AssertionError(f"{what}: still {got!r} after {within:g} s, wanted {want!r}")
        await asyncio.sleep(every)
