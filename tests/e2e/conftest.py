from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from duetime.app import Node
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
