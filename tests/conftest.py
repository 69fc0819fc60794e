"""Shared fixtures: a real PostgreSQL database per test run, created here and dropped at the end.

Set DUETIME_TEST_PG (default ``postgresql://root@127.0.0.1:5432/postgres``) to point the suite at
another server; the suite never touches databases it did not create.

Every test is marked with what it needs (markers registered in pyproject.toml), so a subset can be
chosen by that: ``pytest -m "not pg and not processes"`` runs what needs no service at all.
``pg`` and ``redis`` follow from the fixtures a test uses, ``processes`` and ``nats`` from the
folders whose tests start processes or a NATS server of their own, ``slow`` from a timeout raised
to the default budget or beyond; a test that reaches a service some other way marks itself.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from duetime.storage.migrate import migrate

# What a test needs, read from the fixtures it uses (transitively) and the folder it is in.
# The fixtures that make databases (here and in the folders' conftests and modules) mean PostgreSQL.
PG_FIXTURES = (
    "pg_dsn",
    "pg_dsn_pair",
    "fault_db",
    "own_db",
    "second_pg",
    "fresh_dsns",
    "empty_databases",
    "dsn",
)
FIXTURE_MARKS = {**dict.fromkeys(PG_FIXTURES, "pg"), "redis": "redis"}
FOLDER_MARKS = {"cluster": ("processes", "nats", "pg"), "faults": ("processes", "pg")}
DEFAULT_TIMEOUT_S = 120  # pyproject.toml, [tool.pytest.ini_options] timeout
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        wanted = {
            mark for fixture, mark in FIXTURE_MARKS.items() if fixture in getattr(item, "fixturenames", ())
        }
        folder = item.path.resolve().relative_to(TESTS).parts[0]
        wanted.update(FOLDER_MARKS.get(folder, ()))
        timeout = item.get_closest_marker("timeout")
        if timeout is not None and timeout.args and float(timeout.args[0]) >= DEFAULT_TIMEOUT_S:
            wanted.add("slow")
        for mark in sorted(wanted):
            item.add_marker(mark)


ADMIN_DSN = os.environ.get("DUETIME_TEST_PG", "postgresql://root@127.0.0.1:5432/postgres")


def _dsn_for(dbname: str) -> str:
    base, _, _ = ADMIN_DSN.rpartition("/")
    return f"{base}/{dbname}"


async def _create_db(name: str) -> str:
    conn = await asyncpg.connect(ADMIN_DSN)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    dsn = _dsn_for(name)
    await migrate(dsn)
    return dsn


async def _drop_db(name: str) -> None:
    conn = await asyncpg.connect(ADMIN_DSN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def run_tag() -> str:
    return f"{os.getpid()}_{secrets.token_hex(3)}"


@pytest.fixture(scope="session")
async def pg_dsn(run_tag: str) -> AsyncIterator[str]:
    """One migrated database for the whole run."""
    name = f"duetime_test_{run_tag}"
    dsn = await _create_db(name)
    yield dsn
    await _drop_db(name)


@pytest.fixture(scope="session")
async def pg_dsn_pair(run_tag: str) -> AsyncIterator[tuple[str, str]]:
    """Two migrated databases, for spreading the 16 shards over two primaries."""
    names = [f"duetime_test_{run_tag}_a", f"duetime_test_{run_tag}_b"]
    dsns = [await _create_db(n) for n in names]
    yield dsns[0], dsns[1]
    for n in names:
        await _drop_db(n)


@pytest.fixture
def allow_private(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Loopback receivers in tests are private addresses: allow them for this test only."""
    monkeypatch.setenv("DUETIME_WEBHOOK_ALLOW_PRIVATE", "1")
    yield
