"""Fixtures of the cluster tests: a SECOND PostgreSQL server (its own cluster, started here with
initdb + pg_ctl through ``duetime.embedded_pg``, which already knows how to run PostgreSQL as an
unprivileged user when the tests run as root), a migrated database per test on each of the two
servers, a private nats-server per test, and a receiver process that records every call."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from duetime.embedded_pg import TUNING, EmbeddedPostgres
from duetime.storage.migrate import migrate
from loadtest.common import ReceiverProcess
from tests.cluster.harness import Cluster, NatsServer, cluster_env
from tests.conftest import ADMIN_DSN

SECOND_TUNING = {**TUNING, "shared_buffers": "'64MB'", "effective_cache_size": "'256MB'"}


def _server_home() -> Path:
    root = Path(tempfile.mkdtemp(prefix="duetime-pg2-"))
    root.chmod(0o755)  # the server runs as another user when we are root: it must reach its home
    return root


@pytest.fixture(scope="session")
async def second_pg() -> AsyncIterator[str]:
    """Admin DSN of a second PostgreSQL server, for the duration of the session."""
    root = _server_home()
    pg = EmbeddedPostgres(root, tuning=SECOND_TUNING)
    await pg.start()
    try:
        yield pg.dsn.rpartition("/")[0] + "/postgres"
    finally:
        await pg.stop()
        shutil.rmtree(root, ignore_errors=True)


async def _create(admin: str, name: str) -> str:
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    dsn = f"{admin.rpartition('/')[0]}/{name}"
    await migrate(dsn)
    return dsn


async def _drop(admin: str, name: str) -> None:
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture
async def two_primaries(second_pg: str) -> AsyncIterator[tuple[str, str]]:
    """(database on the main server, database on the second server), both migrated, per test."""
    name = f"duetime_cluster_{os.getpid()}_{secrets.token_hex(3)}"
    a = await _create(ADMIN_DSN, name)
    b = await _create(second_pg, name)
    yield a, b
    await _drop(ADMIN_DSN, name)
    await _drop(second_pg, name)


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    server = NatsServer()
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def receiver_process() -> Iterator[ReceiverProcess]:
    r = ReceiverProcess()
    r.start()
    yield r
    r.stop()


@pytest.fixture
async def cluster(
    two_primaries: tuple[str, str], nats_server: NatsServer, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Shards 0-7 on the main server, 8-15 on the second; processes are started by the test."""
    a, b = two_primaries
    c = Cluster(cluster_env(f"0-7={a},8-15={b}", nats_server.url), tmp_path)
    yield c
    codes = await c.stop_all()
    bad = {name: code for name, code in codes.items() if code != 0}
    assert not bad, f"processes did not stop cleanly: {bad}\n{c.logs()}"
