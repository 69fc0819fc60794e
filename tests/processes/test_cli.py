"""The ``duetime`` command as a user runs it: real processes, real databases, exit codes and output."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from duetime.cli import ensure_dev_key
from duetime.embedded_pg import candidate_bindirs
from duetime.storage.migrate import migration_files
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.conftest import ADMIN_DSN, _dsn_for

REPO = Path(__file__).resolve().parents[2]


def _env(**settings: str) -> dict[str, str]:
    """The caller's environment without its DUETIME_* settings, plus the given ones."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    env.update(settings)
    return env


async def duetime(*args: str, env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "duetime",
        *args,
        env=env,
        cwd=str(cwd),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _one_line_error(code: int, out: str, err: str, *, status: int = 2) -> str:
    """One ``duetime: …`` line on stderr and ``status``: 2 for a usage or settings error, 1 for an
    operation that failed (a database that does not answer, a refused action)."""
    assert code == status, (code, out, err)
    assert out == ""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("duetime: ")
    return lines[0]


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=2)
    yield s
    await s.close()


# --- keys -----------------------------------------------------------------------------------------


async def test_keys_create_json_prints_exactly_the_three_fields(
    pg_dsn: str, store: PostgresStore, tmp_path: Path
) -> None:
    owner = f"cli-{secrets.token_hex(3)}"
    code, out, err = await duetime(
        "keys", "create", "--owner", owner, "--json", env=_env(DUETIME_DATABASE_URL=pg_dsn), cwd=tmp_path
    )
    assert code == 0, err
    assert out.count("\n") == 1, "the JSON alone, on one line"
    body = json.loads(out)
    assert set(body) == {"owner", "api_key", "signing_secret"}
    assert body["owner"] == owner
    assert await store.owner_for_key(body["api_key"]) == owner
    assert await store.signing_secret(owner) == body["signing_secret"]

    # A second key for the same owner keeps the owner's signing secret.
    code, out, _ = await duetime(
        "keys", "create", "--owner", owner, "--json", env=_env(DUETIME_DATABASE_URL=pg_dsn), cwd=tmp_path
    )
    again = json.loads(out)
    assert again["api_key"] != body["api_key"]
    assert again["signing_secret"] == body["signing_secret"]


async def test_keys_create_and_revoke_for_a_person(pg_dsn: str, store: PostgresStore, tmp_path: Path) -> None:
    owner = f"cli.{secrets.token_hex(3)}"
    env = _env(DUETIME_DATABASE_URL=pg_dsn)
    code, out, err = await duetime("keys", "create", "--owner", owner, env=env, cwd=tmp_path)
    assert code == 0, err
    first = out.splitlines()[0]
    assert first.startswith(f'API key for owner "{owner}": ')
    api_key = first.rsplit(" ", 1)[1]
    assert await store.owner_for_key(api_key) == owner
    assert "signing secret" in out

    code, out, err = await duetime("keys", "revoke", api_key, env=env, cwd=tmp_path)
    assert (code, out.strip()) == (0, "revoked 1 API key"), err
    assert await store.owner_for_key(api_key) is None
    code, out, err = await duetime("keys", "revoke", api_key, env=env, cwd=tmp_path)
    assert code == 1
    assert "no active API key" in err


@pytest.mark.parametrize("owner", ["", "x" * 65, "with space", "slash/es", "ünïcode"])
async def test_keys_create_refuses_bad_owner_names(owner: str, tmp_path: Path) -> None:
    code, out, err = await duetime(
        "keys", "create", "--owner", owner, env=_env(DUETIME_DATABASE_URL=ADMIN_DSN), cwd=tmp_path
    )
    assert code == 2
    assert out == ""
    assert "not a valid owner name" in err
    assert "Traceback" not in err


async def test_keys_without_any_database_says_what_to_set(tmp_path: Path) -> None:
    code, out, err = await duetime("keys", "create", "--owner", "a", env=_env(), cwd=tmp_path)
    line = _one_line_error(code, out, err)
    assert "DUETIME_DATABASE_URL is not set" in line


# --- migrate --------------------------------------------------------------------------------------


@pytest.fixture
async def empty_databases(run_tag: str) -> AsyncIterator[list[str]]:
    names = [f"duetime_test_{run_tag}_cli_{i}_{secrets.token_hex(2)}" for i in range(2)]
    conn = await asyncpg.connect(ADMIN_DSN)
    try:
        for name in names:
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    yield [_dsn_for(n) for n in names]
    conn = await asyncpg.connect(ADMIN_DSN)
    try:
        for name in names:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def test_migrate_applies_to_every_database_of_the_shard_map_once(
    empty_databases: list[str], tmp_path: Path
) -> None:
    a, b = empty_databases
    env = _env(DUETIME_SHARD_DSNS=f"0-7={a},8-15={b}")
    code, out, err = await duetime("migrate", env=env, cwd=tmp_path)
    assert code == 0, err
    every = ", ".join(name for _, name, _ in migration_files())  # all of them, in order
    assert out.splitlines() == [
        f"{a} (shards 0-7): applied {every}",
        f"{b} (shards 8-15): applied {every}",
    ]
    code, out, err = await duetime("migrate", env=env, cwd=tmp_path)
    assert code == 0, err
    assert out.splitlines() == [
        f"{a} (shards 0-7): already up to date",
        f"{b} (shards 8-15): already up to date",
    ]
    for dsn in (a, b):
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == len(migration_files())
        finally:
            await conn.close()


# --- friendly failures ----------------------------------------------------------------------------


async def test_bad_shard_dsns_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = _env(DUETIME_SHARD_DSNS="0-7=postgresql://u:hunter2@a/db")
    code, out, err = await duetime("migrate", env=env, cwd=tmp_path)
    line = _one_line_error(code, out, err)
    assert "DUETIME_SHARD_DSNS=" in line
    assert "shards 8-15 are not mapped" in line
    assert "hunter2" not in err


async def test_a_database_that_does_not_answer_is_one_line_and_exit_1(tmp_path: Path) -> None:
    env = _env(DUETIME_DATABASE_URL="postgresql://root@127.0.0.1:9/duetime")
    code, out, err = await duetime("migrate", env=env, cwd=tmp_path)
    line = _one_line_error(code, out, err, status=1)
    assert "127.0.0.1" in line


async def test_a_database_that_does_not_exist_is_one_line_and_exit_1(tmp_path: Path) -> None:
    env = _env(DUETIME_DATABASE_URL=_dsn_for(f"duetime_missing_{secrets.token_hex(4)}"))
    code, out, err = await duetime("keys", "create", "--owner", "a", env=env, cwd=tmp_path)
    line = _one_line_error(code, out, err, status=1)
    assert "does not exist" in line


async def test_bad_shards_option_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = await duetime("engine", "--shards", "0-16", env=_env(), cwd=tmp_path)
    assert code == 2
    assert "--shards" in err
    assert "goes past 15" in err


async def test_unknown_settings_are_warned_about(pg_dsn: str, tmp_path: Path) -> None:
    env = _env(DUETIME_DATABASE_URL=pg_dsn, DUETIME_HTTP_PRT="1")
    code, _, err = await duetime("migrate", env=env, cwd=tmp_path)
    assert code == 0, err
    assert "DUETIME_HTTP_PRT is not a Duetime setting" in err
    assert "did you mean DUETIME_HTTP_PORT?" in err


# --- the dev key ----------------------------------------------------------------------------------


async def test_dev_key_is_reused_while_the_database_knows_it(store: PostgresStore, tmp_path: Path) -> None:
    path = tmp_path / "state" / "dev-key"
    key, secret = await ensure_dev_key(store, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert await store.owner_for_key(key) == "dev"
    assert await ensure_dev_key(store, path) == (key, secret)

    await store.revoke_api_key(key)
    replaced, same_secret = await ensure_dev_key(store, path)
    assert replaced != key
    assert same_secret == secret, "the owner keeps its signing secret"
    assert json.loads(path.read_text())["api_key"] == replaced

    path.write_text("not json")
    assert (await ensure_dev_key(store, path))[0] not in (key, replaced)


# --- duetime run, end to end ----------------------------------------------------------------------


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A data dir the embedded server's unprivileged user can reach (tmp_path is mode 700)."""
    path = Path(tempfile.mkdtemp(prefix="duetime-cli-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Served:
    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self.lines: list[str] = []

    async def read_until(self, prefix: str) -> str:
        assert self.proc.stdout is not None
        while True:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), 90)
            if not raw:
                raise AssertionError(
                    f"duetime run ended before printing {prefix!r}: {self.lines}\n{self.log.read_text()}"
                )
            line = raw.decode().rstrip("\n")
            self.lines.append(line)
            if line.startswith(prefix):
                return line

    async def stop(self, sig: signal.Signals) -> int:
        self.proc.send_signal(sig)
        return await asyncio.wait_for(self.proc.wait(), 90)


async def _start_run(data_dir: Path) -> Served:
    env = _env(DUETIME_DATA_DIR=str(data_dir), DUETIME_HTTP_PORT="0", DUETIME_SHUTDOWN_GRACE_S="2")
    log = data_dir.parent / "stderr.log"
    with log.open("ab") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "duetime",
            "run",
            env=env,
            cwd=str(data_dir.parent),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
    return Served(proc, log)


@pytest.mark.skipif(not candidate_bindirs(), reason="PostgreSQL server programs not installed")
@pytest.mark.pg
@pytest.mark.processes
async def test_run_serves_on_an_embedded_database_and_stops_it(open_dir: Path) -> None:
    data_dir = open_dir / ".duetime"
    served = await _start_run(data_dir)
    try:
        url = (await served.read_until("Duetime is serving ")).split()[-1]
        key = (await served.read_until('API key for owner "dev": ')).split()[-1]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/healthz") as resp:
                assert resp.status == 200
            async with http.get(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {key}"}) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["items"] == []

        # keys and migrate find the embedded database of the running `duetime run` by themselves.
        env = _env(DUETIME_DATA_DIR=str(data_dir))
        code, out, err = await duetime("keys", "create", "--owner", "alice", "--json", env=env, cwd=open_dir)
        assert code == 0, err
        assert json.loads(out)["owner"] == "alice"

        # A second `duetime run` on the same data dir is refused while this one runs.
        code, out, err = await duetime("run", env=env, cwd=open_dir)
        line = _one_line_error(code, out, err, status=1)
        assert "already running the embedded PostgreSQL" in line
    finally:
        if served.proc.returncode is None:
            assert await served.stop(signal.SIGTERM) == 0
    pgdata = data_dir / "pg" / "data"
    assert not (pgdata / "postmaster.pid").exists(), "the database stops with duetime"

    # A restart prints the same dev key; SIGINT stops it as cleanly as SIGTERM.
    served = await _start_run(data_dir)
    try:
        assert (await served.read_until('API key for owner "dev": ')).split()[-1] == key
    finally:
        if served.proc.returncode is None:
            assert await served.stop(signal.SIGINT) == 0
    assert not (pgdata / "postmaster.pid").exists()


async def test_separate_workers_need_the_nats_run_queue(tmp_path: Path) -> None:
    env = _env(DUETIME_DATABASE_URL=ADMIN_DSN)
    code, out, err = await duetime("worker", env=env, cwd=tmp_path)
    line = _one_line_error(code, out, err)
    assert "DUETIME_RUN_QUEUE='inprocess'" in line
    assert "duetime engine" in line


@pytest.mark.parametrize("command", ["api", "engine"])
async def test_parts_without_a_database_say_what_to_set(command: str, tmp_path: Path) -> None:
    code, out, err = await duetime(command, env=_env(), cwd=tmp_path)
    line = _one_line_error(code, out, err)
    assert "DUETIME_DATABASE_URL is not set" in line


# --- keys list, rotate-secret; exit statuses ------------------------------------------------------


async def test_keys_list_shows_prefixes_never_keys(pg_dsn: str, store: PostgresStore, tmp_path: Path) -> None:
    owner = f"list-{secrets.token_hex(3)}"
    first, _ = await store.create_api_key(owner)
    second, _ = await store.create_api_key(owner)
    await store.revoke_api_key(second)
    env = _env(DUETIME_DATABASE_URL=pg_dsn)
    code, out, err = await duetime("keys", "list", "--owner", owner, "--json", env=env, cwd=tmp_path)
    assert code == 0, err
    listed = json.loads(out)
    assert [k["prefix"] for k in listed] == [first[:10]]
    assert listed[0]["owner"] == owner and listed[0]["revoked_at"] is None
    assert listed[0]["created_at"].endswith("Z")
    code, out, err = await duetime("keys", "list", "--owner", owner, "--all", env=env, cwd=tmp_path)
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == ["PREFIX", "OWNER", "CREATED_AT", "REVOKED_AT"]
    assert sorted(r.split()[0] for r in rows) == sorted([first[:10], second[:10]])
    assert first not in out and second not in out  # the whole key is never shown


async def test_keys_rotate_secret_json_and_its_failures(
    pg_dsn: str, store: PostgresStore, tmp_path: Path
) -> None:
    from datetime import UTC, datetime, timedelta

    owner = f"rot-{secrets.token_hex(3)}"
    _, old = await store.create_api_key(owner)
    env = _env(DUETIME_DATABASE_URL=pg_dsn)
    code, out, err = await duetime(
        "keys", "rotate-secret", "--owner", owner, "--grace", "2h", "--json", env=env, cwd=tmp_path
    )
    assert code == 0, err
    body = json.loads(out)
    assert set(body) == {"owner", "signing_secret", "previous_valid_until"}
    assert body["owner"] == owner and body["signing_secret"].startswith("whsec_")
    assert body["signing_secret"] != old
    until = datetime.fromisoformat(body["previous_valid_until"].replace("Z", "+00:00"))
    assert abs(until - (datetime.now(UTC) + timedelta(hours=2))) < timedelta(minutes=1)
    keys = await store.signing_keys(owner)
    assert keys is not None and (keys.current, keys.previous) == (body["signing_secret"], old)
    # an owner that does not exist: the operation fails (1); a bad duration: usage (2)
    code, out, err = await duetime("keys", "rotate-secret", "--owner", "nobody-here", env=env, cwd=tmp_path)
    assert "no owner 'nobody-here'" in _one_line_error(code, out, err, status=1)
    code, out, err = await duetime(
        "keys", "rotate-secret", "--owner", owner, "--grace", "soon", env=env, cwd=tmp_path
    )
    assert code == 2 and "not a duration" in err


async def test_the_clients_variables_draw_no_warning(pg_dsn: str, tmp_path: Path) -> None:
    env = _env(DUETIME_DATABASE_URL=pg_dsn, DUETIME_URL="http://x:1", DUETIME_API_KEY="dt_x")
    code, _, err = await duetime("migrate", env=env, cwd=tmp_path)
    assert code == 0, err
    assert "not a Duetime setting" not in err


async def test_shards_move_dry_run_changes_nothing_and_the_move_reports_progress(
    empty_databases: list[str], tmp_path: Path
) -> None:
    from duetime.core.ids import shard_of
    from duetime.core.model import CronSchedule, JobSpec, WebhookTarget

    a, b = empty_databases
    env = _env(DUETIME_DATABASE_URL=a)
    assert (await duetime("migrate", env=env, cwd=tmp_path))[0] == 0
    store = await PostgresStore.open(ShardMap.single(a), pool_size=2)
    try:
        await store.create_api_key("mover")
        on_three = 0
        while on_three < 3:
            job, _ = await store.create_job(
                "mover",
                JobSpec(target=WebhookTarget(url="https://example.com/m"), schedule=CronSchedule("@yearly")),
            )
            on_three += shard_of(__import__("uuid").UUID(job.id)) == 3
    finally:
        await store.close()
    code, out, err = await duetime(
        "shards", "move", "--shard", "3", "--to", b, "--dry-run", env=env, cwd=tmp_path
    )
    assert code == 0, err
    assert "nothing will be changed" in out
    assert "would move shard 3: 3 jobs, 0 runs, 0 idempotency keys" in out
    conn = await asyncpg.connect(b)
    try:
        assert await conn.fetchval("SELECT to_regclass('jobs')") is None  # not even migrated
    finally:
        await conn.close()
    code, out, err = await duetime("shards", "move", "--shard", "3", "--to", b, env=env, cwd=tmp_path)
    assert code == 0, err
    lines = out.splitlines()
    steps = [line.strip() for line in lines if line.startswith("  ")]
    assert steps[0].startswith("locking the source tables")
    assert "copied 3 jobs" in steps and "deleting the shard's rows at the source" in steps
    assert any(line.startswith("moved shard 3: 3 jobs") for line in lines)
    # a second move finds the target holding the shard: refused, the operation failed (1)
    code, out, err = await duetime(
        "shards", "move", "--shard", "3", "--to", b, "--dry-run", env=env, cwd=tmp_path
    )
    assert code == 1 and "already holds rows of shard 3" in err
