"""``duetime cluster status [--json]`` as a user runs it (api-v1.md, "Additions: the cluster"): a
real process against a real membership on the home database."""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from duetime.storage.ports import Registration
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.conftest import _create_db, _drop_db
from tests.processes.test_cli import _env, duetime

# Its databases are its own (not pg_dsn) and it runs the command as a process.
pytestmark = [pytest.mark.pg, pytest.mark.processes]

ALL = frozenset(range(16))


@pytest.fixture
async def pair(run_tag: str) -> AsyncIterator[tuple[str, str]]:
    """Two databases of this test's own: the membership must hold only this test's engines."""
    names = [f"duetime_test_{run_tag}_cs{secrets.token_hex(3)}" for _ in range(2)]
    dsns = (await _create_db(names[0]), await _create_db(names[1]))
    yield dsns
    for n in names:
        await _drop_db(n)


@pytest.fixture
async def members(pair: tuple[str, str]) -> AsyncIterator[PostgresStore]:
    a, b = pair
    store = await PostgresStore.open(ShardMap.from_dsns([a] * 8 + [b] * 8), pool_size=2)
    yield store
    await store.close()


def _shard_dsns(pair: tuple[str, str]) -> str:
    return f"0-7={pair[0]},8-15={pair[1]}"


async def _member(
    members: PostgresStore, engine_id: str, serving: set[int], *, lease_s: float = 30.0
) -> Registration:
    reg = Registration(engine_id, "host-" + engine_id, ALL, lease_s, 2, uuid.uuid4())
    await members.join_engine(reg)
    await members.heartbeat_engine(reg, serving)
    return reg


async def test_json_is_one_object_with_every_shard_and_the_under_replicated_ones(
    pair: tuple[str, str], members: PostgresStore, tmp_path: Path
) -> None:
    await _member(members, "e-a", set(range(0, 12)))
    await _member(members, "e-b", set(range(4, 16)))
    await _member(members, "e-dead", set(range(16)), lease_s=0.2)
    await asyncio.sleep(0.4)  # e-dead's heartbeat is now older than its lease
    env = _env(DUETIME_SHARD_DSNS=_shard_dsns(pair))
    code, out, err = await duetime("cluster", "status", "--json", env=env, cwd=tmp_path)
    assert code == 0, err
    status = json.loads(out)  # the whole of stdout is one JSON object
    assert set(status) == {"replicas", "engines", "shards", "under_replicated"}
    assert status["replicas"] == 2
    assert [e["id"] for e in status["engines"]] == ["e-a", "e-b"], "only live engines"
    assert set(status["engines"][0]) == {"id", "heartbeat_age_s", "shards"}
    assert status["engines"][0]["shards"] == list(range(0, 12))
    assert all(0 <= e["heartbeat_age_s"] < 5 for e in status["engines"])
    assert list(status["shards"]) == [str(s) for s in range(16)]
    assert status["shards"]["0"] == ["e-a"] and status["shards"]["5"] == ["e-a", "e-b"]
    assert status["shards"]["15"] == ["e-b"]
    assert status["under_replicated"] == [0, 1, 2, 3, 12, 13, 14, 15]


async def test_replicas_come_from_the_same_setting_as_the_engines(
    pair: tuple[str, str], members: PostgresStore, tmp_path: Path
) -> None:
    await _member(members, "solo", set(range(16)))
    env = _env(DUETIME_SHARD_DSNS=_shard_dsns(pair), DUETIME_SHARD_REPLICAS="1")
    code, out, err = await duetime("cluster", "status", "--json", env=env, cwd=tmp_path)
    assert code == 0, err
    status = json.loads(out)
    assert status["replicas"] == 1 and status["under_replicated"] == []
    env["DUETIME_SHARD_REPLICAS"] = "3"
    code, out, _ = await duetime("cluster", "status", "--json", env=env, cwd=tmp_path)
    assert json.loads(out)["under_replicated"] == list(range(16))


async def test_the_table_names_engines_the_dead_and_the_shards_without_an_engine(
    pair: tuple[str, str], members: PostgresStore, tmp_path: Path
) -> None:
    await _member(members, "pinned", set(range(8)))
    await _member(members, "gone", set(range(16)), lease_s=0.2)
    await asyncio.sleep(0.4)
    env = _env(DUETIME_SHARD_DSNS=_shard_dsns(pair))
    code, out, err = await duetime("cluster", "status", env=env, cwd=tmp_path)
    assert code == 0, err
    assert "live engines: 1" in out
    assert "pinned" in out and "DEAD" in out and "gone" in out
    line_of_shard_9 = next(line for line in out.splitlines() if line.startswith("9 "))
    assert "NO ENGINE" in line_of_shard_9
    assert "under-replicated shards: 0, 1, 2" in out


async def test_an_empty_membership_is_every_shard_under_replicated(
    pair: tuple[str, str], members: PostgresStore, tmp_path: Path
) -> None:
    env = _env(DUETIME_SHARD_DSNS=_shard_dsns(pair))
    code, out, _ = await duetime("cluster", "status", "--json", env=env, cwd=tmp_path)
    assert code == 0
    assert json.loads(out) == {
        "replicas": 2,
        "engines": [],
        "shards": {str(s): [] for s in range(16)},
        "under_replicated": list(range(16)),
    }


async def test_a_database_that_does_not_answer_fails_with_exit_1(tmp_path: Path) -> None:
    env = _env(DUETIME_DATABASE_URL="postgresql://root@127.0.0.1:9/duetime")
    code, out, err = await duetime("cluster", "status", "--json", env=env, cwd=tmp_path)
    assert code == 1, (code, out, err)
    assert out == "" and "Traceback" not in err
    assert err.startswith("duetime: ") and "127.0.0.1" in err


async def test_no_database_named_is_a_settings_error(tmp_path: Path) -> None:
    code, _, err = await duetime("cluster", "status", env=_env(DUETIME_DATA_DIR=str(tmp_path)), cwd=tmp_path)
    assert code == 2 and "DUETIME_DATABASE_URL" in err
