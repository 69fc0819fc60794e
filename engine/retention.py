"""The maintenance service: run history and finished jobs do not grow forever.

Every ``interval_s`` it deletes, on each database, run history older than
``DUETIME_RUN_RETENTION_S`` and jobs that have been completed, cancelled or dead for longer than
``DUETIME_FINISHED_JOB_RETENTION_S`` (with their history and Idempotency-Keys), ``batch`` rows
per statement, each statement its own short transaction, with a pause between batches: a clean-up
of millions of rows is many small deletes that the run path's claims and completions pass
between, never one long one. ``0`` keeps that kind forever. Each round also deletes the target
health reports of workers that stopped over an hour ago (``storage.target_rules.PURGE_S``): a
running worker deletes its own stale reports, but one that never comes back (a pod of an earlier
deployment) would leave its rows for good.

It runs beside every engine, on the ``Retention`` port (storage/ports.py); a try-lock per
database and batch (see the PostgreSQL store's part) makes one of them do the work and lets the
others skip. The clock is injected so tests can age rows
without waiting, and the cut-offs it computes are passed to the database as values.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from prometheus_client import Counter, Histogram

from duetime.core.errors import DuetimeError, is_transient
from duetime.storage.dbclock import DB_CLOCK
from duetime.storage.ports import Retention
from duetime.storage.target_rules import PURGE_S
from duetime.supervisor import SUPERVISOR

log = logging.getLogger("duetime.retention")

DELETED = Counter(
    "duetime_retention_deleted_total",
    "Rows the maintenance service deleted: kind=runs (history), jobs (finished jobs)",
    ["kind"],
)
ROUND_SECONDS = Histogram(
    "duetime_retention_round_seconds",
    "How long one maintenance round took (every database, until nothing old was left)",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800),
)


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    run_retention_s: int = 2_592_000
    finished_job_retention_s: int = 2_592_000
    batch: int = 1000
    interval_s: float = 60.0
    pause_s: float = 0.05

    @property
    def enabled(self) -> bool:
        """Whether history or finished jobs are deleted (the rounds run either way: see ``start``)."""
        return self.run_retention_s > 0 or self.finished_job_retention_s > 0


@dataclass(slots=True)
class RoundReport:
    runs: int = 0
    jobs: int = 0
    skipped_databases: int = 0  # another process held the database's maintenance lock
    target_reports: int = 0  # target health reports of workers long gone


def _wall_clock() -> datetime:
    """The database's clock (storage.dbclock): what is old is decided by it, as the rows' times are."""
    return DB_CLOCK.now()


class RetentionService:
    """Deletes what retention says is old; ``run_round`` is one pass, ``start`` loops it."""

    def __init__(
        self,
        store: Retention,
        config: RetentionConfig,
        *,
        clock: Callable[[], datetime] = _wall_clock,
    ) -> None:
        self._store = store
        self._config = config
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def run_round(self) -> RoundReport:
        """Delete, database by database and batch by batch, until nothing old is left."""
        cfg = self._config
        report = RoundReport()
        started = time.perf_counter()
        for dsn in self._store.databases():
            if self._stopping.is_set():
                break
            try:
                if cfg.finished_job_retention_s > 0 and not await self._jobs(dsn, report):
                    report.skipped_databases += 1
                    continue
                if cfg.run_retention_s > 0 and not await self._runs(dsn, report):
                    report.skipped_databases += 1
            except Exception as exc:
                # One database's trouble: the others are swept this round all the same.
                if not is_transient(exc):
                    raise
                log.warning("retention skipped %s this round: %s", dsn.split("@")[-1], exc)
                report.skipped_databases += 1
        if not self._stopping.is_set():
            await self._target_reports(report)
        ROUND_SECONDS.observe(time.perf_counter() - started)
        return report

    async def _target_reports(self, report: RoundReport) -> None:
        """One statement on the home database, whatever the settings of history and jobs: the
        reports are the workers' working data, not the owners' records those settings keep."""
        try:
            report.target_reports = await self._store.purge_target_health(older_than_s=PURGE_S)
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning("retention skipped the target health reports this round: %s", exc)

    async def _jobs(self, dsn: str, report: RoundReport) -> bool:
        cfg = self._config
        before = self._clock() - timedelta(seconds=cfg.finished_job_retention_s)
        while not self._stopping.is_set():
            sweep = await self._store.delete_finished_jobs(dsn, before=before, limit=cfg.batch)
            if sweep is None:
                return False
            report.jobs += sweep.jobs
            report.runs += sweep.history
            DELETED.labels("jobs").inc(sweep.jobs)
            DELETED.labels("runs").inc(sweep.history)
            if sweep.jobs < cfg.batch:
                return True
            await self._pause()
        return True

    async def _runs(self, dsn: str, report: RoundReport) -> bool:
        cfg = self._config
        before = self._clock() - timedelta(seconds=cfg.run_retention_s)
        after = 0  # each batch starts where the last one stopped walking (docs/operations.md)
        while not self._stopping.is_set():
            sweep = await self._store.delete_old_runs(dsn, before=before, limit=cfg.batch, after=after)
            if sweep is None:
                return False
            report.runs += sweep.deleted
            DELETED.labels("runs").inc(sweep.deleted)
            if sweep.deleted == 0 or sweep.walked is None:
                return True
            after = sweep.walked
            await self._pause()
        return True

    async def _pause(self) -> None:
        if self._config.pause_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=self._config.pause_s)

    def start(self) -> None:
        """Loop the rounds; also with history and jobs kept forever, for the target reports."""
        if self._task is None:
            self._task = SUPERVISOR.spawn("duetime-retention", self._loop)

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                report = await self.run_round()
                if report.runs or report.jobs:
                    log.info(
                        "retention deleted %d history rows and %d finished jobs", report.runs, report.jobs
                    )
                if report.target_reports:
                    log.info(
                        "retention deleted %d target health reports of workers gone for an hour",
                        report.target_reports,
                    )
            except DuetimeError as exc:
                log.warning("retention round failed, the next one retries: %s", exc)
            except Exception:
                log.exception("retention round failed; the next one retries")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=self._config.interval_s)
