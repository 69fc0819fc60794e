"""The Membership port's contract (engine/membership.py stands on it), for every store: a member
joins, heartbeats what it serves and leaves; only its own incarnation's heartbeat counts; a silent
member lapses by its own lease and is forgotten later; an engine id's lock has one holder.

The PostgreSQL stores share their home database between cases: each case registers engines of
its own and reads only their rows."""

from __future__ import annotations

import uuid
from dataclasses import replace

from duetime.storage.ports import EngineRecord, Registration
from tests.contract.conftest import Store, engine_id
from tests.support.wait import until


def registration(*, lease_s: float = 30.0, allowed: frozenset[int] = frozenset({1, 2, 3})) -> Registration:
    return Registration(engine_id(), "host-a", allowed, lease_s, 2, uuid.uuid4())


async def record(store: Store, reg: Registration) -> EngineRecord | None:
    return next((r for r in await store.list_engines() if r.engine_id == reg.engine_id), None)


async def test_a_member_joins_heartbeats_what_it_serves_and_leaves(store: Store) -> None:
    reg = registration()
    await store.join_engine(reg)
    rec = await record(store, reg)
    assert rec is not None and rec.live
    assert (rec.host, rec.allowed, rec.serving) == ("host-a", frozenset({1, 2, 3}), frozenset())
    assert (rec.lease_s, rec.replicas, rec.incarnation) == (30.0, 2, reg.incarnation)
    assert rec.started_at == rec.heartbeat_at and 0 <= rec.heartbeat_age_s < 30
    assert rec.member().engine_id == reg.engine_id and rec.member().allowed == reg.allowed
    assert await store.heartbeat_engine(reg, [2, 1])
    assert (rec := await record(store, reg)) is not None and rec.serving == frozenset({1, 2})
    await store.set_engine_serving(reg, {3})
    assert (rec := await record(store, reg)) is not None and rec.serving == frozenset({3})
    ids = [r.engine_id for r in await store.list_engines()]
    assert ids == sorted(ids), "listed by id"
    await store.leave_engine(reg)
    assert await record(store, reg) is None


async def test_only_the_latest_incarnation_of_an_id_counts(store: Store) -> None:
    """A process that registered again under the id (a restart, or another process taking over)
    owns the row: the earlier one's heartbeats, serving reports and leave change nothing."""
    first = registration()
    await store.join_engine(first)
    second = replace(first, host="host-b", allowed=frozenset({0}), incarnation=uuid.uuid4())
    await store.join_engine(second)
    assert not await store.heartbeat_engine(first, {1})
    await store.set_engine_serving(first, {1})
    await store.leave_engine(first)
    rec = await record(store, second)
    assert rec is not None and (rec.incarnation, rec.host, rec.allowed) == (
        second.incarnation,
        "host-b",
        frozenset({0}),
    )
    assert rec.serving == frozenset()
    assert await store.heartbeat_engine(second, {0})
    await store.leave_engine(second)
    assert await record(store, second) is None
    assert not await store.heartbeat_engine(second, {0}), "a forgotten member's heartbeat is refused"


async def test_a_silent_member_lapses_by_its_own_lease_then_is_forgotten(store: Store) -> None:
    short, long = registration(lease_s=0.3), registration(lease_s=30.0)
    await store.join_engine(short)
    await store.join_engine(long)

    async def lapsed() -> bool:
        rec = await record(store, short)
        return rec is not None and not rec.live

    await until(lapsed, within=10, what="the member with a 0.3 s lease to lapse")
    assert (rec := await record(store, long)) is not None and rec.live
    assert await store.forget_dead_engines(0.2) >= 1
    assert await record(store, short) is None
    assert await record(store, long) is not None, "a live member is not forgotten"
    await store.join_engine(short)
    assert (rec := await record(store, short)) is not None and rec.live, "a forgotten member may join again"
    for reg in (short, long):
        await store.leave_engine(reg)


async def test_an_engine_id_has_one_holder_at_a_time(store: Store) -> None:
    eid = engine_id()
    first, second = store.engine_id_lock(eid), store.engine_id_lock(eid)
    other = store.engine_id_lock(engine_id())
    try:
        assert await first.acquire(within_s=2.0)
        assert await first.held()
        assert not await second.acquire(within_s=0.3)
        assert not await second.held()
        assert await other.acquire(within_s=2.0), "another id's lock is its own"
        await first.release()
        assert await second.acquire(within_s=2.0)
        assert await second.held()
    finally:
        for lock in (first, second, other):
            await lock.release()
