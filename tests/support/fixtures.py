"""Fixtures the test folders share (imported by tests/database/conftest.py and
tests/processes/conftest.py): a loopback receiver, an in-process node on the run's database and an
owner on it, and ``own_db``, a fresh database for a test that runs an engine: an engine claims
every due row in its database, and must never fire another test's jobs (some name public
addresses).

For the API's tests on the module's database (tests/database): ``store``, a ``PostgresStore`` on
``pg_dsn``, ``client``, the HTTP API over it with the default policy, ``db``, a plain connection
to the same database, and ``api_owner``, a fresh owner with its key. A module that needs another
API (other limits or policy) builds its own with ``serve``.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import NamedTuple

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from duetime.api.app import create_app
from duetime.app import Node
from duetime.core.ssrf import AddressPolicy
from duetime.storage.ports import Registry
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.conftest import _create_db, _drop_db
from tests.support.node import Owner, fast_settings
from tests.support.receiver import Receiver

Client = TestClient[web.Request, web.Application]


class ApiOwner(NamedTuple):
    """An owner of the API's tests: its name and the headers that authenticate it."""

    name: str
    headers: dict[str, str]


async def api_owner(store: Registry, prefix: str = "owner") -> ApiOwner:
    """A fresh owner and its API key: every test works in owners of its own."""
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    api_key, _ = await store.create_api_key(name)
    return ApiOwner(name, {"Authorization": f"Bearer {api_key}"})


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[Client]:
    """``app`` on a loopback port, and a client of it."""
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client


@pytest.fixture(scope="module")
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    """The module's database behind the real store, shared by its tests (as ``pg_dsn`` is)."""
    opened = await PostgresStore.open(ShardMap.single(pg_dsn))
    yield opened
    await opened.close()


@pytest.fixture(scope="module")
async def client(store: PostgresStore) -> AsyncIterator[Client]:
    """The HTTP API over ``store``, with the default address policy (public targets only)."""
    async with serve(create_app(store, policy=AddressPolicy())) as c:
        yield c


@pytest.fixture
async def db(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection to the module's database, for what the API cannot set up or show."""
    conn = await asyncpg.connect(pg_dsn)
    yield conn
    await conn.close()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    await r.start()
    yield r
    await r.stop()


@pytest.fixture
async def node(pg_dsn: str) -> AsyncIterator[Node]:
    n = Node(fast_settings(pg_dsn))
    await n.start()
    yield n
    await n.stop()


@pytest.fixture
async def owner(node: Node) -> AsyncIterator[Owner]:
    import uuid

    assert node.store is not None and node.url is not None
    name = "e2e_" + uuid.uuid4().hex[:8]
    key, secret = await node.store.create_api_key(name)
    async with aiohttp.ClientSession() as http:
        o = Owner(name, key, secret, http, node.url)
        yield o
        await o.cancel_all()


@pytest.fixture
async def own_db(run_tag: str) -> AsyncIterator[str]:
    name = f"duetime_test_{run_tag}_s{secrets.token_hex(3)}"
    dsn = await _create_db(name)
    yield dsn
    await _drop_db(name)
