"""How long the oldest due row of each shard has waited for an engine to claim it (the
``DueAge`` port of ``PostgresStore``).

The lateness histograms are observed when a run fires or starts, so they cannot see a run that
never fires (a shard no engine serves, engines stuck on a dead primary). This reading can: it
looks at the rows themselves. One statement per database, one index probe per shard.
"""

from __future__ import annotations

from collections.abc import Iterable

from duetime.storage.ports import DueBacklog
from duetime.storage.postgres.pools import StoreBase, translated
from duetime.storage.queries import Q


class DueAgePart(StoreBase):
    """The due-age reading of ``PostgresStore``."""

    async def oldest_unclaimed_due(self, shards: Iterable[int]) -> list[DueBacklog]:
        """A reading for each of ``shards``, database by database; raises StorageUnavailable when
        a database is down (the caller keeps the last readings of those shards)."""
        wanted = set(shards)
        out: list[DueBacklog] = []
        for dsn, held in sorted(self.shard_map.databases().items()):
            mine = sorted(wanted.intersection(held))
            if not mine:
                continue
            async with translated():
                rows = await self.pool_for_dsn(dsn).fetch(Q["oldest_unclaimed_due"], mine)
            out.extend(DueBacklog(shard=row["shard"], oldest_age_s=max(0.0, row["age_s"])) for row in rows)
        return out
