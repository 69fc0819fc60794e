"""After a burst drains, a node keeps none of its runs: the engine over the in-memory store, the
worker pool on its Redis batch path (a stub broker), and a thousand workers.

Each idle worker used to keep the runs, reports and batch of its last iteration alive in its
coroutine's frame while it waited for the next run: up to 500 fenced runs (spec, parsed spec,
deliveries, reports) per worker, a thousand workers, so half a million runs of a node after a
million-run burst, never freed (issue 16: RSS 1.25 GB per node). The fencer's last batch and each
completion writer's last batch were kept the same way."""

from __future__ import annotations

import asyncio
import gc

from duetime.core.runpath import AttemptReport, FencedRun
from duetime.storage.memory import MemoryStore
from tests.support.memory_burst import burst_node, recorded, running

RUNS = 3000


def _alive(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, kind))


async def test_no_run_or_report_stays_alive_once_a_burst_is_recorded() -> None:
    async with running(await burst_node(MemoryStore(), RUNS)) as node:
        await recorded(node, RUNS, poll_s=0.1, timeout_s=60)
        async with asyncio.timeout(10):
            while len(node.keeper):  # noqa: ASYNC110 - the last batch's leases go once it is recorded
                await asyncio.sleep(0.05)
        assert not node.queue.qsize()
        assert _alive(FencedRun) == 0, "fenced runs kept alive after their outcomes were recorded"
        assert _alive(AttemptReport) == 0, "reports kept alive after they were recorded"
