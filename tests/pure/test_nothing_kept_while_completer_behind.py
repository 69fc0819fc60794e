"""While the completer is behind, a node keeps alive only the runs some stage still holds: the
engine over the in-memory store, the worker pool on its Redis batch path (a stub broker), a
completer slower than the target, and a thousand workers.

A worker hands its batch's reports to the completer and then waits for the completer's room.
It used to wait inside the method whose frame named the batch (runs, deliveries, reports): once
the completer had recorded them, no stage counted those runs, yet each parked worker kept its
500 alive. While the completer is behind, its room stays shut until every worker has parked, so
up to 1,024 batches of 500 recorded runs per node were alive at once (issue 16: 717 MB of live
objects per node at a million runs, 1.6 KB per run handled, freed only when the drain ended)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence

from duetime.core.runpath import AttemptReport, FencedRun, FenceItem
from duetime.storage.memory import MemoryStore
from duetime.storage.ports import CompletionStats
from tests.support.memory_burst import burst_node, recorded, running

RUNS = 4_000


class _SlowCompletions(MemoryStore):
    """Outcomes take a while to record: the completer falls behind a fast target, as it does
    at a million-run burst when the database is the bottleneck."""

    async def complete_runs(self, reports: Sequence[AttemptReport]) -> CompletionStats:
        await asyncio.sleep(0.25)
        return await super().complete_runs(reports)


def _alive_runs() -> int:
    return sum(1 for o in gc.get_objects() if type(o) is FencedRun)


async def test_recorded_runs_are_not_kept_by_workers_waiting_for_the_completer() -> None:
    node = await burst_node(_SlowCompletions(), RUNS)
    node.pool.completer._batch = 50  # a completer far slower than the fencer and the target
    node.pool.completer._max_pending = 1000
    # Every fenced run not yet recorded is tracked by the lease keeper (from its fence to its
    # recording); a run alive beyond those is one no stage holds.
    untracked = [0]
    async with running(node):
        await recorded(
            node,
            RUNS,
            poll_s=0.25,
            timeout_s=90,
            sample=lambda: untracked.append(_alive_runs() - len(node.keeper)),
        )
    assert max(untracked) < 250, f"{max(untracked)} recorded runs kept alive during the drain"


class _PacedFencesSlowCompletions(_SlowCompletions):
    """The fencer hands over a batch every 50 ms (faster than outcomes are recorded, slower than
    the target takes them): workers wait for runs, as at a million-run burst once fences got
    cheap (migration 0010)."""

    async def fence_runs(self, items: Sequence[FenceItem], *, lease_s: float) -> list[FencedRun]:
        await asyncio.sleep(0.05)
        return await super().fence_runs(items, lease_s=lease_s)


async def test_the_completers_room_holds_back_workers_that_were_waiting_for_a_run() -> None:
    """Outcomes waiting to be recorded stay within the completer's bound plus what is in flight.

    A worker checked the completer's room after handing over its outcomes, and then waited for
    its next run. When the target was faster than the fencer, every worker was waiting for a run,
    having passed the room while it was open, and each then took a batch (up to 500 runs) and
    handed over its outcomes however far behind the completer was: at a million-run burst,
    53,000-60,000 outcomes waited per node against a bound of 5,000 (pymalloc arenas of 159-188
    MB, RSS 3.1-3.6x idle after the drain). Runs are now taken by one worker at a time, which
    checks the room again once it has a run (``WorkerPool._take``).
    """
    runs = 10_000
    node = await burst_node(_PacedFencesSlowCompletions(), runs)
    completer = node.pool.completer
    completer._batch = 100
    completer._max_pending = 1000
    pending = [0]
    async with running(node):
        await recorded(
            node, runs, poll_s=0.01, timeout_s=90, sample=lambda: pending.append(completer.pending())
        )
    most = max(pending)
    # The bound, plus what was in flight when it shut (the pool's concurrency at most); 9,000
    # of the 10,000 runs before the change, growing with the burst.
    assert most <= 1000 + 1024, f"{most} outcomes waited for the completer (bound 1,000)"
