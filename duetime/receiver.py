"""Helpers for a target that receives Duetime's webhook calls, for any web framework.

Delivery is at least once, so a receiver has three jobs, and each helper here does one:

1. **Is it from Duetime?** ``verify_webhook`` checks the Standard Webhooks signature. It is
   ``duetime.core.signing.verify_signature``, the very code the sender's signature is defined next to,
   so the two sides cannot disagree about the signed bytes.
2. **Have I done this occurrence already?** ``Deduplicator`` keeps the ``Idempotency-Key`` (the
   same on every attempt and redelivery of one occurrence) in a pluggable ``IdempotencyStore``:
   ``MemoryIdempotencyStore`` for one process, ``RedisIdempotencyStore`` for several. A key is
   *pending* while the first delivery works on it and *done* after, so a redelivery that arrives
   while the first is still running is told to come back later (the sender retries a 503) instead
   of being acknowledged for work that may still fail.
3. **Is this caller still the lease holder?** ``FencingGuard`` keeps the highest
   ``Duetime-Fencing-Token`` seen per job and refuses a lower one: a worker that stalled past its
   lease (and was replaced) can still call, and must not overwrite the newer holder's effect.

``examples/receiver_aiohttp.py`` puts the three together; docs/client.md explains them.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final, Protocol

from duetime.core.signing import (
    ATTEMPT,
    FENCING_TOKEN,
    FOLDED_COUNT,
    FOLDED_FROM,
    IDEMPOTENCY_KEY,
    JOB_ID,
    LAST_SUCCESS_SCHEDULED_FOR,
    PREVIOUS_SCHEDULED_FOR,
    SCHEDULED_FOR,
    SPEC_VERSION,
    verify_signature,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = [
    "Claim",
    "Deduplicator",
    "DeliveryHeaders",
    "FencingGuard",
    "FencingStore",
    "IdempotencyStore",
    "MemoryFencingStore",
    "MemoryIdempotencyStore",
    "RedisFencingStore",
    "RedisIdempotencyStore",
    "verify_webhook",
]

DEFAULT_TOLERANCE_S: Final = 300
DEFAULT_DONE_TTL_S: Final = 48 * 3600.0  # the contract keeps keys >= 24 h; redeliveries come sooner
DEFAULT_PENDING_TTL_S: Final = 330.0  # longer than the longest timeout_s (300 s) a job can have


def verify_webhook(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
    now: datetime | None = None,
) -> bool:
    """True only for a call signed with the owner's ``whsec_`` secret within ``tolerance_s``.

    Pass the raw body bytes as received, before any JSON parsing: the signature covers the bytes.
    """
    return verify_signature(secret, headers, body, tolerance_s=tolerance_s, now=now)


@dataclass(frozen=True, slots=True)
class DeliveryHeaders:
    """The Duetime-* headers of one call, read once, for the helpers and the receiver's own logs.

    The run's context (docs/targets.md, "Run context") is optional: a failure event carries none,
    and a call from a Duetime before it carries none either. Instants are kept as sent
    (``2026-12-01T00:00:00Z``, as ``scheduled_for``); ``datetime.fromisoformat`` reads them.
    ``folded_count`` is 0 unless the run stands for missed occurrences ``run_once`` folded.
    """

    idempotency_key: str
    job_id: str
    scheduled_for: str
    attempt: int
    fencing_token: int
    spec_version: int | None = None
    previous_scheduled_for: str | None = None
    last_success_scheduled_for: str | None = None
    folded_count: int = 0
    folded_from: str | None = None

    @classmethod
    def parse(cls, headers: Mapping[str, str]) -> DeliveryHeaders:
        """Raises ``ValueError`` naming the header that is missing or malformed. Works on a NATS
        message's headers too (the same names)."""
        lowered = {k.lower(): v for k, v in headers.items()}

        def optional(name: str) -> str | None:
            return lowered.get(name.lower()) or None

        def text(name: str) -> str:
            value = optional(name)
            if value is None:
                raise ValueError(f"missing header {name}")
            return value

        def number(name: str, value: str) -> int:
            if not value.isdigit():
                raise ValueError(f"header {name} is not a non-negative integer")
            return int(value)

        spec_version = optional(SPEC_VERSION)
        folded_count = optional(FOLDED_COUNT)
        return cls(
            idempotency_key=text(IDEMPOTENCY_KEY),
            job_id=text(JOB_ID),
            scheduled_for=text(SCHEDULED_FOR),
            attempt=number(ATTEMPT, text(ATTEMPT)),
            fencing_token=number(FENCING_TOKEN, text(FENCING_TOKEN)),
            spec_version=None if spec_version is None else number(SPEC_VERSION, spec_version),
            previous_scheduled_for=optional(PREVIOUS_SCHEDULED_FOR),
            last_success_scheduled_for=optional(LAST_SUCCESS_SCHEDULED_FOR),
            folded_count=0 if folded_count is None else number(FOLDED_COUNT, folded_count),
            folded_from=optional(FOLDED_FROM),
        )


# --- idempotency ------------------------------------------------------------------------------------


class Claim(enum.Enum):
    """What a delivery found when it asked for its key."""

    NEW = "new"  # nobody had it: do the work
    PENDING = "pending"  # another delivery is working on it now: answer 503 so the sender retries
    DONE = "done"  # done before: acknowledge (2xx) without doing it again


class IdempotencyStore(Protocol):
    """Where keys live. Three atomic operations; a Redis or SQL store maps them one to one.

    - ``claim(key, pending_ttl_s)``: if the key is absent (or its pending mark expired), mark it
      pending for ``pending_ttl_s`` and answer NEW; otherwise answer PENDING or DONE. Redis:
      ``SET key pending NX PX``, then ``GET`` when that fails. SQL: ``INSERT … ON CONFLICT (key)
      DO UPDATE … WHERE state = 'pending' AND expires_at < now() RETURNING`` and a ``SELECT``.
    - ``finish(key, done_ttl_s)``: mark it done for ``done_ttl_s`` (``SET key done PX``; ``UPDATE``).
    - ``release(key)``: forget a pending key after the work failed, so the next delivery retries it
      (``DEL``; ``DELETE … WHERE state = 'pending'``).

    The pending expiry is what rescues a key whose receiver crashed mid-work.
    """

    async def claim(self, key: str, pending_ttl_s: float) -> Claim: ...

    async def finish(self, key: str, done_ttl_s: float) -> None: ...

    async def release(self, key: str) -> None: ...


class MemoryIdempotencyStore:
    """Keys in this process's memory, each with an expiry; for a receiver that runs once.

    Expired keys are swept every ``sweep_every`` claims, so memory stays proportional to the keys
    of the last ``done_ttl_s``.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, sweep_every: int = 1024) -> None:
        self._clock = clock
        self._entries: dict[str, tuple[Claim, float]] = {}
        self._sweep_every = sweep_every
        self._since_sweep = 0

    def __len__(self) -> int:
        return len(self._entries)

    async def claim(self, key: str, pending_ttl_s: float) -> Claim:
        now = self._clock()
        self._since_sweep += 1
        if self._since_sweep >= self._sweep_every:
            self._since_sweep = 0
            self._entries = {k: e for k, e in self._entries.items() if e[1] > now}
        entry = self._entries.get(key)
        if entry is not None and entry[1] > now:
            return entry[0]
        self._entries[key] = (Claim.PENDING, now + pending_ttl_s)
        return Claim.NEW

    async def finish(self, key: str, done_ttl_s: float) -> None:
        self._entries[key] = (Claim.DONE, self._clock() + done_ttl_s)

    async def release(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry[0] is Claim.PENDING:
            del self._entries[key]


class RedisIdempotencyStore:
    """Keys in Redis (``redis.asyncio``), shared by every replica of a receiver."""

    _RELEASE: Final = (
        "if redis.call('GET', KEYS[1]) == 'pending' then return redis.call('DEL', KEYS[1]) end return 0"
    )

    def __init__(self, redis: Redis, *, prefix: str = "duetime:idem:") -> None:
        self._redis = redis
        self._prefix = prefix

    async def claim(self, key: str, pending_ttl_s: float) -> Claim:
        name = self._prefix + key
        if await self._redis.set(name, "pending", nx=True, px=max(1, int(pending_ttl_s * 1000))):
            return Claim.NEW
        state = await self._redis.get(name)
        if state is None:  # expired between the two calls: try once more
            return await self.claim(key, pending_ttl_s)
        return Claim.DONE if state in (b"done", "done") else Claim.PENDING

    async def finish(self, key: str, done_ttl_s: float) -> None:
        await self._redis.set(self._prefix + key, "done", px=max(1, int(done_ttl_s * 1000)))

    async def release(self, key: str) -> None:
        await self._redis.eval(self._RELEASE, 1, self._prefix + key)


class Deduplicator:
    """Run each occurrence's work once, however often it is delivered.

    ``async with dedup.once(key) as claim:`` yields the ``Claim``. On NEW the block does the work;
    leaving it normally marks the key done, leaving it with an exception releases the key, so the
    sender's retry does the work again. On PENDING or DONE the block should answer at once (503
    with ``Retry-After``, or 200) and leaving it changes nothing.
    """

    def __init__(
        self,
        store: IdempotencyStore,
        *,
        done_ttl_s: float = DEFAULT_DONE_TTL_S,
        pending_ttl_s: float = DEFAULT_PENDING_TTL_S,
    ) -> None:
        self.store = store
        self.done_ttl_s = done_ttl_s
        self.pending_ttl_s = pending_ttl_s

    @contextlib.asynccontextmanager
    async def once(self, key: str) -> AsyncIterator[Claim]:
        claim = await self.store.claim(key, self.pending_ttl_s)
        if claim is not Claim.NEW:
            yield claim
            return
        try:
            yield claim
        except BaseException:
            # Shielded: a cancelled handler must still free the key, or retries wait for its expiry.
            await asyncio.shield(self.store.release(key))
            raise
        await self.store.finish(key, self.done_ttl_s)


# --- fencing ----------------------------------------------------------------------------------------


class FencingStore(Protocol):
    """The highest token seen per job; ``advance`` is one atomic compare-and-set.

    ``advance(job_id, token)`` stores ``token`` when it is at least the stored one and answers
    True, else answers False and stores nothing. Equal tokens pass: every attempt under one lease
    carries the same token. Redis: a short Lua script (``RedisFencingStore``); SQL: ``INSERT …
    ON CONFLICT (job_id) DO UPDATE SET token = EXCLUDED.token WHERE fence.token <= EXCLUDED.token
    RETURNING 1``.
    """

    async def advance(self, job_id: str, token: int) -> bool: ...


class MemoryFencingStore:
    """Tokens in this process's memory (one entry per job ever seen)."""

    def __init__(self) -> None:
        self._highest: dict[str, int] = {}

    async def advance(self, job_id: str, token: int) -> bool:
        if token < self._highest.get(job_id, -1):
            return False
        self._highest[job_id] = token
        return True


class RedisFencingStore:
    """Tokens in a Redis hash, shared by every replica of a receiver."""

    _ADVANCE: Final = (
        "local current = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1') "
        "if tonumber(ARGV[2]) < current then return 0 end "
        "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return 1"
    )

    def __init__(self, redis: Redis, *, key: str = "duetime:fence") -> None:
        self._redis = redis
        self._key = key

    async def advance(self, job_id: str, token: int) -> bool:
        result = await self._redis.eval(self._ADVANCE, 1, self._key, job_id, str(token))
        return bool(int(result))


class FencingGuard:
    """Accept a call only from the newest lease holder of its job.

    Check as close as possible to the side effect: the token only proves the caller held the newest
    lease *when it was checked*. Where the effect is a database write, the strongest form is to
    store the token with the row and write ``WHERE token <= $new``; this guard is the simple form.
    """

    def __init__(self, store: FencingStore | None = None) -> None:
        self.store: FencingStore = store if store is not None else MemoryFencingStore()

    async def admit(self, job_id: str, token: int) -> bool:
        return await self.store.advance(job_id, token)
