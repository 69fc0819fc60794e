"""Target health in the home database: workers' reports of the hosts they call, and the owner's
list of them (``GET /v1/targets``).

The home database holds it because it is one table for the whole cluster, like the owners and
their keys: every worker writes there whatever shards its runs come from, and a list reads one
primary key range. The rules (windows, aggregation, cursor) are ``storage.target_rules``'.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from duetime.core.model import TargetState
from duetime.storage.ports import Page, TargetHealthReport, TargetView
from duetime.storage.postgres.pools import StoreBase, retried, translated
from duetime.storage.queries import Q
from duetime.storage.target_rules import (
    LIVE_S,
    REPORT_BATCH,
    STALE_S,
    encode_target_cursor,
    latest_per_pair,
    target_cursor,
)


def _deleted(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1])


class TargetHealthPart(StoreBase):
    """The ``TargetHealth`` port, and the maintenance service's purge of reports long gone."""

    async def report_target_health(self, worker: str, reports: Sequence[TargetHealthReport]) -> None:
        """One statement per ``REPORT_BATCH`` reports (one round trip for a worker of a few
        thousand pairs or fewer); the first also deletes what the worker stopped reporting.

        Batches are not one transaction: a worker's rows are its own (the worker is in the key),
        so a reader sees at worst part of this report beside the previous one, a few seconds
        apart. An empty report still deletes the worker's stale rows.
        """
        rows = latest_per_pair(reports)
        batches = [rows[i : i + REPORT_BATCH] for i in range(0, len(rows), REPORT_BATCH)] or [[]]
        for index, batch in enumerate(batches):
            write = functools.partial(self._write_reports, worker, batch, delete_stale=index == 0)
            async with translated():
                await retried(write)

    async def _write_reports(
        self, worker: str, batch: Sequence[TargetHealthReport], *, delete_stale: bool
    ) -> None:
        await self.home_pool.fetchrow(
            Q["report_target_health"],
            worker,
            [r.owner for r in batch],
            [r.host for r in batch],
            [r.state.value for r in batch],
            [r.concurrency_limit for r in batch],
            [r.backoff_until for r in batch],
            [r.calls_5m for r in batch],
            [r.timeouts_5m for r in batch],
            [r.errors_5m for r in batch],
            delete_stale,
            STALE_S,
        )

    async def list_targets(self, owner: str, *, limit: int, cursor: str | None) -> Page[TargetView]:
        after = target_cursor(cursor)
        async with translated():
            rows = await self.home_pool.fetch(Q["list_targets"], owner, after, LIVE_S, limit + 1)
        items = [
            TargetView(
                host=r["host"],
                state=TargetState(r["state"]),
                concurrency_limit=int(r["concurrency_limit"]),
                backoff_until=r["backoff_until"],
                calls_5m=int(r["calls_5m"]),
                timeouts_5m=int(r["timeouts_5m"]),
                errors_5m=int(r["errors_5m"]),
            )
            for r in rows[:limit]
        ]
        next_cursor = encode_target_cursor(items[-1].host) if len(rows) > limit else None
        return Page(items, next_cursor)

    async def purge_target_health(self, *, older_than_s: float) -> int:
        """Delete every report older than ``older_than_s`` (workers gone for good); how many went."""
        async with translated():
            return _deleted(await self.home_pool.execute(Q["purge_target_health"], float(older_than_s)))
