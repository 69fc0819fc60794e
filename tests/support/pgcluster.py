"""Private PostgreSQL clusters for the fault tests: started as ``duetime run`` starts its embedded
one (``EmbeddedPostgres``, initdb and pg_ctl as an unprivileged server user), so a test can crash,
stop or restart a primary; the shared server other work depends on is never touched."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg

from duetime.embedded_pg import EmbeddedPostgres
from duetime.storage.migrate import migrate


def _open_dir() -> Path:
    # World-readable: the server runs as its own user under it.
    root = Path(tempfile.mkdtemp(prefix="duetime-faults-pg-", dir="/tmp"))
    root.chmod(0o755)
    return root


@contextlib.asynccontextmanager
async def private_cluster() -> AsyncIterator[EmbeddedPostgres]:
    """A running cluster of our own, stopped and removed at the end."""
    root = await asyncio.to_thread(_open_dir)
    pg = EmbeddedPostgres(root / "data")
    await pg.start()
    try:
        yield pg
    finally:
        await pg.stop()
        shutil.rmtree(root, ignore_errors=True)


async def migrated_database(pg: EmbeddedPostgres) -> str:
    """A new database on ``pg`` with Duetime's schema; its DSN."""
    name = f"faults_{secrets.token_hex(3)}"
    admin = await asyncpg.connect(pg.dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = pg.dsn.rsplit("/", 1)[0] + "/" + name
    await migrate(dsn)
    return dsn


async def pg_ctl(pg: EmbeddedPostgres, *args: str) -> None:
    code, out = await pg._pg_ctl(*args)
    assert code == 0, out


async def restart_immediately(pg: EmbeddedPostgres) -> None:
    """A crash and recovery: every connection is cut, nothing is flushed on the way down."""
    await pg_ctl(pg, "restart", "-m", "immediate", "-w", "-t", "60", "-l", str(pg.log_file))


async def stop_immediately(pg: EmbeddedPostgres) -> None:
    await pg_ctl(pg, "stop", "-m", "immediate", "-t", "60")


async def start_again(pg: EmbeddedPostgres) -> None:
    await pg_ctl(pg, "start", "-w", "-t", "60", "-l", str(pg.log_file))
