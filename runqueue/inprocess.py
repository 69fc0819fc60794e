"""The queue between "due" and "running".

In one process it is a bounded asyncio queue: when workers fall behind, the fencer blocks on put,
fired entries wait unfenced (their claims still leased), and nothing is dropped. The queue is never
the source of truth: a run lost with a process is recovered from its lease in PostgreSQL.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol

from duetime.core.runpath import FencedRun
from duetime.runqueue import metrics


class RunQueue(Protocol):
    async def put(self, run: FencedRun) -> None: ...

    async def get(self) -> FencedRun: ...

    def qsize(self) -> int: ...

    def get_nowait(self) -> FencedRun | None: ...


class InProcessRunQueue:
    """A bounded queue with one lane per owner; ``get`` takes the lanes in turn.

    FIFO within an owner, round-robin across owners: when owner A's burst fills the queue, owner
    B's run waits behind one of A's, not behind all of them. Waiters are woken one at a time (a
    future each, as ``asyncio.Queue`` does), so a thousand idle workers cost nothing per put.
    """

    def __init__(self, maxsize: int = 10_000) -> None:
        self._maxsize = maxsize
        self._lanes: dict[str, deque[FencedRun]] = {}
        self._ring: deque[str] = deque()
        self._size = 0
        self._getters: deque[asyncio.Future[None]] = deque()
        self._putters: deque[asyncio.Future[None]] = deque()

    @staticmethod
    def _wake_one(waiters: deque[asyncio.Future[None]]) -> None:
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def put_nowait(self, run: FencedRun) -> None:
        """Put without waiting; raises ``asyncio.QueueFull`` when the queue is at its bound."""
        if self._size >= self._maxsize:
            raise asyncio.QueueFull
        self._append(run)

    async def put(self, run: FencedRun) -> None:
        while self._size >= self._maxsize:
            fut = asyncio.get_running_loop().create_future()
            self._putters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                fut.cancel()
                if self._size < self._maxsize:
                    self._wake_one(self._putters)
                raise
        self._append(run)

    def _append(self, run: FencedRun) -> None:
        lane = self._lanes.get(run.owner)
        if lane is None:
            lane = self._lanes[run.owner] = deque()
            self._ring.append(run.owner)
        lane.append(run)
        self._size += 1
        metrics.QUEUE_DEPTH.set(self._size)
        self._wake_one(self._getters)

    async def get(self) -> FencedRun:
        while not self._size:
            fut = asyncio.get_running_loop().create_future()
            self._getters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                fut.cancel()
                if self.qsize():  # pass the wake-up on: another getter can take the run
                    self._wake_one(self._getters)
                raise
        run = self._pop()
        self._wake_one(self._putters)
        return run

    def _pop(self) -> FencedRun:
        owner = self._ring.popleft()
        lane = self._lanes[owner]
        run = lane.popleft()
        if lane:
            self._ring.append(owner)
        else:
            del self._lanes[owner]
        self._size -= 1
        metrics.QUEUE_DEPTH.set(self._size)
        return run

    def get_nowait(self) -> FencedRun | None:
        if not self._size:
            return None
        run = self._pop()
        self._wake_one(self._putters)
        return run

    def take_while(self, accept: Callable[[FencedRun], bool], limit: int) -> list[FencedRun]:
        """Up to ``limit`` more runs without waiting, in the order ``get`` would give them, as
        long as each next one is ``accept``-ed (the first one that is not stays queued)."""
        out: list[FencedRun] = []
        while self._size and len(out) < limit and accept(self._lanes[self._ring[0]][0]):
            out.append(self._pop())
        for _ in out:
            if not self._putters:
                break
            self._wake_one(self._putters)
        return out

    def qsize(self) -> int:
        return self._size
