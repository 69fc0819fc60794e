"""Receiver helpers: signature, Idempotency-Key de-duplication and fencing, in memory and on Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from duetime.core.signing import new_signing_secret, sign
from duetime.receiver import (
    Claim,
    Deduplicator,
    DeliveryHeaders,
    FencingGuard,
    FencingStore,
    IdempotencyStore,
    MemoryFencingStore,
    MemoryIdempotencyStore,
    RedisFencingStore,
    RedisIdempotencyStore,
    verify_webhook,
)

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def _signed(
    secret: str, body: bytes, at: datetime = NOW, msg_id: str = "job:2026-05-01T12:00:00Z"
) -> dict[str, str]:
    ts = int(at.timestamp())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": sign(secret, msg_id, ts, body),
    }


def test_verify_webhook_accepts_only_the_signed_bytes_under_the_right_secret() -> None:
    secret, other = new_signing_secret(), new_signing_secret()
    body = b'{"a":1}'
    headers = _signed(secret, body)
    assert verify_webhook(secret, headers, body, now=NOW)
    assert verify_webhook(secret, {k.upper(): v for k, v in headers.items()}, body, now=NOW)
    assert not verify_webhook(other, headers, body, now=NOW)
    assert not verify_webhook(secret, headers, b'{"a": 1}', now=NOW)
    assert not verify_webhook(secret, {**headers, "webhook-id": "job:other"}, body, now=NOW)
    # Outside the tolerance window a captured call cannot be replayed.
    assert not verify_webhook(secret, headers, body, now=NOW + timedelta(seconds=301))
    assert verify_webhook(secret, headers, body, now=NOW + timedelta(seconds=301), tolerance_s=600)
    # Rotation: an old and a new signature side by side, either secret verifies.
    both = {
        **headers,
        "webhook-signature": headers["webhook-signature"] + " " + _signed(other, body)["webhook-signature"],
    }
    assert verify_webhook(secret, both, body, now=NOW) and verify_webhook(other, both, body, now=NOW)


def test_delivery_headers_parse_and_name_what_is_wrong() -> None:
    headers = {
        "idempotency-key": "j1:2026-05-01T12:00:00Z",
        "Duetime-Job-Id": "j1",
        "DUETIME-SCHEDULED-FOR": "2026-05-01T12:00:00Z",
        "Duetime-Attempt": "2",
        "Duetime-Fencing-Token": "17",
    }
    parsed = DeliveryHeaders.parse(headers)
    assert parsed == DeliveryHeaders("j1:2026-05-01T12:00:00Z", "j1", "2026-05-01T12:00:00Z", 2, 17)
    with pytest.raises(ValueError, match="Duetime-Fencing-Token"):
        DeliveryHeaders.parse({**headers, "Duetime-Fencing-Token": "-1"})
    without = {k: v for k, v in headers.items() if k != "Duetime-Job-Id"}
    with pytest.raises(ValueError, match="missing header Duetime-Job-Id"):
        DeliveryHeaders.parse(without)


def test_delivery_headers_read_the_runs_context_when_it_is_sent() -> None:
    headers = {
        "Idempotency-Key": "j1:2026-05-01T12:00:00Z",
        "Duetime-Job-Id": "j1",
        "Duetime-Scheduled-For": "2026-05-01T12:00:00Z",
        "Duetime-Attempt": "1",
        "Duetime-Fencing-Token": "17",
    }
    plain = DeliveryHeaders.parse(headers)  # a failure event, or a Duetime before the run context
    assert (plain.spec_version, plain.previous_scheduled_for, plain.folded_count) == (None, None, 0)
    context = {
        "duetime-spec-version": "3",
        "Duetime-Previous-Scheduled-For": "2026-05-01T11:00:00Z",
        "Duetime-Last-Success-Scheduled-For": "2026-05-01T09:00:00Z",
        "Duetime-Folded-Count": "2",
        "Duetime-Folded-From": "2026-05-01T10:00:00Z",
    }
    parsed = DeliveryHeaders.parse({**headers, **context})
    assert parsed == DeliveryHeaders(
        "j1:2026-05-01T12:00:00Z",
        "j1",
        "2026-05-01T12:00:00Z",
        1,
        17,
        spec_version=3,
        previous_scheduled_for="2026-05-01T11:00:00Z",
        last_success_scheduled_for="2026-05-01T09:00:00Z",
        folded_count=2,
        folded_from="2026-05-01T10:00:00Z",
    )
    assert datetime.fromisoformat(parsed.folded_from or "") == datetime(2026, 5, 1, 10, tzinfo=UTC)
    with pytest.raises(ValueError, match="Duetime-Spec-Version"):
        DeliveryHeaders.parse({**headers, "Duetime-Spec-Version": "v3"})
    with pytest.raises(ValueError, match="Duetime-Folded-Count"):
        DeliveryHeaders.parse({**headers, "Duetime-Folded-Count": "-1"})


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_memory_store_pending_done_and_expiry() -> None:
    clock = FakeClock()
    store = MemoryIdempotencyStore(clock=clock)
    assert await store.claim("k", pending_ttl_s=10) is Claim.NEW
    assert await store.claim("k", pending_ttl_s=10) is Claim.PENDING
    clock.now += 11  # the first receiver died mid-work: its pending mark lapses
    assert await store.claim("k", pending_ttl_s=10) is Claim.NEW
    await store.finish("k", done_ttl_s=100)
    await store.release("k")  # a done key is not released
    assert await store.claim("k", pending_ttl_s=10) is Claim.DONE
    clock.now += 101
    assert await store.claim("k", pending_ttl_s=10) is Claim.NEW


async def test_memory_store_sweeps_expired_keys() -> None:
    clock = FakeClock()
    store = MemoryIdempotencyStore(clock=clock, sweep_every=10)
    for n in range(9):
        await store.claim(f"old-{n}", pending_ttl_s=1)
    clock.now += 2
    await store.claim("fresh", pending_ttl_s=1)
    assert len(store) == 1


@pytest.fixture
async def redis() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0")
    yield client
    await client.aclose()


@pytest.fixture(params=["memory", "redis"])
async def idem_store(
    request: pytest.FixtureRequest, redis: aioredis.Redis
) -> AsyncIterator[IdempotencyStore]:
    if request.param == "memory":
        yield MemoryIdempotencyStore()
        return
    prefix = f"test:idem:{uuid.uuid4().hex}:"
    yield RedisIdempotencyStore(redis, prefix=prefix)
    keys = [k async for k in redis.scan_iter(match=prefix + "*")]
    if keys:
        await redis.delete(*keys)


@pytest.fixture(params=["memory", "redis"])
async def fence_store(request: pytest.FixtureRequest, redis: aioredis.Redis) -> AsyncIterator[FencingStore]:
    if request.param == "memory":
        yield MemoryFencingStore()
        return
    key = f"test:fence:{uuid.uuid4().hex}"
    yield RedisFencingStore(redis, key=key)
    await redis.delete(key)


async def test_deduplicator_does_the_work_once(idem_store: IdempotencyStore) -> None:
    dedup = Deduplicator(idem_store)
    done: list[str] = []
    for _ in range(3):
        async with dedup.once("job:1") as claim:
            if claim is Claim.NEW:
                done.append("work")
    assert done == ["work"]
    async with dedup.once("job:1") as claim:
        assert claim is Claim.DONE
    async with dedup.once("job:2") as claim:
        assert claim is Claim.NEW


async def test_a_failed_delivery_frees_its_key_for_the_retry(idem_store: IdempotencyStore) -> None:
    dedup = Deduplicator(idem_store)
    with pytest.raises(RuntimeError):
        async with dedup.once("job:fail") as claim:
            assert claim is Claim.NEW
            raise RuntimeError("downstream is down")
    async with dedup.once("job:fail") as claim:
        assert claim is Claim.NEW


async def test_a_redelivery_during_the_work_is_told_pending(idem_store: IdempotencyStore) -> None:
    dedup = Deduplicator(idem_store)
    started, release = asyncio.Event(), asyncio.Event()
    claims: list[Claim] = []

    async def first() -> None:
        async with dedup.once("job:slow") as claim:
            claims.append(claim)
            started.set()
            await release.wait()

    task = asyncio.create_task(first())
    await started.wait()
    async with dedup.once("job:slow") as claim:
        claims.append(claim)
    release.set()
    await task
    async with dedup.once("job:slow") as claim:
        claims.append(claim)
    assert claims == [Claim.NEW, Claim.PENDING, Claim.DONE]


async def test_a_cancelled_delivery_frees_its_key(idem_store: IdempotencyStore) -> None:
    dedup = Deduplicator(idem_store)
    started = asyncio.Event()

    async def handler() -> None:
        async with dedup.once("job:cancelled"):
            started.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(handler())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with dedup.once("job:cancelled") as claim:
        assert claim is Claim.NEW


async def test_redis_pending_mark_expires(redis: aioredis.Redis) -> None:
    prefix = f"test:idem:{uuid.uuid4().hex}:"
    store = RedisIdempotencyStore(redis, prefix=prefix)
    try:
        assert await store.claim("k", pending_ttl_s=0.05) is Claim.NEW
        assert await store.claim("k", pending_ttl_s=0.05) is Claim.PENDING
        await asyncio.sleep(0.3)
        assert await store.claim("k", pending_ttl_s=10) is Claim.NEW
        await store.finish("k", done_ttl_s=60)
        ttl_ms = await redis.pttl(prefix + "k")
        assert 50_000 < ttl_ms <= 60_000
    finally:
        await redis.delete(prefix + "k")


async def test_fencing_refuses_a_lower_token_per_job(fence_store: FencingStore) -> None:
    guard = FencingGuard(fence_store)
    assert await guard.admit("a", 3)
    assert await guard.admit("a", 3)  # the same lease calling again (a retry) is fine
    assert await guard.admit("a", 5)
    assert not await guard.admit("a", 4)  # the stalled holder of lease 4 comes back
    assert not await guard.admit("a", 3)
    assert await guard.admit("b", 1)  # tokens are per job
    assert await guard.admit("a", 5)


async def test_fencing_guard_defaults_to_memory() -> None:
    guard = FencingGuard()
    assert await guard.admit("a", 0)
    assert not await guard.admit("a", -1)
