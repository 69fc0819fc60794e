"""Migration 0015 (flow control): a home database of the previous release answers a take with
``StorageUnavailable`` saying to migrate (a transient error, as for a database that is away, not
a driver's exception), and after ``duetime migrate`` the same store grants without being
reopened."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from duetime.core.errors import StorageUnavailable
from duetime.storage.migrate import migrate
from duetime.storage.ports import FlowAsk, FlowGrant
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.support.migrations import database_before


@pytest.fixture
async def old_db(run_tag: str) -> AsyncIterator[str]:
    async with database_before(15, f"duetime_test_{run_tag}_m15") as dsn:
        yield dsn


async def test_before_the_migration_a_take_says_to_migrate_and_after_it_grants(old_db: str) -> None:
    ask = FlowAsk(owner="o", key="api", rate_per_s=1.0, parallelism=2, want=5, running=0)
    store = await PostgresStore.open(ShardMap.single(old_db), pool_size=2)
    try:
        with pytest.raises(StorageUnavailable, match="duetime migrate"):
            await store.take_flow("w1", [ask], hold_s=30)
        assert (await migrate(old_db))[0] == "0015_flow_control.sql"
        assert await store.take_flow("w1", [ask], hold_s=30) == [FlowGrant("o", "api", 1)]  # one token at 1/s
        assert await store.take_flow("w2", [ask], hold_s=30) == [FlowGrant("o", "api", 0)]
    finally:
        await store.close()
