"""API keys: random enough, stored only as hashes, looked up in a way that leaks nothing about
them through timing, revocable from the command line, and scoped to one owner on every call.

The owner-isolation matrix itself lives in tests/database/test_api.py (``JOB_CALLS``); here a
test proves the matrix names every ``/v1/jobs/{id}…`` route the application serves, so a new
endpoint cannot escape it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from duetime.api.app import create_app
from duetime.core.ssrf import AddressPolicy
from duetime.storage.postgres import PostgresStore
from duetime.storage.queries import Q
from duetime.storage.shardmap import ShardMap
from tests.faults.harness import NodeProc, node_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=2)
    yield s
    await s.close()


@pytest.fixture
async def db(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(pg_dsn)
    yield conn
    await conn.close()


async def test_keys_carry_192_random_bits_and_the_table_holds_only_their_hashes(
    store: PostgresStore, db: asyncpg.Connection
) -> None:
    owner = f"keys-{uuid.uuid4().hex[:8]}"
    keys = [(await store.create_api_key(owner))[0] for _ in range(200)]
    assert len(set(keys)) == len(keys)
    for key in keys:
        assert key.startswith("dt_")
        raw = base64.urlsafe_b64decode(key[3:] + "=" * (-len(key[3:]) % 4))
        assert len(raw) * 8 == 192
    # Over 200 keys every one of the 64 URL-safe characters shows up in the random part: no
    # position or alphabet restriction quietly shrinks the space.
    assert len(set("".join(k[3:] for k in keys))) == 64
    rows = await db.fetch(
        "SELECT *, row_to_json(k)::text AS everything FROM api_keys k WHERE owner = $1", owner
    )
    assert len(rows) == len(keys)
    by_hash = {bytes(r["key_hash"]): r for r in rows}
    for key in keys:
        row = by_hash[hashlib.sha256(key.encode()).digest()]
        assert key not in row["everything"], "the clear key is stored"
        assert key[3:] not in row["everything"]
        # The prefix (for `duetime keys revoke <prefix>`) shows 7 of the 32 random characters:
        # 42 of the 192 bits, leaving 150, above the 128 the key must keep secret.
        assert row["key_prefix"] == key[:10]
    columns = {
        r["column_name"]
        for r in await db.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'api_keys'"
        )
    }
    assert columns == {"key_hash", "key_prefix", "owner", "created_at", "revoked_at"}


async def test_the_lookup_is_an_index_probe_on_the_digest_never_on_the_key(
    store: PostgresStore, db: asyncpg.Connection
) -> None:
    """Why this is constant-time with respect to the key: the database never compares the key.
    It compares SHA-256(candidate) with stored digests inside a B-tree probe; how long that takes
    depends on the digest's bytes, and an attacker who could steer those toward a real key's
    digest would have a SHA-256 preimage. So a timing difference teaches nothing about any key."""
    sql = Q["owner_for_key"]
    assert "key_hash = $1" in sql and "key" not in sql.replace("key_hash", "").replace("api_keys", "")
    plan = "\n".join(r[0] for r in await db.fetch("EXPLAIN (COSTS OFF) " + sql.rstrip(";"), b"\x00" * 32))
    assert "Index Scan using api_keys_pkey" in plan, plan
    key, _ = await store.create_api_key(f"probe-{uuid.uuid4().hex[:6]}")
    assert await store.owner_for_key(key) is not None
    # A candidate one character off is simply another digest: not found, like any other.
    assert await store.owner_for_key(key[:-1] + ("A" if key[-1] != "A" else "B")) is None


async def test_the_api_keeps_no_clear_keys_in_its_cache(store: PostgresStore) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    key, _ = await store.create_api_key(f"cache-{uuid.uuid4().hex[:6]}")
    app = create_app(store, policy=AddressPolicy())
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        assert (await client.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"})).status == 200
        # the middleware that authenticates (the request-id middleware runs before it)
        cells = [
            c.cell_contents
            for middleware in app.middlewares
            for c in (middleware.__closure__ or ())  # type: ignore[attr-defined]
        ]
        [cache] = [c for c in cells if type(c).__name__ == "KeyCache"]
        assert list(cache._entries) == [hashlib.sha256(key.encode()).digest()]


async def _duetime(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "duetime",
        *args,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}, **env},
        cwd=str(ROOT),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.processes
async def test_a_key_revoked_from_the_command_line_stops_working_on_a_running_api(
    pg_dsn: str, tmp_path: Path
) -> None:
    env = {"DUETIME_DATABASE_URL": pg_dsn}
    code, out, err = await _duetime(
        "keys", "create", "--owner", f"rev-{uuid.uuid4().hex[:6]}", "--json", env=env
    )
    assert code == 0, err
    key = json.loads(out)["api_key"]
    api = NodeProc(node_env(pg_dsn), "api", tmp_path / "api.log")
    try:
        url = await api.ready()
        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/v1/jobs", headers=headers) as resp:
                assert resp.status == 200
            code, out, err = await _duetime("keys", "revoke", key[:10], env=env)  # by its prefix
            assert (code, out.strip()) == (0, "revoked 1 API key"), err
            revoked_at = time.monotonic()
            while True:
                async with http.get(url + "/v1/jobs", headers=headers) as resp:
                    if resp.status == 401:
                        break
                    assert resp.status == 200
                # the API caches a key's owner for 5 s (docs/security.md): allow that, and margin
                assert time.monotonic() - revoked_at < 15, "the revoked key still works"
                await asyncio.sleep(0.2)
    finally:
        await api.stop()
    assert key not in api.log.read_text(errors="replace"), "the API logged a key"


def test_the_isolation_matrix_covers_every_job_route() -> None:
    from tests.database.test_api import JOB_CALLS

    app = create_app(_NoRegistry(), policy=AddressPolicy())  # type: ignore[arg-type]
    served = set()
    for resource in app.router.resources():
        path = resource.canonical
        if path.startswith("/v1/jobs/{job_id}"):
            for route in resource:
                served.add((route.method, path.removeprefix("/v1/jobs/{job_id}")))
    covered = {(method, suffix) for method, suffix, _ in JOB_CALLS}
    assert served, "no job routes found"
    assert served <= covered, f"routes missing from the 404 matrix: {sorted(served - covered)}"


class _NoRegistry:
    """Building the router needs no database (the cursor key is read lazily, at the first list)."""

    async def cursor_key(self) -> bytes:
        raise AssertionError("building the router reads no key")
