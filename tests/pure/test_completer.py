"""The completer: batches written by two writers at once, and workers held back while too many
outcomes wait to be written."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from duetime.core.model import Outcome
from duetime.core.runpath import AttemptReport, FencedRun, RunSpec, Verdict
from duetime.storage.postgres import CompletionStats
from duetime.workers.pool import Completer

AT = datetime(2026, 12, 1, tzinfo=UTC)


def _report(shard: int = 0) -> AttemptReport:
    run = FencedRun(
        job_id=uuid.uuid4(),
        shard=shard,
        owner="o",
        lease_token=1,
        scheduled_for=AT,
        due_at=AT,
        attempt=1,
        spec=RunSpec("{}", 1),
        run_kind="scheduled",
    )
    return AttemptReport(run, Verdict(Outcome.SUCCEEDED, False), started_at=AT, finished_at=AT)


class _Keeper:
    def settling(self, job_ids: list[uuid.UUID]) -> None:
        pass

    def untrack(self, job_id: uuid.UUID, token: int) -> None:
        pass


class _HeldStore:
    """complete_runs waits until released; records the batches and how many were in flight."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.release = asyncio.Event()
        self.two_in_flight = asyncio.Event()

    def database_of(self, shard: int) -> int:
        return 0

    async def complete_runs(self, batch: list[AttemptReport]) -> CompletionStats:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        if self.in_flight == 2:
            self.two_in_flight.set()
        await self.release.wait()
        self.in_flight -= 1
        self.batches.append(len(batch))
        return CompletionStats(applied=len(batch))


async def test_two_writers_and_room_for_workers_only_below_the_bound() -> None:
    store = _HeldStore()
    completer = Completer(store, _Keeper(), batch=5, writers=2, max_pending=10)  # type: ignore[arg-type]
    completer.start()
    for _ in range(25):
        completer.add(_report())
    await asyncio.wait_for(store.two_in_flight.wait(), timeout=10)  # two batches at once
    assert completer.pending() == 15  # 25 added, two batches of 5 taken
    room = asyncio.create_task(completer.room())
    await asyncio.sleep(0)
    assert not room.done()  # 15 waiting ≥ 10: a worker is held back
    store.release.set()
    await asyncio.wait_for(room, timeout=10)
    await completer.stop()
    assert sum(store.batches) == 25 and max(store.batches) == 5
    assert store.most_in_flight == 2
