"""``PostgresStore``: the registry the API uses and the run store the engine and workers use,
composed of one part per concept over the same pools.

Every run-path method works on batches (arrays of hundreds of rows, one statement each). What a
row becomes after an event is decided by ``core.lifecycle`` from the row as it is under lock, in
the same transaction as the write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import asyncpg

from duetime.storage.postgres.changes import ChangesPart
from duetime.storage.postgres.completion import CompletionPart
from duetime.storage.postgres.due_age import DueAgePart
from duetime.storage.postgres.events import EventsPart
from duetime.storage.postgres.flow import FlowPart
from duetime.storage.postgres.hints import DueConnections, Hints, listen_due
from duetime.storage.postgres.inserts import InsertBatcher
from duetime.storage.postgres.keys import KeysPart
from duetime.storage.postgres.maintenance import MaintenancePart
from duetime.storage.postgres.membership import MembershipPart
from duetime.storage.postgres.names import NamesPart
from duetime.storage.postgres.pauses import PausesPart
from duetime.storage.postgres.pools import open_pools
from duetime.storage.postgres.queue_leases import QueueLeasePart
from duetime.storage.postgres.retention import RetentionPart
from duetime.storage.postgres.runpath import RunPathPart
from duetime.storage.postgres.selection import SelectionPart
from duetime.storage.postgres.server_keys import ServerKeysPart
from duetime.storage.postgres.sessions import SessionBounds
from duetime.storage.postgres.target_health import TargetHealthPart
from duetime.storage.shardmap import ShardMap


class PostgresStore(
    SelectionPart,
    NamesPart,
    RunPathPart,
    CompletionPart,
    MaintenancePart,
    QueueLeasePart,
    RetentionPart,
    KeysPart,
    EventsPart,
    TargetHealthPart,
    FlowPart,
    ServerKeysPart,
    MembershipPart,
    DueAgePart,
    ChangesPart,
    PausesPart,
):
    """Registry + run store (and the outbox, flow control, membership, retention and due age) on
    asyncpg pools, one pool per distinct database in the shard map."""

    def __init__(
        self,
        shard_map: ShardMap,
        pools: dict[str, asyncpg.Pool],
        notify_horizon_s: float,
        bounds: SessionBounds | None = None,
    ) -> None:
        self.shard_map = shard_map
        self._pools = pools
        self.bounds = bounds or SessionBounds()
        self._hints = Hints(shard_map, pools, notify_horizon_s)
        self._inserters = {dsn: InsertBatcher(pool) for dsn, pool in pools.items()}

    @classmethod
    async def open(
        cls,
        shard_map: ShardMap,
        *,
        pool_size: int = 10,
        notify_horizon_s: float = 300.0,
        bounds: SessionBounds | None = None,
    ) -> PostgresStore:
        bounds = bounds or SessionBounds()
        pools = await open_pools(shard_map, pool_size=pool_size, bounds=bounds)
        return cls(shard_map, pools, notify_horizon_s, bounds)

    async def listen_due(self, shards: Sequence[int], wake: Callable[[int], None]) -> DueConnections:
        return await listen_due(self.shard_map, shards, wake, self.bounds)

    async def close(self) -> None:
        await self._hints.close()
        for pool in self.pools():
            await pool.close()
