"""Membership on real PostgreSQL (storage/postgres/membership.py, engine/membership.py):
heartbeats with the database's clock, a lapse, a rejoin under the same id, two primaries
(membership on the home database only), and a handover between two real in-process engines that
loses and doubles nothing. What every store must do alike is tests/contract's."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from duetime.core.ids import SHARDS
from duetime.core.model import Broker, JobSpec, OneOffSchedule, QueueTarget
from duetime.engine.membership import MembershipKeeper
from duetime.engine.service import Engine, EngineConfig
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.storage.bulk import BulkJob, seed_jobs
from duetime.storage.migrate import migrate
from duetime.storage.ports import Registration
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.conftest import ADMIN_DSN
from tests.support.wait import settles, until

# Its databases are its own (not pg_dsn), so it says what it needs itself.
pytestmark = pytest.mark.pg

ALL = frozenset(range(SHARDS))


async def _new_db(name: str) -> str:
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = f"{ADMIN_DSN.rpartition('/')[0]}/{name}"
    await migrate(url)
    return url


async def _drop_db(name: str) -> None:
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def primaries() -> AsyncIterator[tuple[str, str]]:
    """Two databases of this test's own (membership rows and due rows must not leak between tests)."""
    tag = secrets.token_hex(4)
    names = [f"duetime_test_members_{tag}_a", f"duetime_test_members_{tag}_b"]
    dsns = (await _new_db(names[0]), await _new_db(names[1]))
    yield dsns
    for n in names:
        await _drop_db(n)


@pytest.fixture
async def store(primaries: tuple[str, str]) -> AsyncIterator[PostgresStore]:
    a, b = primaries
    s = await PostgresStore.open(ShardMap.from_dsns([a] * 8 + [b] * 8), pool_size=4)
    yield s
    await s.close()


def _reg(engine_id: str, *, lease_s: float = 5.0, allowed: frozenset[int] = ALL) -> Registration:
    return Registration(engine_id, "test-host", allowed, lease_s, 2, uuid.uuid4())


async def test_a_heartbeat_keeps_a_member_live_by_database_time(store: PostgresStore) -> None:
    members = store  # the Membership port
    reg = _reg("hb-1", lease_s=1.0)
    await members.join_engine(reg)
    for _ in range(4):  # 2 s of heartbeats every 0.5 s: live throughout
        await asyncio.sleep(0.5)
        assert await members.heartbeat_engine(reg, {1, 2})
        (row,) = await members.list_engines()
        assert row.live and row.heartbeat_age_s < 0.5
        assert row.serving == {1, 2} and row.allowed == ALL and row.host == "test-host"


async def test_a_member_whose_heartbeat_is_a_lease_old_is_dead(store: PostgresStore) -> None:
    members = store  # the Membership port
    await members.join_engine(_reg("lapse-1", lease_s=0.6))
    await members.join_engine(_reg("lapse-2", lease_s=30.0))
    await asyncio.sleep(1.0)
    rows = {r.engine_id: r for r in await members.list_engines()}
    assert not rows["lapse-1"].live, "its own 0.6 s lease decides, not the reader's"
    assert rows["lapse-1"].heartbeat_age_s >= 0.6
    assert rows["lapse-2"].live
    assert await members.forget_dead_engines(0.5) == 1
    assert [r.engine_id for r in await members.list_engines()] == ["lapse-2"]


async def test_a_restart_under_the_same_id_is_the_same_member(store: PostgresStore) -> None:
    members = store  # the Membership port
    first = _reg("phoenix", lease_s=0.5)
    await members.join_engine(first)
    (before,) = await members.list_engines()
    await asyncio.sleep(0.7)  # died: a lease without heartbeat
    assert not (await members.list_engines())[0].live
    second = Registration("phoenix", "other-host", frozenset({0, 1}), 5.0, 2, uuid.uuid4())
    await members.join_engine(second)
    (after,) = await members.list_engines()
    assert after.live and after.incarnation == second.incarnation
    assert after.started_at > before.started_at and after.allowed == {0, 1} and after.host == "other-host"
    # The old incarnation (a process that was only frozen, not dead) cannot refresh the row.
    assert not await members.heartbeat_engine(first, set())
    assert await members.heartbeat_engine(second, {0})


async def test_with_two_primaries_membership_lives_on_the_home_database(
    store: PostgresStore, primaries: tuple[str, str]
) -> None:
    a, b = primaries
    await store.join_engine(_reg("home-1"))
    assert await store.pool_for_dsn(a).fetchval("SELECT count(*) FROM engines") == 1
    assert await store.pool_for_dsn(b).fetchval("SELECT count(*) FROM engines") == 0


# --------------------------------------------------------------------------- handover between engines


def _config(engine_id: str) -> EngineConfig:
    return EngineConfig(
        engine_id=engine_id, lookahead_s=60.0, poll_interval_s=0.2, lease_s=2.0, janitor_interval_s=0.2
    )


class _Node:
    """An engine with its membership keeper, in this process (no workers: runs due far ahead)."""

    def __init__(self, store: PostgresStore, engine_id: str, lease_s: float = 2.0) -> None:
        self.keeper = LeaseKeeper(store, lease_s=lease_s, heartbeat_s=0.5)
        self.engine = Engine(store, InProcessRunQueue(10_000), self.keeper, _config(engine_id))
        self.members = MembershipKeeper(store, _reg(engine_id, lease_s=lease_s), interval_s=0.3)

    async def start(self) -> None:
        self.keeper.start()
        await self.engine.start(await self.members.join())
        await self.members.start(self.engine)

    async def stop(self) -> None:
        await self.members.stop()
        await self.engine.stop()
        await self.keeper.stop()

    async def die(self) -> None:
        """As a SIGKILL looks to the others: no leave, no release; the heartbeats just stop."""
        assert self.members._task is not None
        self.members._task.cancel()
        self.engine.crashed = RuntimeError("killed")  # its janitor must not keep its claims
        await asyncio.sleep(0)


async def _seed(store: PostgresStore, n: int, due_in_s: float) -> list[uuid.UUID]:
    spec = JobSpec(
        target=QueueTarget(broker=Broker.REDIS, topic="handover"),
        schedule=OneOffSchedule(datetime.now(UTC) + timedelta(seconds=due_in_s)),
    )
    return await seed_jobs(
        list(store.shard_map.dsns), (BulkJob("handover", spec) for _ in range(n)), datetime.now(UTC)
    )


async def _claims(store: PostgresStore) -> dict[str, set[int]]:
    """Engine id → shards of the rows it holds claimed; plus the count of idle rows under ''."""
    out: dict[str, set[int]] = {}
    for dsn in store.shard_map.databases():
        for r in await store.pool_for_dsn(dsn).fetch(
            "SELECT coalesce(claimed_by, '') AS e, shard FROM jobs WHERE phase = 'claimed' GROUP BY 1, 2"
        ):
            out.setdefault(r["e"], set()).add(r["shard"])
    return out


async def _claimed_count(store: PostgresStore) -> int:
    total = 0
    for dsn in store.shard_map.databases():
        total += await store.pool_for_dsn(dsn).fetchval("SELECT count(*) FROM jobs WHERE phase = 'claimed'")
    return int(total)


async def test_a_joining_engine_takes_its_share_and_the_claims_move_with_it(store: PostgresStore) -> None:
    ids = await _seed(store, 800, due_in_s=50)
    a = _Node(store, "deal-a")
    await a.start()
    try:
        assert a.engine.serving == ALL
        await until(
            lambda: _claimed_count_is(store, 800), within=10, what="engine a claimed every row", every=0.1
        )
        b, c = _Node(store, "deal-b"), _Node(store, "deal-c")
        await b.start()
        await c.start()
        try:

            async def dealt() -> bool:
                claims = await _claims(store)
                deal = c.members.last_deal
                return (
                    deal is not None
                    and a.engine.serving == deal.shards_of("deal-a")
                    and b.engine.serving == deal.shards_of("deal-b")
                    and c.engine.serving == deal.shards_of("deal-c")
                    and all(claims.get(e, set()) <= deal.shards_of(e) for e in ("deal-a", "deal-b", "deal-c"))
                    and set(claims) <= {"deal-a", "deal-b", "deal-c"}
                    and await _claimed_count(store) == len(ids)
                )

            await until(
                dealt, within=10, what="the three engines serve the deal and hold only its claims", every=0.1
            )
            sizes = sorted(len(n.engine.serving) for n in (a, b, c))
            assert sizes[-1] - sizes[0] <= 1 and sum(sizes) == 2 * SHARDS

            # Each engine's wheel holds exactly the claims it holds in the database: none twice.
            # A claim commits before its engine admits the rows to its wheel (the answer still has
            # to come back, and the pool's connection reset comes first): the database can show a
            # claim that no wheel holds yet, so the sum is waited for.
            async def in_wheels() -> int:
                return a.engine.waiting_runs + b.engine.waiting_runs + c.engine.waiting_runs

            await settles(in_wheels, len(ids), within=10, what="the claims in the three engines' wheels")
        finally:
            await c.stop()
            await b.stop()
        # b and c left gracefully: a takes everything back at its next heartbeat.
        await until(lambda: _serves(a, ALL), within=5, what="engine a serves all shards again", every=0.1)
        await until(
            lambda: _claimed_count_is(store, 800), within=10, what="every row claimed again", every=0.1
        )

        async def in_a_wheel() -> int:
            return a.engine.waiting_runs

        await settles(in_a_wheel, len(ids), within=10, what="the claims in engine a's wheel")
    finally:
        await a.stop()


async def _serves(node: _Node, shards: frozenset[int]) -> bool:
    return node.engine.serving == shards


async def _claimed_count_is(store: PostgresStore, n: int) -> bool:
    return await _claimed_count(store) == n


async def test_a_dead_engines_shards_are_served_again_within_a_lease_and_a_heartbeat(
    store: PostgresStore,
) -> None:
    a, b, c = (_Node(store, f"death-{x}", lease_s=1.5) for x in "abc")
    for n in (a, b, c):
        await n.start()
    try:
        await until(
            lambda: _all_serving(a, b, c), within=5, what="the three engines settle on one deal", every=0.1
        )
        await c.die()
        died = asyncio.get_running_loop().time()
        await until(lambda: _serves(a, ALL), within=1.5 + 0.3 + 2.0, what="a serves every shard", every=0.1)
        await until(lambda: _serves(b, ALL), within=2.0, what="b serves every shard", every=0.1)
        took = asyncio.get_running_loop().time() - died
        print(f"\nshards of the dead engine dealt again after {took:.2f} s (lease 1.5 s, heartbeat 0.3 s)")
        rows = {r.engine_id: r for r in await store.list_engines()}
        assert not rows["death-c"].live and rows["death-a"].live and rows["death-b"].live
    finally:
        await c.engine.stop()
        await c.keeper.stop()
        await b.stop()
        await a.stop()


async def _all_serving(*nodes: _Node) -> bool:
    deal = nodes[0].members.last_deal
    return (
        deal is not None
        and all(n.engine.serving == deal.shards_of(n.members.registration.engine_id) for n in nodes)
        and sum(len(n.engine.serving) for n in nodes) == 2 * SHARDS
    )
