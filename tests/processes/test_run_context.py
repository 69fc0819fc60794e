"""A run's context end to end on a real node (issue 30, item 4): the spec version, the occurrence
before, the last success and what run_once folded arrive on a webhook call (headers), in a Redis
stream entry (snake-case fields) and in a NATS message (headers), through either run queue (the
in-process one, and NATS, whose messages carry the context the fence read).

Three every-second jobs (misfire ``run_once``, a grace of one second) run a few times, are paused
for a few seconds and resumed: the first run after the resume stands for the occurrences missed
while paused, the oldest of them the one after the last run before the pause."""

from __future__ import annotations

import asyncio
import functools
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import aiohttp
import nats
import nats.errors
import pytest
import redis.asyncio as aioredis

from duetime.app import Node
from tests.support.node import Owner, fast_settings, parse
from tests.support.receiver import Receiver
from tests.support.wait import until

pytestmark = [pytest.mark.redis, pytest.mark.nats]

REDIS_URL = "redis://127.0.0.1:6379/0"
NATS_URL = "nats://127.0.0.1:4222"
SECOND = timedelta(seconds=1)


@pytest.fixture(params=["inprocess", "nats"])
async def context_owner(request: pytest.FixtureRequest, own_db: str) -> AsyncIterator[Owner]:
    """An owner on a node of its own database, its runs through the run queue the test names."""
    prefix = f"dt{secrets.token_hex(4)}.runs"
    node = Node(fast_settings(own_db, run_queue=request.param, nats_run_subject=prefix))
    await node.start()
    try:
        assert node.store is not None and node.url is not None
        name = "ctx_" + uuid.uuid4().hex[:8]
        key, secret = await node.store.create_api_key(name)
        async with aiohttp.ClientSession() as http:
            owner = Owner(name, key, secret, http, node.url)
            yield owner
            await owner.cancel_all()
    finally:
        await node.stop()
        if request.param == "nats":
            nc = await nats.connect(NATS_URL)
            try:
                await nc.jetstream().delete_stream(prefix.upper().replace(".", "_"))
            finally:
                await nc.close()


@dataclass(frozen=True)
class Seen:
    """One delivery's context, whichever way it came (header or stream field)."""

    scheduled_for: datetime
    spec_version: str | None
    previous: datetime | None
    last_success: datetime | None
    folded_count: str | None
    folded_from: datetime | None


def _time(value: str | None) -> datetime | None:
    return None if value is None else parse(value)


def _from_headers(h: dict[str, str]) -> Seen:
    return Seen(
        parse(h["Duetime-Scheduled-For"]),
        h.get("Duetime-Spec-Version"),
        _time(h.get("Duetime-Previous-Scheduled-For")),
        _time(h.get("Duetime-Last-Success-Scheduled-For")),
        h.get("Duetime-Folded-Count"),
        _time(h.get("Duetime-Folded-From")),
    )


def _from_fields(raw: dict[bytes, bytes]) -> Seen:
    f = {k.decode(): v.decode() for k, v in raw.items()}
    return Seen(
        parse(f["duetime_scheduled_for"]),
        f.get("duetime_spec_version"),
        _time(f.get("duetime_previous_scheduled_for")),
        _time(f.get("duetime_last_success_scheduled_for")),
        f.get("duetime_folded_count"),
        _time(f.get("duetime_folded_from")),
    )


async def test_the_run_context_arrives_on_a_webhook_a_redis_entry_and_a_nats_message(
    context_owner: Owner, receiver: Receiver
) -> None:
    owner = context_owner
    tag = secrets.token_hex(5)
    stream_key, subject, stream = (
        f"duetime-test-ctx-{tag}",
        f"duetime.test.ctx.{tag}",
        f"DT_CTX_{tag.upper()}",
    )
    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[subject])
    redis = aioredis.Redis.from_url(REDIS_URL)
    nats_seen: list[Seen] = []
    sub = await js.pull_subscribe(subject, durable="c" + tag, stream=stream)

    async def nats_messages() -> list[Seen]:
        try:
            for msg in await sub.fetch(100, timeout=0.2):
                assert msg.headers is not None
                nats_seen.append(_from_headers(dict(msg.headers)))
                await msg.ack()
        except (nats.errors.TimeoutError, TimeoutError):
            pass
        return nats_seen

    async def redis_entries() -> list[Seen]:
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await redis.xrange(stream_key)  # type: ignore[assignment]
        return [_from_fields(fields) for _, fields in entries]

    async def webhook_calls() -> list[Seen]:
        return [_from_headers(c.headers) for c in receiver.on("/ctx")]

    targets: dict[str, tuple[dict[str, str], Callable[[], Awaitable[list[Seen]]]]] = {
        "webhook": ({"type": "webhook", "url": receiver.url + "/ctx"}, webhook_calls),
        "redis": ({"type": "queue", "broker": "redis", "topic": stream_key}, redis_entries),
        "nats": ({"type": "queue", "broker": "nats", "topic": subject}, nats_messages),
    }
    try:
        jobs = {}
        for kind, (target, _) in targets.items():
            jobs[kind] = await owner.create(
                {
                    "target": target,
                    "schedule": {"cron": "* * * * * *"},
                    "overlap": "skip",
                    "misfire": "run_once",
                    "misfire_grace_s": 1,
                }
            )

        async def delivered(kind: str, n: int) -> bool:
            return len(await targets[kind][1]()) >= n

        for kind in targets:
            await until(
                functools.partial(delivered, kind, 3), within=30, what=f"three runs of the {kind} job"
            )
        for kind, job in jobs.items():
            status, _ = await owner.call("POST", f"/v1/jobs/{job['id']}/pause")
            assert status == 200, kind
        # Whatever was in flight at the pause ends and is recorded: each delivery is a success in
        # the job's history, and nothing more arrives.
        for kind, job in jobs.items():
            await until(
                functools.partial(_settled, owner, job["id"], targets[kind][1]),
                within=30,
                what=f"the {kind} job's runs recorded",
            )
        before = {kind: list(await read()) for kind, (_, read) in targets.items()}
        last = {kind: max(s.scheduled_for for s in seen) for kind, seen in before.items()}
        # The occurrence each paused row waits at: the first one the pause will have missed.
        waiting = {}
        for kind, job in jobs.items():
            status, shown = await owner.call("GET", f"/v1/jobs/{job['id']}")
            assert status == 200 and shown["state"] == "paused", shown
            waiting[kind] = parse(shown["next_run_at"])
            assert waiting[kind] > last[kind]
        # Let a few more pass (the grace is one second).
        await until(
            lambda: datetime.now(UTC) > max(waiting.values()) + 4 * SECOND,
            within=30,
            what="a few missed occurrences",
        )
        for kind, job in jobs.items():
            status, _ = await owner.call("POST", f"/v1/jobs/{job['id']}/resume")
            assert status == 200, kind
        for kind in targets:
            n = len(before[kind]) + 1
            await until(functools.partial(delivered, kind, n), within=30, what=f"the {kind} job resumed")

        for kind, (_, read) in targets.items():
            seen = await read()
            first_occurrence = parse(jobs[kind]["next_run_at"])
            # Every delivery: the spec version it ran under; the schedule's occurrence before it
            # (none for the job's first); a last success older than itself.
            times = [s.scheduled_for for s in seen]
            for i, s in enumerate(seen):
                assert s.spec_version == "1", (kind, s)
                if s.scheduled_for == first_occurrence:
                    assert s.previous is None, (kind, s)
                else:
                    assert s.previous == s.scheduled_for - SECOND, (kind, s)
                # every delivery succeeded: the last success is one of the earlier ones, if any
                assert s.last_success is None or s.last_success in times[:i], (kind, s)
            assert seen[0].last_success is None, (kind, seen[0])
            assert any(s.last_success is not None for s in seen[1:]), (kind, seen)
            # The first run after the resume stands for what was missed while paused: from the
            # occurrence the paused row waited at up to itself, itself not counted.
            resumed = seen[len(before[kind])]
            assert resumed.last_success == last[kind], (kind, resumed)
            assert resumed.folded_from == waiting[kind], (kind, resumed)
            assert resumed.folded_count is not None, (kind, resumed)
            assert int(resumed.folded_count) == (resumed.scheduled_for - resumed.folded_from) // SECOND
            assert int(resumed.folded_count) >= 4, (kind, resumed)
    finally:
        await redis.delete(stream_key)
        await redis.aclose()
        await js.delete_stream(stream)
        await nc.close()


async def _settled(owner: Owner, job_id: str, read: Callable[[], Awaitable[list[Seen]]]) -> bool:
    """Every delivery of a paused job is recorded as a success, and the count holds for a second
    (a run fenced just before the pause is still called)."""
    first = await read()
    history = [r for r in await owner.runs(job_id) if r["outcome"] == "succeeded"]
    if len(history) != len(first):
        return False
    await asyncio.sleep(1.0)
    return len(await read()) == len(first) and len(
        [r for r in await owner.runs(job_id) if r["outcome"] == "succeeded"]
    ) == len(first)
