"""Flow control (``target.flow``) in PostgreSQL: every worker's asks for its flow keys, granted
from one token bucket and one count of held slots per (owner, key) on the home database.

The whole of a call is one round trip: the statement ``take_flow`` calls the function
``duetime_take_flow`` (migration 0015) with the asks as arrays. What a grant is, is decided by
``storage.flow_rules``; the function applies it under the key's row lock.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from duetime.core.errors import StorageUnavailable
from duetime.storage.flow_rules import bucket_capacity, check_asks
from duetime.storage.ports import FlowAsk, FlowGrant
from duetime.storage.postgres.pools import StoreBase, retried, translated
from duetime.storage.queries import Q


class FlowPart(StoreBase):
    """``FlowControl`` of ``PostgresStore``."""

    async def take_flow(self, worker: str, asks: Sequence[FlowAsk], *, hold_s: float) -> list[FlowGrant]:
        check_asks(asks)
        if not asks:
            return []
        args = (
            worker,
            [a.owner for a in asks],
            [a.key for a in asks],
            [a.rate_per_s for a in asks],
            [bucket_capacity(a.rate_per_s) for a in asks],
            [a.parallelism for a in asks],
            [a.want for a in asks],
            [a.running for a in asks],
            hold_s,
        )

        async def take() -> list[asyncpg.Record]:
            # Contention (a lock not had within lock_timeout behind a long holder) is run again
            # whole: the call changed nothing that was committed.
            async with translated():
                rows: list[asyncpg.Record] = await self.home_pool.fetch(Q["take_flow"], *args)
                return rows

        try:
            rows = await retried(take)
        except (asyncpg.UndefinedFunctionError, asyncpg.UndefinedTableError) as exc:
            raise StorageUnavailable(
                "the home database has no flow control tables yet (migration 0015): run "
                "`duetime migrate` with this release"
            ) from exc
        granted = {r["ask"]: r["granted"] for r in rows}
        return [FlowGrant(owner=a.owner, key=a.key, granted=granted[i]) for i, a in enumerate(asks, start=1)]
