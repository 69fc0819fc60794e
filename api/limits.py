"""Per-owner limits the API enforces before it does any work: a request rate and a cap on jobs.

Both are per API process and approximate by design: a token bucket per owner in memory, and a job
count read from the database at most every ``refresh_s`` and advanced locally by each create. An
exact global count would put one hot row (or a count over the owner's index) in every create; the
documented trade is that a cap can be overshot by what other processes create within one refresh.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from duetime.core.errors import Conflict, RateLimited


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float


class OwnerRateLimiter:
    """Token bucket per owner: ``rate`` requests a second, bursts up to ``burst``."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._burst = max(burst, 1.0)
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._last_sweep = clock()

    def check(self, owner: str) -> None:
        now = self._clock()
        bucket = self._buckets.get(owner)
        if bucket is None:
            bucket = self._buckets[owner] = _Bucket(self._burst, now)
        else:
            bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.stamp) * self._rate)
            bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
        else:
            wait = (1.0 - bucket.tokens) / self._rate
            raise RateLimited(
                f"too many requests for this owner (limit {self._rate:g}/s per API process); "
                f"retry after {math.ceil(wait)} s",
                retry_after_s=max(1, math.ceil(wait)),
            )
        if now - self._last_sweep > 60.0:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Forget owners whose bucket has been full for a while, so memory follows activity."""
        self._last_sweep = now
        idle = [o for o, b in self._buckets.items() if now - b.stamp > 60.0]
        for owner in idle:
            del self._buckets[owner]


class JobCap:
    """At most ``cap`` active (scheduled or paused) jobs per owner."""

    def __init__(
        self,
        cap: int,
        count: Callable[[str], Awaitable[int]],
        *,
        refresh_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cap = cap
        self._count = count
        self._refresh = refresh_s
        self._clock = clock
        self._known: dict[str, tuple[float, int]] = {}
        self._loading: dict[str, asyncio.Future[int]] = {}

    async def _current(self, owner: str) -> int:
        hit = self._known.get(owner)
        if hit is not None and self._clock() - hit[0] < self._refresh:
            return hit[1]
        pending = self._loading.get(owner)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._loading[owner] = fut
        try:
            value = await self._count(owner)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: the waiters re-raise it
            raise
        finally:
            self._loading.pop(owner, None)
        fut.set_result(value)
        self._known[owner] = (self._clock(), value)
        return value

    async def check(self, owner: str) -> None:
        if await self._current(owner) >= self._cap:
            raise Conflict(
                f"this owner already has {self._cap} active jobs (scheduled or paused), the "
                "operator's cap (DUETIME_MAX_JOBS_PER_OWNER); cancel jobs you no longer need",
                code="job_limit_reached",
            )

    def created(self, owner: str, amount: int = 1) -> None:
        hit = self._known.get(owner)
        if hit is not None:
            self._known[owner] = (hit[0], hit[1] + amount)


class JobBytesCap(JobCap):
    """At most ``cap`` bytes of stored job specs (payloads included) per owner's active jobs.

    The database side counts each spec as PostgreSQL stores it (``pg_column_size``: compressed,
    read from the TOAST pointer without fetching the value); between refreshes each create adds
    the size of its request body, which overestimates a compressible payload: the cap errs
    towards refusing early within one refresh, and is exact again at the next.
    """

    async def check(self, owner: str) -> None:
        if await self._current(owner) >= self._cap:
            raise Conflict(
                f"this owner's active jobs already store {self._cap} bytes of specs and payloads, "
                "the operator's cap (DUETIME_MAX_JOB_BYTES_PER_OWNER); send references (a URL or an "
                "id) instead of data, or cancel jobs you no longer need",
                code="job_bytes_limit_reached",
            )
