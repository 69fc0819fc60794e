"""The failure events' outbox (core/failures.py): the rows the completion writer inserted,
claimed by the delivery service with SKIP LOCKED and a lease, settled in batches (one statement
per kind of write and database)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from duetime.core import codec
from duetime.core.errors import StorageUnavailable
from duetime.storage.ports import EventSettlement, OutboxEvent
from duetime.storage.postgres.pools import StoreBase, translated
from duetime.storage.queries import Q

log = logging.getLogger(__name__)


def _count(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1])


class EventsPart(StoreBase):
    """``EventOutbox`` of ``PostgresStore``."""

    async def claim_events(self, *, limit: int, lease_s: float) -> list[OutboxEvent]:
        """Database by database: one that cannot be read holds back only its own events (those
        claimed from the others are returned); the error is raised when none could be read."""
        claimed: list[OutboxEvent] = []
        failed: Exception | None = None
        tried = failures = 0
        for dsn, pool in self._pools.items():
            room = limit - len(claimed)
            if room <= 0:
                break
            tried += 1
            try:
                async with translated():
                    rows = await pool.fetch(Q["claim_failure_events"], room, lease_s)
            except StorageUnavailable as exc:
                log.warning("failure events of %s cannot be claimed now: %s", dsn.split("@")[-1], exc)
                failed, failures = exc, failures + 1
                continue
            for r in rows:
                claimed.append(
                    OutboxEvent(
                        seq=r["event_seq"],
                        database=dsn,
                        event_id=r["event_id"],
                        kind=r["type"],
                        job_id=r["job_id"],
                        owner=r["owner"],
                        scheduled_for=r["scheduled_for"],
                        fencing_token=r["fencing_token"],
                        target=codec.target_from_json(r["target"]),
                        body=r["body"],
                        attempts=r["attempts"],
                    )
                )
        if failed is not None and failures == tried:
            raise failed
        return claimed

    async def settle_events(self, settlements: Sequence[EventSettlement]) -> None:
        by_db: dict[str, list[EventSettlement]] = {}
        for s in settlements:
            by_db.setdefault(s.event.database, []).append(s)
        failed: Exception | None = None
        for dsn, group in by_db.items():  # one database's trouble: the others are settled
            try:
                async with translated():
                    await self._settle(dsn, group)
            except StorageUnavailable as exc:
                failed = exc  # these stay leased: claimed and sent again once their lease lapses
        if failed is not None:
            raise failed

    async def _settle(self, dsn: str, group: list[EventSettlement]) -> None:
        pool = self.pool_for_dsn(dsn)
        done = [s.event for s in group if s.delivered]
        if done:
            await pool.execute(
                Q["delete_delivered_events"], [e.seq for e in done], [e.attempts for e in done]
            )
        rest = [s for s in group if not s.delivered]
        if rest:
            await pool.execute(
                Q["retry_failure_events"],
                [s.event.seq for s in rest],
                [s.event.attempts for s in rest],
                [s.retry_at for s in rest],
                [s.error for s in rest],
            )

    async def purge_given_up_events(self, *, before: datetime, limit: int) -> int:
        deleted = 0
        async with translated():
            for pool in self._pools.values():
                deleted += _count(await pool.execute(Q["retention_given_up_events"], before, limit))
        return deleted
