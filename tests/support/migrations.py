"""A database migrated up to a given version: what an upgrade's migration test starts from."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from duetime.storage.migrate import migration_files
from tests.conftest import ADMIN_DSN, _drop_db, _dsn_for


@asynccontextmanager
async def database_before(version: int, name: str) -> AsyncIterator[str]:
    """A fresh database named ``name`` with the migrations before ``version`` applied and recorded
    as ``duetime migrate`` records them; dropped afterwards. Yields its DSN."""
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = _dsn_for(name)
    try:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for number, file, sql in migration_files():
                if number >= version:
                    break
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", number, file
                )
        finally:
            await conn.close()
        yield dsn
    finally:
        await _drop_db(name)
