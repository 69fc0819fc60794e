"""The embedded PostgreSQL of ``duetime run``: real initdb, real server, as the machine's user.

These machines run as root, so the start path proven here is the unprivileged-user one: the
server must run as another user and the cluster must belong to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from duetime.embedded_pg import (
    RELOCATION_ROOT,
    EmbeddedPostgres,
    EmbeddedPostgresError,
    candidate_bindirs,
    find_pg_binaries,
    running_dsn,
)
from tests.support.wait import until

pytestmark = [
    pytest.mark.skipif(not candidate_bindirs(), reason="PostgreSQL server programs not installed"),
    pytest.mark.pg,
    pytest.mark.processes,
]

IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def open_dir() -> Iterator[Path]:
    """One data dir for the module, reachable by every user (pytest's tmp_path is mode 700).

    Shared because initdb is the slow part; each test works whether or not the cluster exists.
    """
    path = Path(tempfile.mkdtemp(prefix="duetime-pg-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path / "data"
    shutil.rmtree(path, ignore_errors=True)


def _postmaster_pid(pg: EmbeddedPostgres) -> int:
    return int((pg.pgdata / "postmaster.pid").read_text().splitlines()[0])


def _pid_alive(pid: int) -> bool:
    """Alive and not a zombie: an orphaned server's exit is reaped by whatever init the machine has."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


async def _wait_dead(pid: int) -> None:
    await until(lambda: not _pid_alive(pid), within=10, what=f"postmaster {pid} to exit", every=0.1)


async def test_start_connect_stop_and_restart_reuses_the_cluster(open_dir: Path) -> None:
    token = secrets.token_hex(8)
    async with EmbeddedPostgres(open_dir) as pg:
        assert pg.dsn == f"postgresql://duetime@127.0.0.1:{pg.port}/duetime"
        assert running_dsn(open_dir) == pg.dsn
        conn = await asyncpg.connect(pg.dsn)
        try:
            assert await conn.fetchval("SELECT current_database()") == "duetime"
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
            assert await conn.fetchval("SHOW fsync") == "on"
            assert await conn.fetchval("SHOW max_connections") == "200"
            assert await conn.fetchval("SHOW shared_buffers") == "256MB"
            assert await conn.fetchval("SHOW server_encoding") == "UTF8"
            await conn.execute("CREATE TABLE IF NOT EXISTS kept (v text)")
            await conn.execute("INSERT INTO kept VALUES ($1)", token)
        finally:
            await conn.close()
        pid = _postmaster_pid(pg)
        server_uid = os.stat(f"/proc/{pid}").st_uid
        if IS_ROOT:
            assert server_uid != 0, "the server must not run as root"
            assert pg.pgdata.stat().st_uid == server_uid
            assert pwd.getpwuid(server_uid).pw_name in ("postgres", "duetime")
        else:
            assert server_uid == os.geteuid()
        assert stat.S_IMODE(pg.pgdata.stat().st_mode) == 0o700
        first_port = pg.port
        starts = pg.log_file.read_text().count("database system is ready to accept connections")
    await _wait_dead(pid)
    assert running_dsn(open_dir) is None
    assert not (open_dir / "pg" / "data" / "postmaster.pid").exists()

    async with EmbeddedPostgres(open_dir) as pg:
        assert pg.port == first_port, "a free remembered port is reused"
        conn = await asyncpg.connect(pg.dsn)
        try:
            assert await conn.fetchval("SELECT count(*) FROM kept WHERE v = $1", token) == 1
        finally:
            await conn.close()
        log_text = pg.log_file.read_text()
        assert log_text.count("database system is ready to accept connections") == starts + 1


async def test_a_second_instance_on_the_same_dir_is_refused(open_dir: Path) -> None:
    async with EmbeddedPostgres(open_dir) as pg:
        with pytest.raises(EmbeddedPostgresError) as info:
            async with EmbeddedPostgres(open_dir):
                pass
        assert f"pid {os.getpid()}" in info.value.message
        assert str(open_dir) in info.value.message
        # The refused instance must not have disturbed the running one.
        conn = await asyncpg.connect(pg.dsn)
        try:
            assert await conn.fetchval("SELECT 1") == 1
        finally:
            await conn.close()


async def test_a_taken_remembered_port_is_replaced(open_dir: Path) -> None:
    async with EmbeddedPostgres(open_dir) as pg:
        port = pg.port
    with socket.socket() as squatter:
        # SO_REUSEADDR only to get past the old server's TIME_WAIT; a listener still holds the port.
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        async with EmbeddedPostgres(open_dir) as pg:
            new_port = pg.port
            assert new_port != port
            conn = await asyncpg.connect(pg.dsn)
            await conn.close()
    assert (open_dir / "pg" / "port").read_text().strip() == str(new_port)


async def test_a_server_left_by_a_killed_duetime_is_taken_over(open_dir: Path) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from pathlib import Path
        from duetime.embedded_pg import EmbeddedPostgres

        async def main() -> None:
            pg = EmbeddedPostgres(Path({str(open_dir)!r}))
            await pg.start()
            print(pg.dsn, flush=True)
            await asyncio.sleep(3600)

        asyncio.run(main())
        """
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, cwd=str(Path(__file__).parents[2])
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 90)
    assert line.startswith(b"postgresql://"), line
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    orphan = int((open_dir / "pg" / "data" / "postmaster.pid").read_text().splitlines()[0])
    assert _pid_alive(orphan), "the server outlives a killed duetime (its own session)"

    async with EmbeddedPostgres(open_dir) as pg:
        assert _postmaster_pid(pg) != orphan
        conn = await asyncpg.connect(pg.dsn)
        await conn.close()
    await _wait_dead(orphan)


@pytest.mark.skipif(not IS_ROOT, reason="only root's server user can be shut out of a directory")
async def test_a_data_dir_the_server_user_cannot_reach_is_relocated(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    data_dir = private / "data"
    home: Path | None = None
    try:
        async with EmbeddedPostgres(data_dir) as pg:
            link = data_dir / "pg"
            assert link.is_symlink()
            home = link.resolve()
            assert home.parent == RELOCATION_ROOT
            assert pg.pgdata == home / "data"
            conn = await asyncpg.connect(pg.dsn)
            await conn.close()
        async with EmbeddedPostgres(data_dir) as pg:
            assert pg.pgdata == home / "data", "a restart finds the relocated cluster again"
    finally:
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)
            with contextlib.suppress(OSError):
                RELOCATION_ROOT.rmdir()  # only when empty: other clusters may live there


def _fake_install(root: Path, version: str, reported: str) -> Path:
    bindir = root / version / "bin"
    bindir.mkdir(parents=True)
    for name in ("initdb", "pg_ctl"):
        (bindir / name).write_text("#!/bin/sh\nexit 0\n")
        (bindir / name).chmod(0o755)
    (bindir / "postgres").write_text(f"#!/bin/sh\necho 'postgres (PostgreSQL) {reported}'\n")
    (bindir / "postgres").chmod(0o755)
    return bindir


async def test_binaries_newest_version_first_and_preferred_version_honoured(tmp_path: Path) -> None:
    _fake_install(tmp_path, "9.6", "9.6.24")
    _fake_install(tmp_path, "14", "14.11")
    newest = _fake_install(tmp_path, "16", "16.2")
    (tmp_path / "17" / "bin").mkdir(parents=True)  # an incomplete install is ignored
    found = await find_pg_binaries(path_env="/nonexistent", search_roots=[tmp_path])
    assert (found.bindir, found.version) == (newest, 16)
    older = await find_pg_binaries(prefer_version=14, path_env="/nonexistent", search_roots=[tmp_path])
    assert older.version == 14


async def test_binaries_on_path_come_first(tmp_path: Path) -> None:
    _fake_install(tmp_path / "lib", "16", "16.2")
    on_path = _fake_install(tmp_path / "opt", "13", "13.9")
    found = await find_pg_binaries(path_env=str(on_path), search_roots=[tmp_path / "lib"])
    assert (found.bindir, found.version) == (on_path, 13)


async def test_missing_binaries_name_the_package_and_the_alternative(tmp_path: Path) -> None:
    with pytest.raises(EmbeddedPostgresError) as info:
        await find_pg_binaries(path_env="/nonexistent", search_roots=[tmp_path])
    assert "apt-get install postgresql" in info.value.message
    assert "DUETIME_DATABASE_URL" in info.value.message
