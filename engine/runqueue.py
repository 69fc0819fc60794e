"""The queue between "due" and "running".

In one process it is a bounded asyncio queue: when workers fall behind, the fencer blocks on put,
fired entries wait unfenced (their claims still leased), and nothing is dropped. The queue is never
the source of truth: a run lost with a process is recovered from its lease in PostgreSQL.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from engine import metrics
from storage.postgres import FencedRow


class RunQueue(Protocol):
    async def put(self, run: FencedRow) -> None: ...

    async def get(self) -> FencedRow: ...

    def qsize(self) -> int: ...

    def get_nowait(self) -> FencedRow | None: ...


class InProcessRunQueue:
    def __init__(self, maxsize: int = 10_000) -> None:
        self._q: asyncio.Queue[FencedRow] = asyncio.Queue(maxsize)

    async def put(self, run: FencedRow) -> None:
        await self._q.put(run)
        metrics.QUEUE_DEPTH.set(self._q.qsize())

    async def get(self) -> FencedRow:
        run = await self._q.get()
        metrics.QUEUE_DEPTH.set(self._q.qsize())
        return run

    def get_nowait(self) -> FencedRow | None:
        try:
            run = self._q.get_nowait()
        except asyncio.QueueEmpty:
            return None
        metrics.QUEUE_DEPTH.set(self._q.qsize())
        return run

    def qsize(self) -> int:
        return self._q.qsize()
