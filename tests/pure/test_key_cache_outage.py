"""The API's key cache while the home database is away: a key seen lately still names its owner
(requests that need only their job's primary go on), an unknown key is refused as before, and
past the stale bound the outage is answered as one (503)."""

from __future__ import annotations

import pytest

from duetime.api.auth import KeyCache
from duetime.core.errors import StorageUnavailable, Unauthorized
from duetime.storage.memory import MemoryStore


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_known_key_works_through_an_outage_of_the_home_database() -> None:
    store, clock = MemoryStore(), _Clock()
    key, _ = await store.create_api_key("alice")
    cache = KeyCache(store, ttl_s=60, clock=clock, stale_s=3600)
    assert await cache.owner_for(key) == "alice"
    store.available = False
    clock.now += 120  # past the TTL: the cache asks the database, which is away
    assert await cache.owner_for(key) == "alice"
    with pytest.raises(StorageUnavailable):
        await cache.owner_for("dt_never_seen_key")  # unknown: nothing to go on
    clock.now += 3600  # past the stale bound
    with pytest.raises(StorageUnavailable):
        await cache.owner_for(key)
    store.available = True
    assert await cache.owner_for(key) == "alice"


async def test_an_unknown_key_is_not_served_stale() -> None:
    store, clock = MemoryStore(), _Clock()
    cache = KeyCache(store, ttl_s=60, clock=clock)
    with pytest.raises(Unauthorized):
        await cache.owner_for("dt_nobody")
    store.available = False
    clock.now += 120
    with pytest.raises(StorageUnavailable):
        await cache.owner_for("dt_nobody")
