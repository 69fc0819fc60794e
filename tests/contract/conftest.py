"""The contract suite: every case runs against the in-memory store and PostgreSQL (one database,
and the 16 shards split over two), so ``MemoryStore`` cannot drift from ``PostgresStore``.

The PostgreSQL stores run on databases of the suite's own: cases here leave due and claimed
rows behind (a lapsed claim is claimable again), and an engine of another suite sharing a database
would claim them.

A case sees the store only through the ports (``Registry``, ``RunStore`` and the others); what it
reads of a row it reads through them too. Time is real (leases of a fraction of a second lapse by
sleeping), so the same case holds for both stores.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Protocol

import pytest

from duetime.core.model import CronSchedule, JobSpec, OneOffSchedule, WebhookTarget
from duetime.storage.memory import MemoryStore
from duetime.storage.ports import (
    DueAge,
    EventOutbox,
    FlowControl,
    Membership,
    Registry,
    Retention,
    RunStore,
    TargetHealth,
)
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.conftest import _create_db, _drop_db


class Store(
    Registry, RunStore, EventOutbox, FlowControl, TargetHealth, Membership, Retention, DueAge, Protocol
):
    """The ports, as the composition root's store offers them."""


@pytest.fixture(scope="session")
async def contract_dsns(run_tag: str) -> AsyncIterator[tuple[str, str, str]]:
    """Three migrated databases: one holding all 16 shards, two holding 8 each."""
    names = [f"duetime_test_{run_tag}_contract{suffix}" for suffix in ("", "_a", "_b")]
    dsns = [await _create_db(n) for n in names]
    yield dsns[0], dsns[1], dsns[2]
    for n in names:
        await _drop_db(n)


@pytest.fixture(params=["memory", "pg-one-db", "pg-two-dbs"])
async def store(request: pytest.FixtureRequest, contract_dsns: tuple[str, str, str]) -> AsyncIterator[Store]:
    if request.param == "memory":
        memory = MemoryStore()
        yield memory
        await memory.close()
        return
    if request.param == "pg-one-db":
        shard_map = ShardMap.single(contract_dsns[0])
    else:
        _, a, b = contract_dsns
        shard_map = ShardMap.from_dsns([a] * 8 + [b] * 8)
    pg = await PostgresStore.open(shard_map, pool_size=4)
    yield pg
    await pg.close()


def new_owner() -> str:
    return "o_" + uuid.uuid4().hex[:10]


def engine_id() -> str:
    """Each case claims as an engine of its own: the PostgreSQL databases are shared by cases."""
    return "e_" + uuid.uuid4().hex[:8]


def now() -> datetime:
    return datetime.now(UTC)


def one_off(at: datetime, **kw: object) -> JobSpec:
    return JobSpec(
        target=WebhookTarget(url="https://example.com/hook", headers={"X-Secret": "s3cret"}),
        schedule=OneOffSchedule(run_at=at),
        **kw,  # type: ignore[arg-type]
    )


def cron(expr: str, **kw: object) -> JobSpec:
    return JobSpec(
        target=WebhookTarget(url="https://example.com/hook"),
        schedule=CronSchedule(cron=expr, timezone="UTC"),
        **kw,  # type: ignore[arg-type]
    )
