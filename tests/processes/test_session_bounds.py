"""Every PostgreSQL session of a Duetime server lives under bounds (DUETIME_DB_*): a process
frozen inside a transaction loses its locks, a statement stuck behind a lock gives way, a hung
statement is cancelled, and a primary cut off without a reset is given up on by the client.

Before the bounds, sessions had no statement_timeout, lock_timeout, idle_in_transaction timeout,
keepalives or connect timeout: a process paused inside a transaction kept its rows locked for as
long as it was paused, and a statement through a connection whose packets were dropped hung for
the kernel's retransmission time (about 15 minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from duetime.core.errors import Contended, StorageUnavailable
from duetime.storage.postgres import PostgresStore
from duetime.storage.postgres.pools import translated
from duetime.storage.postgres.sessions import SessionBounds
from duetime.storage.shardmap import ShardMap
from tests.support.wait import until

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]

# A Duetime process's store, built the way `duetime run` builds it from its settings, that locks
# one row inside a transaction and then waits there (the parent freezes it with SIGSTOP).
_LOCKER = textwrap.dedent(
    """
    import asyncio, sys, uuid
    from duetime.app import session_bounds
    from duetime.settings import Settings
    from duetime.storage.postgres import PostgresStore
    from duetime.storage.shardmap import ShardMap

    async def main() -> None:
        settings = Settings.from_env()
        store = await PostgresStore.open(
            ShardMap.single(sys.argv[1]), pool_size=1, bounds=session_bounds(settings)
        )
        async with store.pool_for_shard(0).acquire() as conn, conn.transaction():
            await conn.execute("SELECT 1 FROM bound_probe WHERE id = 1 FOR UPDATE")
            print("locked", flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


@pytest.fixture
async def probe_table(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(pg_dsn)
    await conn.execute("DROP TABLE IF EXISTS bound_probe; CREATE TABLE bound_probe (id int PRIMARY KEY)")
    await conn.execute("INSERT INTO bound_probe VALUES (1)")
    try:
        yield conn
    finally:
        await conn.close()


async def _row_free(conn: asyncpg.Connection) -> bool:
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM bound_probe WHERE id = 1 FOR UPDATE NOWAIT")
        return True
    except asyncpg.exceptions.LockNotAvailableError:
        return False


async def test_a_process_frozen_inside_a_transaction_loses_its_locks(
    pg_dsn: str, probe_table: asyncpg.Connection, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "DUETIME_DATABASE_URL": pg_dsn,
        "DUETIME_DB_IDLE_IN_TRANSACTION_TIMEOUT_S": "2",
    }
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _LOCKER,
        pg_dsn,
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), timeout=30)
        assert line.strip() == b"locked", line
        child.send_signal(signal.SIGSTOP)  # frozen with the row locked, as a paused VM would be
        frozen_at = time.monotonic()
        assert not await _row_free(probe_table), "the frozen process holds the row"
        await until(lambda: _row_free(probe_table), within=30, what="the frozen session's lock freed")
        freed_after = time.monotonic() - frozen_at
    finally:
        child.send_signal(signal.SIGCONT)
        child.kill()
        await child.wait()
    print(f"lock freed {freed_after:.1f} s after the freeze (idle_in_transaction_session_timeout 2 s)")
    assert freed_after < 20


async def test_a_statement_waiting_for_a_lock_gives_way_and_a_long_one_is_cancelled(
    pg_dsn: str, probe_table: asyncpg.Connection
) -> None:
    bounds = SessionBounds(statement_timeout_s=1.0, lock_timeout_s=0.5)
    store = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=1, bounds=bounds)
    try:
        pool = store.pool_for_shard(0)
        async with probe_table.transaction():
            await probe_table.execute("SELECT 1 FROM bound_probe WHERE id = 1 FOR UPDATE")
            started = time.monotonic()
            with pytest.raises(Contended):
                async with translated():
                    await pool.execute("UPDATE bound_probe SET id = 1 WHERE id = 1")
            assert time.monotonic() - started < 5, "gave way after lock_timeout, not at the end"
        started = time.monotonic()
        with pytest.raises(StorageUnavailable):
            async with translated():
                await pool.execute("SELECT pg_sleep(30)")
        assert time.monotonic() - started < 10, "cancelled after statement_timeout"
        assert await pool.fetchval("SELECT 1") == 1, "the pool works on after both"
    finally:
        await store.close()


class _Blackhole:
    """A TCP proxy to PostgreSQL that can start dropping every byte without closing anything: a
    primary cut off by the network, as opposed to one that went down and reset its connections."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self.dropping = False
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._serving: set[asyncio.Task[None]] = set()
        self._closed = False
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        self._writers.append(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
            self._writers.append(up_writer)
            if self._closed:  # closed while this one connected upstream (asyncpg's cancel request)
                writer.close()
                up_writer.close()
                return

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                with contextlib.suppress(ConnectionError, OSError):
                    while data := await src.read(65536):
                        if not self.dropping:
                            dst.write(data)
                            await dst.drain()

            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._serving.discard(task)

    async def close(self) -> None:
        """Close both ends of every connection and wait for the handlers to end: a handler that
        was still connecting upstream at the close (asyncpg's cancel request for the timed-out
        statement) used to pipe on forever, and a later test failed on its unclosed sockets when
        the collector found them."""
        self._closed = True
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.close()
        if self._serving:
            await asyncio.wait(self._serving, timeout=10)


async def test_a_primary_cut_off_without_a_reset_is_given_up_on(pg_dsn: str) -> None:
    port = int(pg_dsn.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    proxy = _Blackhole(port)
    await proxy.start()
    proxied = pg_dsn.replace(f":{port}/", f":{proxy.port}/")
    bounds = SessionBounds(statement_timeout_s=1.0)
    store = await PostgresStore.open(ShardMap.single(proxied), pool_size=1, bounds=bounds)
    try:
        pool = store.pool_for_shard(0)
        assert await pool.fetchval("SELECT 1") == 1
        proxy.dropping = True
        started = time.monotonic()
        with pytest.raises(StorageUnavailable):
            async with translated():
                await pool.fetchval("SELECT $1::text", uuid.uuid4().hex)
        waited = time.monotonic() - started
    finally:
        proxy.dropping = False
        await proxy.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(store.close(), timeout=10)
    assert waited < 15, f"the client gave up after {waited:.1f} s (statement_timeout 1 s + 5 s)"
