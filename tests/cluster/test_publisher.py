"""The engine's NATS publisher against a real nats-server: every fenced run lands in the stream
once, in a bundle of its shard's runs, each PubAck gathered per batch without a task per message;
bundles whose PubAck never comes are published again and counted as published only when
acknowledged."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

from nats.aio.msg import Msg

from duetime.core.model import JobSpec, OneOffSchedule, WebhookTarget
from duetime.core.runpath import FencedRun, RunSpec
from duetime.runqueue import wire
from duetime.runqueue.natsqueue import (
    CONSUMER,
    PUBLISH_RETRIES,
    PUBLISHED,
    NatsRunPublisher,
    connect,
    stream_name,
)
from tests.cluster.harness import NatsServer
from tests.support.wait import until

SPEC = RunSpec.of(
    JobSpec(target=WebhookTarget(url="http://127.0.0.1:9/x"), schedule=OneOffSchedule(datetime.now(UTC)))
)


def _run(i: int) -> FencedRun:
    now = datetime.now(UTC)
    return FencedRun(
        job_id=uuid.uuid4(),
        shard=i % 16,
        owner="pub",
        lease_token=1,
        scheduled_for=now,
        due_at=now,
        attempt=1,
        spec=SPEC,
        run_kind="scheduled",
    )


async def _publisher(url: str, prefix: str) -> NatsRunPublisher:
    pub = NatsRunPublisher(url=url, prefix=prefix, publisher="engine-p", ack_wait_s=5, batch=256)
    await pub.start()
    return pub


async def test_a_batch_is_published_once_each_with_no_task_per_message(nats_server: NatsServer) -> None:
    prefix = "pubtest" + uuid.uuid4().hex[:6]
    pub = await _publisher(nats_server.url, prefix)
    try:
        runs = [_run(i) for i in range(600)]
        before = len(asyncio.all_tasks())
        created = 0
        loop = asyncio.get_running_loop()
        factory = loop.get_task_factory()

        def counting(lp: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
            nonlocal created
            created += 1
            return asyncio.Task(coro, loop=lp, **kw)

        loop.set_task_factory(counting)
        try:
            await pub._publish(runs)
        finally:
            loop.set_task_factory(factory)
        # publish_async (and a wait_for per PubAck) cost two tasks per message: 1,200 here
        assert created < 10, created
        assert len(asyncio.all_tasks()) <= before + 1
        assert pub.backlog() == 0
        nc = await connect(nats_server.url, "check")
        try:
            js = nc.jetstream()
            info = await js.stream_info(stream_name(prefix))
            assert info.state.messages == 16  # 37 or 38 runs of each shard, one bundle each
            sub = await js.pull_subscribe_bind(CONSUMER, stream_name(prefix))
            got = [
                (m.subject, p.shard, p.publisher, p.job_id)
                for m in await sub.fetch(600, timeout=5)
                for p in wire.decode_runs(m.data).runs
            ]
            assert sorted(j for *_, j in got) == sorted(r.job_id for r in runs)  # each run once
            assert {(subj, f"{prefix}.{shard}", by) for subj, shard, by, _ in got} == {
                (f"{prefix}.{s}", f"{prefix}.{s}", "engine-p") for s in range(16)
            }
        finally:
            await nc.close()
    finally:
        await pub.close(1.0)


class _LosingPublisher(NatsRunPublisher):
    """Loses the first ``lose`` PubAcks: the broker stored those messages, the answer never came."""

    lose = 10
    lost = 0

    async def _on_puback(self, msg: Msg) -> None:
        if self.lost < self.lose:
            self.lost += 1
            return
        await super()._on_puback(msg)


async def test_runs_without_a_puback_are_published_again_and_stored_once(nats_server: NatsServer) -> None:
    prefix = "pubtest" + uuid.uuid4().hex[:6]
    pub = _LosingPublisher(
        url=nats_server.url, prefix=prefix, publisher="engine-p", ack_wait_s=5, pub_ack_timeout_s=0.5
    )
    await pub.start()
    published = PUBLISHED._value.get()
    retries = PUBLISH_RETRIES._value.get()
    try:
        runs = [_run(i) for i in range(50)]
        assert len(wire.bundles_of(runs)) == 16  # 3 or 4 runs of each shard
        await pub._publish(runs)
        assert pub.lost == 10
        assert PUBLISH_RETRIES._value.get() - retries == 10
        assert PUBLISHED._value.get() - published == 50
        nc = await connect(nats_server.url, "check")
        try:
            info = await nc.jetstream().stream_info(stream_name(prefix))
            assert info.state.messages == 16  # the second copies were dropped by the duplicate window
        finally:
            await nc.close()
    finally:
        await pub.close(1.0)


async def test_the_stream_holds_no_more_undelivered_runs_than_the_run_queue_bound(
    nats_server: NatsServer,
) -> None:
    """DUETIME_RUN_QUEUE_MAX bounds the runs waiting in the stream for a worker: the engine holds
    the rest back (unfenced, in the end), and publishes more as workers fetch."""
    prefix = "pubtest" + uuid.uuid4().hex[:6]
    pub = NatsRunPublisher(
        url=nats_server.url, prefix=prefix, publisher="engine-p", ack_wait_s=5, maxsize=100, batch=40
    )
    await pub.start()
    nc = await connect(nats_server.url, "check")
    try:
        js = nc.jetstream()

        async def fence() -> None:  # the fencer: held back once the engine's buffer is full too
            for i in range(300):
                await pub.put(_run(i))

        published = PUBLISHED._value.get()
        fencer = asyncio.create_task(fence())
        await asyncio.sleep(1.0)
        # The stream counts messages (bundles of 2-3 runs here); the bound is in runs.
        assert PUBLISHED._value.get() - published <= 100
        # the next ones wait in the engine: the fencer and the publish loop (tasks of their own)
        # fill its buffer, a second was a guess at how long that takes on a busy machine
        await until(lambda: pub.backlog() >= 60, within=10, what="60 runs held back in the engine")
        assert not fencer.done()  # and the fence is held back
        sub = await js.pull_subscribe_bind(CONSUMER, stream_name(prefix))
        fetched = 0
        for _ in range(30):
            for m in await sub.fetch(50, timeout=5):
                await m.ack()
                fetched += len(wire.decode_runs(m.data).runs)
            if fetched >= 300:
                break
        assert fetched == 300  # the workers fetching made room for every run
        assert fencer.done()
        assert pub.backlog() == 0
    finally:
        await nc.close()
        await pub.close(1.0)
