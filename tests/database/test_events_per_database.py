"""The failure events' outbox with one of two primaries unusable: the other primary's events are
claimed and settled, not held back behind it (issue 27: the event sender works per database)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from duetime.core.errors import StorageUnavailable
from duetime.storage.ports import EventSettlement
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap

_TARGET = {
    "type": "webhook",
    "url": "https://example.com/hook",
    "method": "POST",
    "headers": {},
    "timeout_s": 10,
}


async def _event(store: PostgresStore, dsn: str) -> None:
    job = uuid.uuid4()
    await store.pool_for_dsn(dsn).execute(
        "INSERT INTO failure_events (event_id, job_id, shard, owner, type, scheduled_for, target, body) "
        "VALUES ($1, $2, 0, 'o', 'job.failing', $3, $4, '{}'::jsonb)",
        f"{job}:x:job.failing",
        job,
        datetime.now(UTC),
        _TARGET,
    )


async def test_one_primary_unusable_holds_back_only_its_own_events(pg_dsn_pair: tuple[str, str]) -> None:
    a, b = pg_dsn_pair
    store = await PostgresStore.open(ShardMap.from_dsns([a] * 8 + [b] * 8), pool_size=2)
    try:
        await _event(store, a)
        await _event(store, b)
        # a first in the pools' order: the unusable one is met before the healthy one's events
        store.pool_for_dsn(a).terminate()
        claimed = await store.claim_events(limit=10, lease_s=30)
        assert [e.database for e in claimed] == [b]
        settle = [EventSettlement(claimed[0], delivered=True)]
        await store.settle_events(settle)
        left = await store.pool_for_dsn(b).fetchval("SELECT count(*) FROM failure_events")
        assert left == 0
        store.pool_for_dsn(b).terminate()
        with pytest.raises(StorageUnavailable):
            await store.claim_events(limit=10, lease_s=30)  # none could be read: an outage
    finally:
        for pool in store.pools():
            pool.terminate()
