"""Watching a statement wait for a row lock, for the tests that check in which order the run
path's and the owners' statements lock rows: which other rows it holds while it waits tells
whether it locks in id order (holding nothing above the awaited row) or not."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from typing import Any

import asyncpg


async def wait_until_blocked(probe: asyncpg.Connection, task: asyncio.Future[Any]) -> None:
    """Return once some other session waits for a row lock (or ``task`` ended): no wall-clock
    margin, the lock table says when the statement under test waits."""
    for _ in range(600):
        waiting = await probe.fetchval(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
            " AND pid <> pg_backend_pid() AND database IS NULL"
        )
        if waiting or task.done():
            return
        await asyncio.sleep(0.05)


async def rows_held(probe: asyncpg.Connection, ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
    """The rows of ``ids`` that another transaction holds locked now (each probed with NOWAIT)."""
    held = []
    for job_id in ids:
        try:
            async with probe.transaction():
                await probe.execute("SELECT 1 FROM jobs WHERE job_id = $1 FOR UPDATE NOWAIT", job_id)
        except asyncpg.exceptions.LockNotAvailableError:
            held.append(job_id)
    return held
