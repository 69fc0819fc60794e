"""The NATS run queue's take step against real NATS and PostgreSQL: a message is called only when
its own token is the one the row holds, even when a stale and a current message of the same job
arrive in one batch (a redelivery of a dead worker's message next to the retry's); a bundle's
runs are taken one by one, and its message is acked once the last run taken is recorded."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from nats.aio.msg import Msg

from duetime.core.model import JobSpec, OneOffSchedule, Outcome, WebhookTarget
from duetime.core.runpath import AttemptReport, FencedRun, RunSpec, Verdict
from duetime.runqueue import wire
from duetime.runqueue.leases import LeaseKeeper
from duetime.runqueue.natsqueue import (
    CONSUMER,
    NatsRunConsumer,
    connect,
    ensure_stream,
    subject_for,
)
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.cluster.harness import NatsServer
from tests.support.wait import settles


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=2)
    yield s
    await s.close()


async def _running_job(store: PostgresStore, *, token: int, holder: str) -> FencedRun:
    owner = "nq_" + uuid.uuid4().hex[:6]
    await store.create_api_key(owner)
    due = datetime.now(UTC) + timedelta(hours=1)
    spec = JobSpec(target=WebhookTarget(url="http://127.0.0.1:9/x"), schedule=OneOffSchedule(due))
    job, _ = await store.create_job(owner, spec)
    job_id = uuid.UUID(job.id)
    await store.pool_for_shard(0).execute(
        "UPDATE jobs SET phase = 'running', lease_token = $2, claimed_by = $3, "
        "leased_until = now() + interval '1 minute' WHERE job_id = $1",
        job_id,
        token,
        holder,
    )
    return FencedRun(
        job_id=job_id,
        shard=0,
        owner=owner,
        lease_token=token,
        scheduled_for=due,
        due_at=due,
        attempt=1,
        spec=RunSpec.of(spec),
        run_kind="scheduled",
    )


async def _take(
    store: PostgresStore, msgs: list[Msg], *, url: str, prefix: str, holder: str, ack_wait_s: float
) -> tuple[NatsRunConsumer, list[FencedRun]]:
    """A worker's consumer that takes ``msgs`` as one batch, as the fetch loop hands it over, and
    the runs it handed to the worker coroutines."""
    keeper = LeaseKeeper(store, lease_s=60, heartbeat_s=20)
    consumer = NatsRunConsumer(
        store,
        keeper,
        url=url,
        prefix=prefix,
        holder=holder,
        lease_s=60,
        ack_wait_s=ack_wait_s,
        concurrency=10,
    )
    await consumer._take(msgs)
    handed: list[FencedRun] = []
    while (got := consumer.get_nowait()) is not None:
        handed.append(got)
    return consumer, handed


async def test_a_stale_message_next_to_the_current_one_is_dropped_not_called(
    store: PostgresStore, nats_server: NatsServer
) -> None:
    current = await _running_job(store, token=2, holder="engine-x")
    stale = replace(current, lease_token=1)  # e.g. redelivered from a worker that died
    nc = await connect(nats_server.url, "test")
    try:
        js = nc.jetstream()
        stream = await ensure_stream(js, "nqtest", ack_wait_s=5)
        for run in (stale, current):
            await js.publish(subject_for("nqtest", run.shard), wire.encode_message(run, "engine-x"))
        sub = await js.pull_subscribe_bind(CONSUMER, stream)
        msgs = await sub.fetch(2, timeout=5)
        assert len(msgs) == 2
        consumer, handed = await _take(
            store, msgs, url=nats_server.url, prefix="nqtest", holder="worker-y", ack_wait_s=5
        )
        assert [r.lease_token for r in handed] == [2]
        assert consumer.held() == 1
        row = await store.pool_for_shard(0).fetchrow(
            "SELECT claimed_by, taken_by FROM jobs WHERE job_id = $1", current.job_id
        )
        assert dict(row) == {"claimed_by": "engine-x", "taken_by": "worker-y"}
    finally:
        await nc.close()


async def test_a_bundle_hands_over_the_runs_it_may_and_is_acked_after_the_last_is_recorded(
    store: PostgresStore, nats_server: NatsServer
) -> None:
    first = await _running_job(store, token=3, holder="engine-x")
    second = await _running_job(store, token=5, holder="engine-x")
    stale = replace(await _running_job(store, token=7, holder="engine-x"), lease_token=6)
    nc = await connect(nats_server.url, "test")
    try:
        js = nc.jetstream()
        stream = await ensure_stream(js, "nqbundle", ack_wait_s=30)
        await js.publish(subject_for("nqbundle", 0), wire.encode_runs([first, stale, second], "engine-x"))
        sub = await js.pull_subscribe_bind(CONSUMER, stream)
        msgs = await sub.fetch(1, timeout=5)
        consumer, handed = await _take(
            store, msgs, url=nats_server.url, prefix="nqbundle", holder="worker-z", ack_wait_s=30
        )
        assert [(r.job_id, r.lease_token) for r in handed] == [(first.job_id, 3), (second.job_id, 5)]
        assert consumer.held() == 2

        async def unacked() -> int:
            await consumer._send_acks()
            await nc.flush()
            info = await js.consumer_info(stream, CONSUMER)
            return int(info.num_ack_pending)

        done = Verdict(Outcome.SUCCEEDED, False, 200)
        now = datetime.now(UTC)
        consumer.recorded([AttemptReport(handed[1], done, now, now)])
        assert await unacked() == 1, "one run of the bundle is still being called"
        consumer.recorded([AttemptReport(handed[0], done, now, now)])
        # JetStream applies an ack after it arrives: the count reaches 0 soon, not at once.
        await settles(unacked, 0, within=10, what="the bundle's ack pending count")
        assert consumer.held() == 0
    finally:
        await nc.close()


async def test_closing_the_connection_is_not_logged_as_a_lost_one(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """nats-py calls the disconnect callback on a deliberate close too: every clean shutdown used to
    warn "NATS connection lost; reconnecting", which sent a reader of the logs after a fault that
    was not there."""
    nc = await connect(nats_server.url, "test")
    with caplog.at_level(logging.INFO, logger="duetime.natsqueue"):
        await nc.close()
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "duetime.natsqueue"]
    assert (logging.INFO, "NATS connection closed") in messages
    assert not [m for level, m in messages if level >= logging.WARNING], messages
