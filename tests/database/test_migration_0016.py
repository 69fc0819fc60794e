"""Migration 0016 (target health) and the order migrations reach a database in.

0015 (flow control) is written beside 0016 on another branch, so a database may get 0016 first
and 0015 at a later upgrade. The runner applies every version it has not recorded, whatever
higher ones it recorded before: shown here with 0014 (one function, easily taken back) missing
under 0016.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from duetime.core.model import TargetState
from duetime.storage.migrate import migrate
from duetime.storage.ports import TargetHealthReport
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.support.migrations import database_before


@pytest.fixture
async def old_db(run_tag: str) -> AsyncIterator[str]:
    async with database_before(16, f"duetime_test_{run_tag}_m16") as dsn:
        yield dsn


async def test_0016_applies_on_the_previous_schema_and_a_lower_version_later(old_db: str) -> None:
    applied = await migrate(old_db)
    assert applied[0] == "0016_target_health.sql"
    store = await PostgresStore.open(ShardMap.single(old_db), pool_size=2)
    try:
        report = TargetHealthReport("o", "h:443", TargetState.DEGRADED, 4, None, 10, 2, 1)
        await store.report_target_health("w", [report])
        [view] = (await store.list_targets("o", limit=10, cursor=None)).items
        assert (view.host, view.state, view.calls_5m) == ("h:443", TargetState.DEGRADED, 10)
    finally:
        await store.close()

    conn = await asyncpg.connect(old_db)
    try:
        await conn.execute("DROP FUNCTION duetime_token_floor()")
        await conn.execute("DELETE FROM schema_migrations WHERE version = 14")
        assert await migrate(old_db) == ["0014_token_epoch.sql"]
        assert await conn.fetchval("SELECT duetime_token_floor() >= 0")
        assert await migrate(old_db) == []
    finally:
        await conn.close()
