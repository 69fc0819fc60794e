"""The completer under database errors that are not outages: a deadlock or a timeout is written
again (never the end of the writer), one database's trouble does not hold back another's reports,
and a report the database refuses for a reason of its own is given up alone, so the rest of its
batch is recorded."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import pytest

from duetime.core.errors import Contended, StorageUnavailable
from duetime.core.runpath import AttemptReport
from duetime.storage.ports import CompletionStats
from duetime.workers.pool import Completer
from tests.pure.test_completer import _report
from tests.support.wait import until

AT = datetime(2026, 12, 1, tzinfo=UTC)


class _Keeper:
    def __init__(self) -> None:
        self.untracked: set[uuid.UUID] = set()

    def settling(self, job_ids: list[uuid.UUID]) -> None:
        pass

    def untrack(self, job_id: uuid.UUID, token: int) -> None:
        self.untracked.add(job_id)


class _Store:
    """Even shards on database 0, odd ones on database 1. ``fail`` decides, per call, what a
    database answers: an exception to raise, or None to write."""

    def __init__(self) -> None:
        self.written: list[uuid.UUID] = []
        self.calls = 0
        self.down: set[int] = set()
        self.transient: list[Exception] = []
        self.poison: set[uuid.UUID] = set()

    def database_of(self, shard: int) -> int:
        return shard % 2

    async def complete_runs(self, reports: Sequence[AttemptReport]) -> CompletionStats:
        self.calls += 1
        if {r.shard % 2 for r in reports} & self.down:
            raise StorageUnavailable("the job database is unavailable right now")
        if self.transient:
            raise self.transient.pop(0)
        if any(r.job_id in self.poison for r in reports):
            raise ValueError("a value the database refuses")  # e.g. a DataError, untranslated
        self.written.extend(r.job_id for r in reports)
        return CompletionStats(applied=len(reports))


# Made anew for each raise: an exception kept at module level would keep its last traceback, and
# with it the reports of the frames it went through, alive for the tests that count live objects.
@pytest.mark.parametrize(
    "error",
    [
        lambda: Contended("gave way to a concurrent change"),
        lambda: StorageUnavailable("statement timeout"),
        lambda: ConnectionResetError("lost"),
    ],
)
async def test_a_transient_error_is_written_again_not_the_end_of_the_writer(
    error: Callable[[], Exception],
) -> None:
    store, keeper = _Store(), _Keeper()
    store.transient = [error(), error(), error()]
    completer = Completer(store, keeper, batch=10, writers=1)  # type: ignore[arg-type]
    completer.start()
    reports = [_report() for _ in range(5)]
    for r in reports:
        completer.add(r)
    await until(lambda: len(store.written) == 5, within=20, what="every report written after three errors")
    later = _report()
    completer.add(later)  # the writer is still there for what comes after
    await until(lambda: later.job_id in store.written, within=10, what="a later report written")
    await completer.stop()
    assert sorted(store.written) == sorted([r.job_id for r in reports] + [later.job_id])
    assert keeper.untracked == set(store.written)


async def test_one_database_down_holds_back_only_its_own_reports() -> None:
    store, keeper = _Store(), _Keeper()
    store.down = {1}
    completer = Completer(store, keeper, batch=100, writers=1)  # type: ignore[arg-type]
    completer.start()
    healthy = [_report(shard=2) for _ in range(10)]
    held = [_report(shard=3) for _ in range(10)]
    for r in [x for pair in zip(healthy, held, strict=True) for x in pair]:
        completer.add(r)
    await until(lambda: len(store.written) == 10, within=10, what="the healthy database's reports")
    assert set(store.written) == {r.job_id for r in healthy}
    assert completer.pending() == 10, "the down database's reports wait in the buffer, none dropped"
    store.down = set()
    await until(lambda: len(store.written) == 20, within=20, what="the rest once the database is back")
    await completer.stop()
    assert set(store.written) == {r.job_id for r in healthy + held}


async def test_a_report_the_database_refuses_is_given_up_alone() -> None:
    store, keeper = _Store(), _Keeper()
    reports = [_report() for _ in range(16)]
    bad = reports[5]
    store.poison = {bad.job_id}
    completer = Completer(store, keeper, batch=100, writers=1)  # type: ignore[arg-type]
    completer.start()
    for r in reports:
        completer.add(r)
    await until(lambda: len(store.written) == 15, within=10, what="the other 15 reports")
    await completer.stop()
    assert bad.job_id not in store.written
    assert bad.job_id in keeper.untracked, "its lease is let go, to lapse and be expired"
    assert completer.pending() == 0
    assert store.calls <= 1 + 2 * 4 + 1, "halving finds it in a few writes, not one per report"


async def test_a_writer_that_fails_on_a_bug_is_restarted_and_loses_nothing() -> None:
    store, keeper = _Store(), _Keeper()
    broken = {"yes": True}

    def database_of(shard: int) -> int:
        if broken["yes"]:
            broken["yes"] = False
            raise RuntimeError("a bug in the writer")
        return 0

    store.database_of = database_of  # type: ignore[method-assign]
    completer = Completer(store, keeper, batch=10, writers=1)  # type: ignore[arg-type]
    completer.start()
    reports = [_report() for _ in range(3)]
    for r in reports:
        completer.add(r)
    await until(lambda: len(store.written) == 3, within=10, what="the batch written after the restart")
    await completer.stop()
    await asyncio.sleep(0)
    assert sorted(store.written) == sorted(r.job_id for r in reports)
