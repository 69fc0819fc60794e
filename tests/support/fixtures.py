"""Fixtures the test folders share (imported by tests/database/conftest.py and
tests/processes/conftest.py): a loopback receiver, an in-process node on the run's database and an
owner on it, and ``own_db``, a fresh database for a test that runs an engine: an engine claims
every due row in its database, and must never fire another test's jobs (some name public
addresses)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import aiohttp
import pytest

from duetime.app import Node
from tests.conftest import _create_db, _drop_db
from tests.support.node import Owner, fast_settings
from tests.support.receiver import Receiver


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
