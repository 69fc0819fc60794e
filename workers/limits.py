"""Per-target-host politeness for calls made one at a time (``Dispatcher.deliver``: the failure
events): a concurrency cap and a token bucket, per host, made on demand. Runs go through the
worker's per-host queues instead (workers/hostqueues.py), which apply the same limits without a
waiting coroutine per run.

A midnight burst may fan one million runs onto a handful of hosts or onto a million different
ones. Both must work: one host must not be flooded past what its owner can take, and a million
hosts seen once must not leave a million semaphores behind. Entries are therefore created lazily
and dropped once nobody uses them *and* their bucket has refilled (dropping a half-empty bucket
would hand the host a fresh burst it has not earned).

The clock and the sleep are arguments so the bucket is tested with a fake clock, not with sleeps.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

_SWEEP_FLOOR = 1024


class TokenBucket:
    """``rate`` tokens a second, holding at most ``burst``.

    Waiters reserve a token by driving the level below zero and sleep until it would be back,
    so they are served in arrival order without polling, and the send rate never exceeds ``rate``.
    """

    __slots__ = ("_burst", "_clock", "_last", "_rate", "_sleep", "_tokens")

    def __init__(self, rate_per_s: float, burst: int, *, clock: Clock, sleep: Sleep) -> None:
        if rate_per_s <= 0:
            raise ValueError("rate_per_s must be > 0")
        if burst < 1:
            raise ValueError("burst must be >= 1")
        self._rate = rate_per_s
        self._burst = float(burst)
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        elapsed = now - self._last
        if elapsed > 0:
            self._tokens = min(self._burst, self._tokens + elapsed * self._rate)
        self._last = now

    @property
    def tokens(self) -> float:
        self._refill()
        return self._tokens

    def full(self) -> bool:
        return self.tokens >= self._burst

    async def acquire(self, n: int = 1) -> None:
        """Take ``n`` tokens (a batch of calls takes one each), waiting until they are earned."""
        self._refill()
        self._tokens -= n
        if self._tokens >= 0:
            return
        try:
            await self._sleep(-self._tokens / self._rate)
        except BaseException:
            # A cancelled waiter gives its reservation back so it does not slow the others.
            self._refill()
            self._tokens = min(self._burst, self._tokens + n)
            raise


class _HostEntry:
    __slots__ = ("bucket", "semaphore", "users")

    def __init__(self, concurrency: int, bucket: TokenBucket) -> None:
        self.semaphore = asyncio.Semaphore(concurrency)
        self.bucket = bucket
        self.users = 0


class HostLimiter:
    """``async with limiter.slot(host):`` waits for a free concurrency slot, then for a token."""

    def __init__(
        self,
        concurrency: int,
        rate_per_s: float,
        burst: int | None = None,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if rate_per_s <= 0:
            raise ValueError("rate_per_s must be > 0")
        if burst is not None and burst < 1:
            raise ValueError("burst must be >= 1")
        self._concurrency = concurrency
        self._rate = rate_per_s
        # Default burst: one second's worth, so a host at its steady rate never waits.
        self._burst = burst if burst is not None else max(1, math.ceil(rate_per_s))
        self._clock = clock
        self._sleep = sleep
        self._entries: dict[str, _HostEntry] = {}
        self._sweep_at = _SWEEP_FLOOR

    def __len__(self) -> int:
        """Hosts currently tracked (used or still refilling); for tests and metrics."""
        return len(self._entries)

    def in_use(self, host: str) -> int:
        """Callers holding or waiting for a slot on ``host``."""
        entry = self._entries.get(host)
        return 0 if entry is None else entry.users

    def _entry(self, host: str) -> _HostEntry:
        entry = self._entries.get(host)
        if entry is None:
            if len(self._entries) >= self._sweep_at:
                self.sweep()
                self._sweep_at = max(_SWEEP_FLOOR, 2 * len(self._entries))
            bucket = TokenBucket(self._rate, self._burst, clock=self._clock, sleep=self._sleep)
            entry = _HostEntry(self._concurrency, bucket)
            self._entries[host] = entry
        return entry

    def sweep(self) -> int:
        """Forget idle hosts whose bucket is full again; returns how many were dropped.

        Called on its own when the table has doubled since the last sweep, so its cost is
        amortised over the insertions that grew the table.
        """
        idle = [h for h, e in self._entries.items() if e.users == 0 and e.bucket.full()]
        for host in idle:
            del self._entries[host]
        return len(idle)

    @asynccontextmanager
    async def slot(self, host: str, calls: int = 1) -> AsyncIterator[None]:
        """One concurrency slot and ``calls`` tokens: a batch of calls sent together (one
        pipeline to a broker) holds one slot and pays the rate for each call."""
        entry = self._entry(host)
        entry.users += 1
        try:
            async with entry.semaphore:
                await entry.bucket.acquire(calls)
                yield
        finally:
            entry.users -= 1
            if entry.users == 0 and entry.bucket.full() and self._entries.get(host) is entry:
                del self._entries[host]
