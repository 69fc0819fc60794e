"""A small loop that samples each shard's oldest unclaimed due row into a gauge.

Every engine samples every shard it may serve, not only those it holds right now: a shard that
no engine holds is exactly the case the lateness histograms miss, and several engines reporting
the same shard agree (read it with ``max by (shard)``). The loop is separate from the claim path
and the janitor, so a slow reading never delays a claim, and a failed one only logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from duetime.runqueue.metrics import OLDEST_UNCLAIMED_DUE
from duetime.storage.ports import DueAge, DueBacklog
from duetime.supervisor import SUPERVISOR

log = logging.getLogger("duetime.engine")


class DueAgeSampler:
    """Reads the backlog of ``shards`` from ``store`` (the ``DueAge`` port) every ``interval_s``
    seconds until stopped."""

    def __init__(self, store: DueAge, shards: Iterable[int], *, interval_s: float) -> None:
        self._store = store
        self._shards = tuple(sorted(shards))
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def start(self) -> None:
        self._task = SUPERVISOR.spawn("duetime-due-age", self._loop)

    async def sample(self) -> list[DueBacklog]:
        readings = await self._store.oldest_unclaimed_due(self._shards)
        for reading in readings:
            OLDEST_UNCLAIMED_DUE.labels(str(reading.shard)).set(reading.oldest_age_s)
        return readings

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.sample()
            except Exception as exc:
                log.warning("reading the oldest unclaimed due rows failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=self._interval_s)

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
