"""The failure events' outbox (core/failures.py): the rows the completion writer inserted,
claimed by the delivery service with SKIP LOCKED and a lease, settled in batches (one statement
per kind of write and database)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from duetime.core import codec
from duetime.storage.ports import EventSettlement, OutboxEvent
from duetime.storage.postgres.pools import StoreBase, translated
from duetime.storage.queries import Q


def _count(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1])


class EventsPart(StoreBase):
    """``EventOutbox`` of ``PostgresStore``."""

    async def claim_events(self, *, limit: int, lease_s: float) -> list[OutboxEvent]:
        claimed: list[OutboxEvent] = []
        async with translated():
            for dsn, pool in self._pools.items():
                room = limit - len(claimed)
                if room <= 0:
                    break
                for r in await pool.fetch(Q["claim_failure_events"], room, lease_s):
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
        return claimed

    async def settle_events(self, settlements: Sequence[EventSettlement]) -> None:
        by_db: dict[str, list[EventSettlement]] = {}
        for s in settlements:
            by_db.setdefault(s.event.database, []).append(s)
        async with translated():
            for dsn, group in by_db.items():
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
