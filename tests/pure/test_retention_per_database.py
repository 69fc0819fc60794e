"""Retention with one of two databases away: the other is swept in the same round, the away one
is counted skipped and tried again next round (before, the round ended at the first failing
database, and the ones after it were never swept while it stayed away)."""

from __future__ import annotations

from datetime import datetime

from duetime.core.errors import StorageUnavailable
from duetime.engine.retention import RetentionConfig, RetentionService
from duetime.storage.ports import FinishedJobsSweep, HistorySweep


class _Store:
    def __init__(self) -> None:
        self.down = {"a"}
        self.swept: list[str] = []

    def databases(self) -> list[str]:
        return ["a", "b"]

    async def delete_old_runs(
        self, dsn: str, *, before: datetime, limit: int, after: int = 0
    ) -> HistorySweep | None:
        if dsn in self.down:
            raise StorageUnavailable("the job database is unavailable right now")
        self.swept.append(dsn)
        return HistorySweep(deleted=0, walked=None)

    async def delete_finished_jobs(
        self, dsn: str, *, before: datetime, limit: int
    ) -> FinishedJobsSweep | None:
        if dsn in self.down:
            raise StorageUnavailable("the job database is unavailable right now")
        return FinishedJobsSweep(jobs=0, history=0)

    async def purge_target_health(self, *, older_than_s: float) -> int:
        if "a" in self.down:  # the home database
            raise StorageUnavailable("the job database is unavailable right now")
        return 0


async def test_a_database_away_is_skipped_and_the_others_swept() -> None:
    store = _Store()
    service = RetentionService(store, RetentionConfig(pause_s=0))
    report = await service.run_round()
    assert store.swept == ["b"] and report.skipped_databases == 1
    store.down = set()
    report = await service.run_round()
    assert store.swept == ["b", "a", "b"] and report.skipped_databases == 0
