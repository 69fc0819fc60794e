"""The engine's keeper of published runs' leases (DUETIME_RUN_QUEUE=nats) writes a lease only
when it has less than a lease left, and then for two: after every beat every lease still has at
least a lease to run, as when every beat extended every lease. And the engine keeps a fenced
run's lease from the moment its fence returned, not from the moment the run queue had room."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from duetime.core.ids import shard_of
from duetime.core.model import JobSpec, OneOffSchedule, WebhookTarget
from duetime.core.runpath import Lease, Leased
from duetime.engine.service import Engine, EngineConfig
from duetime.runqueue.inprocess import InProcessRunQueue
from duetime.runqueue.leases import LeaseKeeper
from duetime.runqueue.natsqueue import PublishedLeaseKeeper
from duetime.storage.memory import MemoryStore


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Recording(MemoryStore):
    """Keeps every published lease (none is taken) and records which ones each beat wrote, and
    for how long."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[set[uuid.UUID]] = []
        self.lengths: list[float] = []

    async def extend_published(
        self, leases: Sequence[Leased], *, holder: str, lease_s: float
    ) -> set[uuid.UUID]:
        ids = {lease.job_id for lease in leases}
        self.written.append(ids)
        self.lengths.append(lease_s)
        return ids


def _lease() -> Lease:
    return Lease(uuid.uuid4(), 0, 1)


async def test_a_beat_writes_only_the_leases_that_need_it(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr("duetime.runqueue.natsqueue.time.monotonic", clock)
    store = _Recording()
    keeper = PublishedLeaseKeeper(store, holder="e1", lease_s=30, heartbeat_s=10, max_wait_s=120)
    assert keeper.fence_lease_s == 60  # the engine fences published runs for two leases
    old = _lease()
    keeper.track(old)
    for step in (1, 10, 10):  # at 1, 11 and 21 s the fence's 60 s leave 59, 49 and 39 s
        clock.now += step
        await keeper.beat()
    assert store.written == []
    fresh = _lease()
    keeper.track(fresh)
    clock.now += 10
    await keeper.beat()  # at 31 s, 29 s left: less than a lease
    assert store.written == [{old.job_id}]
    assert store.lengths == [60]  # extended by two leases
    for _ in range(2):  # 41 and 51 s: the old one has 50 and 40 s left, the fresh one 40 and 30
        clock.now += 10
        await keeper.beat()
    assert len(store.written) == 1  # one write in 51 s of waiting, where every beat wrote 6
    clock.now += 10
    await keeper.beat()  # 61 s: the fresh one has 20 s left
    assert store.written[-1] == {fresh.job_id}
    assert len(keeper) == 2


async def test_after_every_beat_every_lease_has_a_lease_to_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Leases tracked at every phase of the beat, beats that take their time: at every beat, each
    lease (its expiry estimated from when it was last set) has at least a lease to run after the
    beat, as when every beat extended every lease by one lease."""
    clock = _Clock()
    monkeypatch.setattr("duetime.runqueue.natsqueue.time.monotonic", clock)
    store = _Recording()
    lease_s, beat_s = 30.0, 10.0
    keeper = PublishedLeaseKeeper(store, holder="e1", lease_s=lease_s, heartbeat_s=beat_s, max_wait_s=1e9)
    expiry: dict[uuid.UUID, float] = {}
    for step in range(400):
        lease = _lease()
        keeper.track(lease)
        expiry[lease.job_id] = clock.now + keeper.fence_lease_s  # type: ignore[operator]
        clock.now += 0.37  # tracked at all phases of the beat
        if step % 27 == 0:
            clock.now += 0.2  # a slow beat: the next one comes later
            before = len(store.written)
            at = clock.now
            await keeper.beat()
            for ids, length in zip(store.written[before:], store.lengths[before:], strict=True):
                for job_id in ids:
                    expiry[job_id] = at + length
            assert min(e - clock.now for e in expiry.values()) >= lease_s
            clock.now += beat_s - 27 * 0.37


async def test_draining_checks_every_lease_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """At shutdown the engine waits until workers took what it published: a lease just set is
    checked too, or the drain would wait half a heartbeat for nothing."""
    clock = _Clock()
    monkeypatch.setattr("duetime.runqueue.natsqueue.time.monotonic", clock)
    store = _Recording()
    keeper = PublishedLeaseKeeper(store, holder="e1", lease_s=30, heartbeat_s=10, max_wait_s=120)
    lease = _lease()
    keeper.track(lease)
    await keeper.beat(every=True)
    assert store.written == [{lease.job_id}]


async def test_every_run_of_a_fenced_batch_is_kept_before_the_run_queue_has_room() -> None:
    """A run queue with room for one run, two runs fenced in one batch: the second waits for room,
    and its lease must be kept meanwhile (a put can wait longer than a lease)."""
    store = MemoryStore()
    due = datetime.now(UTC) + timedelta(milliseconds=300)
    spec = JobSpec(target=WebhookTarget(url="https://example.com/hook"), schedule=OneOffSchedule(run_at=due))
    jobs = [await store.create_job("alice", spec) for _ in range(80)]
    by_shard: dict[int, list[uuid.UUID]] = {}
    for job, _ in jobs:
        by_shard.setdefault(shard_of(uuid.UUID(job.id)), []).append(uuid.UUID(job.id))
    shard, same = max(by_shard.items(), key=lambda kv: len(kv[1]))
    assert len(same) >= 3
    queue = InProcessRunQueue(maxsize=1)
    keeper = LeaseKeeper(store, lease_s=30, heartbeat_s=10)
    engine = Engine(store, queue, keeper, EngineConfig(engine_id="e1", shards=(shard,), poll_interval_s=0.05))
    await engine.start()
    try:
        for _ in range(100):
            if queue.qsize():
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # the fence loop now waits for room for the second run
        assert queue.qsize() == 1
        assert len(keeper) == len(same), "every fenced run of the batch is kept"
    finally:

        async def drain() -> None:
            while True:
                await queue.get()

        drainer = asyncio.create_task(drain())
        await engine.stop()
        drainer.cancel()


async def test_a_publishing_engine_fences_for_its_keepers_lease() -> None:
    """The fence's lease is the keeper's ``fence_lease_s`` (two leases for published runs); an
    engine with the in-process queue fences for one lease, as before."""
    for keeper_kind, expected_s in (("published", 60.0), ("in-process", 30.0)):
        store = MemoryStore()
        due = datetime.now(UTC) + timedelta(milliseconds=200)
        spec = JobSpec(
            target=WebhookTarget(url="https://example.com/hook"), schedule=OneOffSchedule(run_at=due)
        )
        job, _ = await store.create_job("alice", spec)
        jid = uuid.UUID(job.id)
        queue = InProcessRunQueue()
        keeper: LeaseKeeper = (
            PublishedLeaseKeeper(store, holder="e1", lease_s=30, heartbeat_s=10, max_wait_s=120)
            if keeper_kind == "published"
            else LeaseKeeper(store, lease_s=30, heartbeat_s=10)
        )
        engine = Engine(
            store, queue, keeper, EngineConfig(engine_id="e1", shards=(shard_of(jid),), lease_s=30)
        )
        await engine.start()
        try:
            await asyncio.wait_for(queue.get(), timeout=10)
            until = store._jobs[jid].run_until  # a running run's lease (migration 0010)
            assert until is not None
            left = (until - datetime.now(UTC)).total_seconds()
            assert expected_s - 5 < left <= expected_s, (keeper_kind, left)
        finally:
            await engine.stop()
