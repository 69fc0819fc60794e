"""A few worker processes for request work that is CPU-bound: off the event loop, outside its GIL.

Why processes. Schedule previews are pure Python arithmetic. Run on the event loop, each one
holds up every other owner's request and the engine's timers for its whole duration; run in a
thread, it still holds the GIL, and the loop waits up to the interpreter's switch interval (5 ms)
every time it wakes: measured with 8 clients sending 10 ms of such work, another client's GET went
from a 2.6 ms p99 idle to 22.6 ms in a thread and 20.3 ms when the work yields to the loop every
0.5 ms, and the loop's 50 ms timers ran up to 19 ms late; with two worker processes the same GET's
p99 stayed at 4.6 ms and the timers within 3.3 ms (2 shared cores). The workers run at a lower CPU
priority (nice 10), so on a busy machine the node's own loop is served first.

Bounds. At most ``workers`` jobs run at once; at most ``max_waiting`` more wait for a worker, and
one owner may have at most ``per_owner`` running or waiting. Past either bound the request is
refused at once with 429 ``server_busy`` / ``rate_limited`` and a ``Retry-After``, before any work
is done, so a flood costs the loop a refusal per request and never a queue that grows.

Where a process cannot be started (a daemonic parent, a sandbox without ``fork``), the pool falls
back to threads, with the same bounds, and says so once in the log. A worker that dies (killed,
out of memory) breaks the pool; the next request starts a new one.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Final, TypeVar

from duetime.core.errors import RateLimited

log = logging.getLogger("duetime.api")

A = TypeVar("A")
R = TypeVar("R")

WORKER_NICE: Final = 10
RETRY_AFTER_S: Final = 1


def _lower_priority() -> None:
    """In each worker: yield the CPU to the node's own processes when they want it."""
    try:
        os.nice(WORKER_NICE)
    except OSError:  # not permitted here: run at the parent's priority
        pass


class CpuPool:
    """Bounded worker processes for CPU-heavy request work (see the module docstring)."""

    def __init__(self, workers: int, max_waiting: int, per_owner: int, *, processes: bool = True) -> None:
        self._workers = max(workers, 1)
        self._max_waiting = max(max_waiting, 0)
        self._per_owner = max(per_owner, 1)
        self._processes = processes
        self._executor: Executor | None = None
        self._slots = asyncio.Semaphore(self._workers)
        self._admitted = 0  # running or waiting
        self._by_owner: dict[str, int] = {}

    @property
    def workers(self) -> int:
        return self._workers

    def _ensure(self) -> Executor:
        if self._executor is None:
            if self._processes:
                try:
                    self._executor = ProcessPoolExecutor(
                        self._workers,
                        mp_context=multiprocessing.get_context("spawn"),
                        initializer=_lower_priority,
                    )
                except (OSError, AssertionError, ValueError) as exc:
                    log.warning("preview worker processes unavailable (%s); using threads", exc)
                    self._processes = False
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="duetime-cpu")
        return self._executor

    def _admit(self, owner: str) -> None:
        if self._by_owner.get(owner, 0) >= self._per_owner:
            raise RateLimited(
                f"this owner already has {self._per_owner} schedule previews running or waiting on "
                f"this API process; wait for them before sending more",
                retry_after_s=RETRY_AFTER_S,
            )
        if self._admitted >= self._workers + self._max_waiting:
            raise RateLimited(
                "the API process's preview workers are all busy and their queue is full; "
                f"retry after {RETRY_AFTER_S} s",
                retry_after_s=RETRY_AFTER_S,
                code="server_busy",
            )
        self._admitted += 1
        self._by_owner[owner] = self._by_owner.get(owner, 0) + 1

    def _release(self, owner: str) -> None:
        self._admitted -= 1
        left = self._by_owner[owner] - 1
        if left:
            self._by_owner[owner] = left
        else:
            del self._by_owner[owner]

    async def run(self, owner: str, fn: Callable[[A], R], arg: A) -> R:
        """``fn(arg)`` in a worker, for ``owner``; 429 at once when the bounds are reached."""
        self._admit(owner)
        try:
            async with self._slots:
                loop = asyncio.get_running_loop()
                try:
                    return await loop.run_in_executor(self._ensure(), fn, arg)
                except (BrokenProcessPool, RuntimeError) as exc:
                    # A worker died (or the pool could not start one): start afresh, try once more.
                    if isinstance(exc, RuntimeError) and not self._processes:
                        raise
                    log.warning("a preview worker process failed (%r); starting a new pool", exc)
                    self._discard()
                    return await loop.run_in_executor(self._ensure(), fn, arg)
        finally:
            self._release(owner)

    def _discard(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    async def close(self) -> None:
        """Stop the workers (the app's cleanup); a job still running is abandoned."""
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, True, cancel_futures=True)
