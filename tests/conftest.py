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
async def pg_template(run_tag: str) -> AsyncIterator[str]:
    """One migrated database that every module's ``pg_dsn`` is cloned from: a clone is a file
    copy, much cheaper than running the migrations again."""
    name = f"duetime_test_{run_tag}_tpl"
    await _create_db(name)
    yield name
    await _drop_db(name)


@pytest.fixture(scope="module")
async def pg_dsn(run_tag: str, pg_template: str) -> AsyncIterator[str]:
    """A migrated database of this test module's own.

    One module's leftovers (due jobs nobody fired, claims of a killed engine) must not reach the
    engines another module starts: in one shared database, a later module's engine claimed and
    fired hundreds of runs that were not its test's, and its counts and waits failed.
    """
    name = f"duetime_test_{run_tag}_m{secrets.token_hex(3)}"
    conn = await asyncpg.connect(ADMIN_DSN)
    try:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    finally:
        await conn.close()
    yield _dsn_for(name)
    await _drop_db(name)


@pytest.fixture(scope="session")
async def pg_dsn_pair(run_tag: str) -> AsyncIterator[tuple[str, str]]:
    """Two migrated databases, for spreading the 16 shards over two primaries."""
    names = [f"duetime_test_{run_tag}_a", f"duetime_test_{run_tag}_b"]
    dsns = [await _create_db(n) for n in names]
    yield dsns[0], dsns[1]
    for n in names:
        await _drop_db(n)


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test() -> Iterator[None]:
    """Kill what a test started and did not stop (see ``tests.support.processes.kill_leftovers``)."""
    from tests.support.processes import kill_leftovers, started_count

    mark = started_count()
    yield
    kill_leftovers(mark)


@pytest.fixture
def allow_private(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Loopback receivers in tests are private addresses: allow them for this test only."""
    monkeypatch.setenv("DUETIME_WEBHOOK_ALLOW_PRIVATE", "1")
    yield
