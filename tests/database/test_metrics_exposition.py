"""/metrics of every kind of process: the same content type, duetime_build_info, no *_created
series; and the per-shard age of the oldest due row no engine has claimed."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from duetime._version import __version__
from duetime.app import Node
from duetime.core.ids import shard_of
from duetime.core.model import JobSpec, OneOffSchedule, WebhookTarget
from duetime.engine.due_age import DueAgeSampler
from duetime.exposition import METRICS_CONTENT_TYPE
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.conftest import _create_db, _drop_db
from tests.support.node import fast_settings

pytestmark = pytest.mark.pg  # also a database of its own, besides pg_dsn


@pytest.fixture
async def own_db(run_tag: str) -> AsyncIterator[str]:
    """A database with no engine on it: its due rows stay unclaimed."""
    name = f"duetime_test_{run_tag}_due_{uuid.uuid4().hex[:6]}"
    dsn = await _create_db(name)
    yield dsn
    await _drop_db(name)


async def _scrape(url: str) -> tuple[str, str]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        return resp.headers["Content-Type"], await resp.text()


@pytest.mark.parametrize("role", ["api+engine+workers", "engine", "worker-less api"])
async def test_every_process_serves_build_info_in_one_content_type_without_created(
    pg_dsn: str, role: str
) -> None:
    parts = {
        "api+engine+workers": {},
        "engine": {"api": False},
        "worker-less api": {"engine": False, "workers": False},
    }[role]
    node = Node(fast_settings(pg_dsn), **parts)  # type: ignore[arg-type]
    await node.start()
    try:
        assert node.url is not None
        for _ in range(50):  # the engine's sampler reads its first values just after the start
            content_type, text = await _scrape(node.url)
            if "duetime_oldest_unclaimed_due_seconds{" in text or not parts.get("engine", True):
                break
            await asyncio.sleep(0.1)
    finally:
        await node.stop()
    assert content_type == METRICS_CONTENT_TYPE
    assert f'duetime_build_info{{version="{__version__}"}} 1.0' in text.splitlines()
    assert not [line for line in text.splitlines() if re.match(r"\w+_created[ {]", line)]
    if parts.get("engine", True):
        assert re.search(r'^duetime_oldest_unclaimed_due_seconds\{shard="15"\} ', text, re.M), text


async def test_the_oldest_unclaimed_due_row_is_measured_per_shard(own_db: str) -> None:
    store = await PostgresStore.open(ShardMap.single(own_db), pool_size=2)
    try:
        await store.create_api_key("due_age")
        past = datetime.now(UTC) - timedelta(seconds=30)
        job, _ = await store.create_job(
            "due_age",
            JobSpec(target=WebhookTarget(url="https://example.com/h"), schedule=OneOffSchedule(past)),
        )
        later, _ = await store.create_job(
            "due_age",
            JobSpec(
                target=WebhookTarget(url="https://example.com/h"),
                schedule=OneOffSchedule(datetime.now(UTC) + timedelta(hours=1)),
            ),
        )
        shard = shard_of(uuid.UUID(job.id))
        # a past run_at runs "now"; make it due 30 s ago, as a row nobody claimed would be
        await store.pool_for_shard(shard).execute(
            "UPDATE jobs SET next_run_at = now() - interval '30 seconds' WHERE job_id = $1", uuid.UUID(job.id)
        )
        readings = {r.shard: r.oldest_age_s for r in await store.oldest_unclaimed_due(range(16))}
        assert set(readings) == set(range(16))
        assert 29 <= readings[shard] < 60
        # a row due in an hour does not count; every other shard has nothing waiting
        assert all(age == 0 for s, age in readings.items() if s != shard)
        assert later.next_run_at is not None
        # the sampler puts the reading into the gauge, only for the shards it was given
        sampler = DueAgeSampler(store, [shard], interval_s=1)
        assert [r.shard for r in await sampler.sample()] == [shard]
        _, text = await _scrape_registry()
        found = re.search(rf'^duetime_oldest_unclaimed_due_seconds\{{shard="{shard}"\}} (\S+)', text, re.M)
        assert found is not None, text
        value = float(found.group(1))
        assert 29 <= value < 60
        # once an engine has claimed it, it no longer counts
        await store.pool_for_shard(shard).execute(
            "UPDATE jobs SET phase = 'claimed', claimed_by = 'test' WHERE job_id = $1", uuid.UUID(job.id)
        )
        readings = {r.shard: r.oldest_age_s for r in await store.oldest_unclaimed_due([shard])}
        assert readings == {shard: 0.0}
    finally:
        await store.close()


async def _scrape_registry() -> tuple[str, str]:
    from prometheus_client import REGISTRY, generate_latest

    return METRICS_CONTENT_TYPE, generate_latest(REGISTRY).decode()
