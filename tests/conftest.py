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
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

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
    _tell_apart(items)


def _tell_apart(items: list[pytest.Item]) -> None:
    """Give the tests that share an id one of their own, made of their name.

    Schemathesis's cases (tests/database/test_api_fuzz.py, one per operation) are all named
    ``test_fuzz_api[OPERATION]`` but, with pytest 9.2, all have the id ``...::test_fuzz_api``:
    pytest-xdist deals tests out by id and so ran the first operation alone, silently."""
    ids = Counter(item.nodeid for item in items)
    for item in items:
        if ids[item.nodeid] > 1 and item.name != item.nodeid.rpartition("::")[2]:
            own = f"{item.nodeid.rpartition('::')[0]}::{item.name}"
            node_id = getattr(item, "_id", None)  # pytest 9.2's NodeId; a string before
            if node_id is not None and hasattr(node_id, "parse"):
                item._id = type(node_id).parse(own)
            else:
                setattr(item, "_nodeid", own)  # noqa: B010 - not an attribute of Item that mypy knows


# Run on several workers (pytest-xdist, `-n N`, as scripts/test.sh does), the suite is dealt out
# in units that each run on one worker, one test after another: a test module (its module-scoped
# databases and processes are made once, and its tests, written to run in order, still do), or a
# whole folder of ONE_AT_A_TIME. The cluster cases each drive bursts of thousands of runs through
# seven processes, two PostgreSQL servers and NATS on two cores: two at once starve each other's
# leases and heartbeats (a rolling restart doubled runs so), so they run one after the other while
# the other workers take the rest of the suite.
ONE_AT_A_TIME = ("cluster",)


def unit_of(nodeid: str) -> str:
    """The unit a test is dealt in: its folder for those of ONE_AT_A_TIME, else its module."""
    module = nodeid.split("::", 1)[0]
    parts = module.split("/")
    if len(parts) > 2 and parts[-3] == "tests" and parts[-2] in ONE_AT_A_TIME:
        return "/".join(parts[:-1])
    return module


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown (and unused) without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Deal the suite by ``unit_of``, whatever ``--dist`` says (its own ``loadgroup`` cannot be
    used: pytest 9.2 no longer reads the test ids that xdist 3.8 rewrites for it)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return ByUnit(config, log)


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
