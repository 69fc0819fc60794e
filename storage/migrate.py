"""Versioned migrations: ordered ``NNNN_name.sql`` files, each applied once per database.

Applying is idempotent and safe to race: an advisory lock serialises concurrent ``duetime
migrate`` runs, and ``schema_migrations`` records what is in place.
"""

from __future__ import annotations

from importlib import resources

import asyncpg

_LOCK_KEY = 0x64756574696D65  # "duetime"


def migration_files() -> list[tuple[int, str, str]]:
    """(version, name, sql) in order, read from the package so an installed wheel carries them."""
    out: list[tuple[int, str, str]] = []
    for entry in resources.files("duetime.storage.migrations").iterdir():
        name = entry.name
        if not name.endswith(".sql"):
            continue
        version = int(name.split("_", 1)[0])
        out.append((version, name, entry.read_text(encoding="utf-8")))
    out.sort()
    versions = [v for v, _, _ in out]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a version number: {versions}")
    return out


async def migrate(dsn: str) -> list[str]:
    """Apply what is missing on one database; returns the names applied this time."""
    conn = await asyncpg.connect(dsn)
    applied: list[str] = []
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            for version, name, sql in migration_files():
                if version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name
                    )
                applied.append(name)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
    finally:
        await conn.close()
    return applied
