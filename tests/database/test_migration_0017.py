"""Migration 0017 (server keys): the cursor key is made once, whoever asks first.

Every API process of an installation must seal page cursors with one key (api/cursors.py), so the
key lives in the home database and the first processes to start, at the same moment, must agree on
it. Before the migration the store says what to run instead of failing obscurely.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from duetime.core.errors import StorageUnavailable
from duetime.storage.migrate import migrate
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.support.migrations import database_before


@pytest.fixture
async def old_db(run_tag: str) -> AsyncIterator[str]:
    async with database_before(17, f"duetime_test_{run_tag}_m17") as dsn:
        yield dsn


async def test_before_0017_the_key_names_the_migration_and_after_it_one_key_is_made(old_db: str) -> None:
    store = await PostgresStore.open(ShardMap.single(old_db), pool_size=2)
    try:
        with pytest.raises(StorageUnavailable, match="duetime migrate"):
            await store.cursor_key()
    finally:
        await store.close()

    assert (await migrate(old_db))[0] == "0017_server_keys.sql"  # then any later ones
    # Processes starting at once: each offers its own random key, all read back the one that won.
    stores = [await PostgresStore.open(ShardMap.single(old_db), pool_size=2) for _ in range(6)]
    try:
        keys = await asyncio.gather(*(s.cursor_key() for s in stores for _ in range(3)))
        assert len(set(keys)) == 1 and len(keys[0]) == 32
        assert await stores[0].cursor_key() == keys[0]
    finally:
        for s in stores:
            await s.close()
