"""The insert batcher: concurrent creates on one database become multi-row INSERTs."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from duetime.storage.postgres.pools import translated
from duetime.storage.queries import Q


class InsertBatcher:
    """Coalesces concurrent creates on one database into multi-row INSERTs.

    Registering thousands of jobs a second one statement each spends most of the API's time in
    round trips and commits. Each create joins the pending list; up to ``max_inflight`` writers
    take everything pending (at most ``max_rows``) into one statement, so a burst of POSTs costs a
    few statements and commits. A caller's answer waits for its own row's commit: nothing is
    acknowledged before it is durable. Writers run as their own tasks, so a client that hangs up
    cannot cancel a statement that carries other clients' rows.
    """

    def __init__(self, pool: asyncpg.Pool, *, max_rows: int = 500, max_inflight: int = 4) -> None:
        self._pool = pool
        self._max_rows = max_rows
        self._max_inflight = max_inflight
        self._pending: list[tuple[tuple[Any, ...], asyncio.Future[None]]] = []
        self._running = 0
        self._writers: set[asyncio.Task[None]] = set()

    async def insert(self, args: tuple[Any, ...]) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._pending.append((args, fut))
        if self._running < self._max_inflight:
            self._running += 1
            writer = loop.create_task(self._drain())
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)
        await fut

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch = self._pending[: self._max_rows]
                del self._pending[: len(batch)]
                cols = list(zip(*(a for a, _ in batch), strict=True))
                try:
                    async with translated():
                        await self._pool.execute(Q["insert_jobs"], *[list(c) for c in cols])
                except BaseException as exc:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                else:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_result(None)
        finally:
            self._running -= 1
