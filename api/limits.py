"""Per-owner limits the API enforces: a request rate weighted by cost, and a cap on jobs.

Both are per API process and approximate by design: a token bucket per owner in memory, and a job
count read from the database at most every ``refresh_s`` and advanced locally by each create. An
exact global count would put one hot row (or a count over the owner's index) in every create; the
documented trade is that a cap can be overshot by what other processes create within one refresh.

The rate counts cost, not requests. Every request takes one token when it is admitted (it needs
one to be admitted); a request whose work grows with what it asks for (a schedule preview, a job
whose schedule must be searched, a bulk change, a backfill) takes more once its cost is known
(``RequestCost``), in tokens of about one ordinary request's CPU each. The bucket may go below
zero that way, and the owner's next requests wait until it refills: a client that sends the most
expensive preview the limits allow gets a few a second at the default rate, not a thousand.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

from aiohttp import web

from duetime.core.errors import Conflict, RateLimited
from duetime.core.workbudget import WorkBudget

# One token is about the CPU of one ordinary request (~0.3 ms here). Measured on the development
# machine: a schedule search step is 3 to 9 µs (core.workbudget); a bulk pause of 5,000 jobs with
# 14 KiB specs took 590 ms of the API process's CPU (0.12 ms a job); a backfill of 1,000
# occurrences 180 ms; a page of 1,000 such jobs 1.5 s to decode and write (0.1 ms a KiB).
STEPS_PER_TOKEN: Final = 50
JOBS_PER_TOKEN: Final = 4
OCCURRENCES_PER_TOKEN: Final = 2
# An answer's body past this size costs a token per RESPONSE_BYTES_PER_TOKEN: a list page's cost
# grows with its limit and the size of what it lists (a page of 1,000 jobs with 1,000 excluded
# dates each is 14 MiB).
FREE_RESPONSE_BYTES: Final = 32 * 1024
RESPONSE_BYTES_PER_TOKEN: Final = 4 * 1024


def response_tokens(size: int) -> float:
    """The tokens an answer of ``size`` bytes costs beyond its request's admission."""
    return max(size - FREE_RESPONSE_BYTES, 0) / RESPONSE_BYTES_PER_TOKEN


@dataclass(slots=True)
class RequestCost:
    """What one request's work cost beyond its admission token, charged when it ends."""

    work: WorkBudget = field(default_factory=WorkBudget)  # schedule search steps (counted, no cap)
    tokens: float = 0.0  # other work, already in tokens

    def total_tokens(self) -> float:
        return self.tokens + self.work.spent / STEPS_PER_TOKEN


COST: Final = web.RequestKey("duetime_request_cost", RequestCost)


def cost_of(request: web.Request) -> RequestCost:
    """This request's cost record (the middleware charges it to the owner when the request ends)."""
    cost = request.get(COST)
    if cost is None:
        cost = request[COST] = RequestCost()
    return cost


# A client that keeps sending after 429s: this many refusals within one second, and each further
# refusal is held this long before it is answered, so refusing costs the server a timer, not a
# request's worth of work each (answering 429s back to back was itself a flood).
PERSISTENT_REFUSALS: Final = 5
HOLD_S: Final = 1.0


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
                f"too many requests for this owner (limit {self._rate:g}/s per API process, "
                f"expensive requests counting as several); retry after {math.ceil(wait)} s",
                retry_after_s=max(1, math.ceil(wait)),
            )
        if now - self._last_sweep > 60.0:
            self._sweep(now)

    def charge(self, owner: str, tokens: float) -> None:
        """Take ``tokens`` more for a request that has done its work; the bucket may go below
        zero, and the owner's next request is admitted once it has refilled to one token."""
        if tokens <= 0.0:
            return
        now = self._clock()
        bucket = self._buckets.get(owner)
        if bucket is None:
            bucket = self._buckets[owner] = _Bucket(self._burst, now)
        else:
            bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.stamp) * self._rate)
            bucket.stamp = now
        bucket.tokens -= tokens

    def _sweep(self, now: float) -> None:
        """Forget owners whose bucket has been full for a while, so memory follows activity."""
        self._last_sweep = now
        idle = [
            o
            for o, b in self._buckets.items()
            if now - b.stamp > 60.0 and b.tokens + (now - b.stamp) * self._rate >= self._burst
        ]
        for owner in idle:
            del self._buckets[owner]


@dataclass(slots=True)
class _Refusals:
    count: int  # 429s since ``since``
    since: float
    held: int = 0  # 429s of this owner being held now


class RefusalHolds:
    """429s given to a client that ignores ``Retry-After`` are held before they are answered.

    A client that sends again at once after a 429 (more than ``PERSISTENT_REFUSALS`` refusals
    within a second, whatever refused it: the owner's rate or a bounded queue) has each further
    429 answered ``HOLD_S`` later: refusing costs the server a timer, not a request's worth of
    work each, and a client on one connection can no longer turn refusals into a flood. A
    client that honours ``Retry-After`` is never held. At most ``per_owner`` 429s of one owner
    and ``total`` in all are held at once; past that a 429 goes out at once.
    """

    def __init__(
        self, per_owner: int = 64, total: int = 4096, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._per_owner = per_owner
        self._total = total
        self._clock = clock
        self._owners: dict[str, _Refusals] = {}
        self._held = 0
        self._last_sweep = clock()

    def hold_for(self, owner: str) -> float:
        """Count a 429 given to ``owner``: how long to hold it (0: answer at once)."""
        now = self._clock()
        seen = self._owners.get(owner)
        if seen is None:
            seen = self._owners[owner] = _Refusals(0, now)
        elif now - seen.since >= 1.0:
            seen.count, seen.since = 0, now  # in place: the 429s being held count down this one
        seen.count += 1
        if now - self._last_sweep > 60.0:
            self._last_sweep = now
            for quiet in [o for o, r in self._owners.items() if now - r.since > 60.0 and not r.held]:
                del self._owners[quiet]
        if seen.count <= PERSISTENT_REFUSALS or seen.held >= self._per_owner or self._held >= self._total:
            return 0.0
        return HOLD_S

    async def hold(self, owner: str) -> None:
        """Wait as long as ``hold_for`` says before the 429 is answered."""
        seconds = self.hold_for(owner)
        if seconds <= 0.0:
            return
        seen = self._owners[owner]
        seen.held += 1
        self._held += 1
        try:
            await asyncio.sleep(seconds)
        finally:
            seen.held -= 1
            self._held -= 1


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
