"""The membership keeper over the in-memory store: no database, the same dealing. Two engines
share the shards; when one leaves, the other serves them all; a second process under a live
engine's id is refused. (It stood on the PostgreSQL store's own class before the Membership port:
this could not run without a database.)"""

from __future__ import annotations

import uuid

import pytest

from duetime.core.ids import SHARDS
from duetime.engine.membership import EngineIdInUse, MembershipKeeper
from duetime.engine.service import Engine, EngineConfig
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.memory import MemoryStore
from duetime.storage.ports import Registration
from tests.support.wait import until

ALL = frozenset(range(SHARDS))


class _Node:
    """An engine and its membership keeper on ``store`` (no workers: nothing is due)."""

    def __init__(self, store: MemoryStore, engine_id: str) -> None:
        self.leases = LeaseKeeper(store, lease_s=5, heartbeat_s=1)
        config = EngineConfig(engine_id=engine_id, poll_interval_s=0.05, lease_s=5, janitor_interval_s=0.2)
        self.engine = Engine(store, InProcessRunQueue(100), self.leases, config)
        reg = Registration(engine_id, "host", ALL, 5.0, 1, uuid.uuid4())
        self.members = MembershipKeeper(store, reg, interval_s=0.1, id_lock=store.engine_id_lock(engine_id))

    async def start(self) -> None:
        self.leases.start()
        await self.engine.start(await self.members.join())
        await self.members.start(self.engine)

    async def stop(self) -> None:
        await self.members.stop()
        await self.engine.stop()
        await self.leases.stop()


async def test_two_engines_deal_the_shards_and_one_takes_them_all_when_the_other_leaves() -> None:
    store = MemoryStore()
    a, b = _Node(store, "e-a"), _Node(store, "e-b")
    await a.start()
    await b.start()
    try:

        def dealt_between_them() -> bool:
            ours, theirs = a.engine.serving, b.engine.serving
            return bool(ours) and bool(theirs) and not ours & theirs and ours | theirs == ALL

        await until(dealt_between_them, within=10, what="the 16 shards dealt once between two engines")
        listed = {r.engine_id: r for r in await store.list_engines()}
        assert set(listed) == {"e-a", "e-b"} and all(r.live for r in listed.values())
        await b.stop()
        await until(lambda: a.engine.serving == ALL, within=10, what="the remaining engine to serve all")
        assert [r.engine_id for r in await store.list_engines()] == ["e-a"]
    finally:
        await a.stop()


async def test_a_second_process_under_a_live_engines_id_is_refused() -> None:
    store = MemoryStore()
    first = _Node(store, "e-same")
    await first.start()
    try:
        second = _Node(store, "e-same")
        with pytest.raises(EngineIdInUse, match="e-same"):
            await second.members.join()
    finally:
        await first.stop()
    # gone (its lock released with it), the id may be used again
    third = _Node(store, "e-same")
    await third.start()
    await third.stop()
