"""Per-host limits, driven by a fake monotonic clock: no test here sleeps for real."""

from __future__ import annotations

import asyncio

import pytest

from duetime.workers.limits import HostLimiter, TokenBucket


class FakeTime:
    """A monotonic clock and a sleep that records each wait and, if asked, moves the clock."""

    def __init__(self, *, advance_on_sleep: bool = True) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.advance_on_sleep = advance_on_sleep

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(round(delay, 9))
        if self.advance_on_sleep:
            self.now += delay
        await asyncio.sleep(0)


async def test_bucket_serves_the_burst_then_paces_at_the_rate() -> None:
    t = FakeTime()
    bucket = TokenBucket(10.0, 3, clock=t.clock, sleep=t.sleep)
    for _ in range(3):
        await bucket.acquire()
    assert t.sleeps == []
    await bucket.acquire()
    await bucket.acquire()
    assert t.sleeps == [pytest.approx(0.1), pytest.approx(0.1)]


async def test_bucket_refills_with_time_up_to_the_burst() -> None:
    t = FakeTime()
    bucket = TokenBucket(2.0, 4, clock=t.clock, sleep=t.sleep)
    for _ in range(4):
        await bucket.acquire()
    assert bucket.tokens == pytest.approx(0.0)
    t.now += 1.0
    assert bucket.tokens == pytest.approx(2.0)
    t.now += 100.0
    assert bucket.tokens == pytest.approx(4.0)
    assert bucket.full()


async def test_concurrent_waiters_queue_in_arrival_order() -> None:
    t = FakeTime(advance_on_sleep=False)
    bucket = TokenBucket(1.0, 1, clock=t.clock, sleep=t.sleep)
    await asyncio.gather(*(bucket.acquire() for _ in range(5)))
    # Each waiter reserved the next token: 1 s, 2 s, ... after now, never the same one twice.
    assert sorted(t.sleeps) == [1.0, 2.0, 3.0, 4.0]


async def test_cancelled_waiter_gives_its_token_back() -> None:
    t = FakeTime(advance_on_sleep=False)
    gate = asyncio.Event()

    async def blocking_sleep(delay: float) -> None:
        t.sleeps.append(delay)
        await gate.wait()

    bucket = TokenBucket(1.0, 1, clock=t.clock, sleep=blocking_sleep)
    await bucket.acquire()
    waiter = asyncio.create_task(bucket.acquire())
    await asyncio.sleep(0)
    assert bucket.tokens == pytest.approx(-1.0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert bucket.tokens == pytest.approx(0.0)
    t.now += 1.0
    assert bucket.tokens == pytest.approx(1.0)


async def test_slot_caps_concurrency_per_host_not_across_hosts() -> None:
    t = FakeTime()
    limiter = HostLimiter(2, 1000.0, clock=t.clock, sleep=t.sleep)
    release = asyncio.Event()
    inside: dict[str, int] = {"a": 0, "b": 0}
    peak: dict[str, int] = {"a": 0, "b": 0}

    async def user(host: str) -> None:
        async with limiter.slot(host):
            inside[host] += 1
            peak[host] = max(peak[host], inside[host])
            await release.wait()
            inside[host] -= 1

    tasks = [asyncio.create_task(user("a")) for _ in range(5)] + [asyncio.create_task(user("b"))]
    for _ in range(10):
        await asyncio.sleep(0)
    assert inside == {"a": 2, "b": 1}
    assert limiter.in_use("a") == 5
    release.set()
    await asyncio.gather(*tasks)
    assert peak == {"a": 2, "b": 1}
    assert limiter.in_use("a") == 0


async def test_slot_waits_for_rate_after_concurrency() -> None:
    t = FakeTime()
    limiter = HostLimiter(10, 4.0, burst=2, clock=t.clock, sleep=t.sleep)
    for _ in range(4):
        async with limiter.slot("h:443"):
            pass
    assert t.sleeps == [pytest.approx(0.25), pytest.approx(0.25)]


async def test_idle_host_with_full_bucket_is_forgotten_at_once() -> None:
    t = FakeTime()
    limiter = HostLimiter(4, 10.0, burst=1, clock=t.clock, sleep=t.sleep)
    async with limiter.slot("a:80"):
        t.now += 1.0  # the call took long enough for the bucket to refill
    assert len(limiter) == 0


async def test_half_empty_bucket_is_kept_so_no_free_burst_is_granted() -> None:
    t = FakeTime()
    limiter = HostLimiter(4, 1.0, burst=1, clock=t.clock, sleep=t.sleep)
    async with limiter.slot("a:80"):
        pass
    assert len(limiter) == 1
    t.now += 0.5
    assert limiter.sweep() == 0
    async with limiter.slot("a:80"):
        pass
    assert t.sleeps == [pytest.approx(0.5)]


async def test_many_distinct_hosts_do_not_leak_entries() -> None:
    t = FakeTime()
    limiter = HostLimiter(4, 100.0, burst=100, clock=t.clock, sleep=t.sleep)
    for i in range(10_000):
        async with limiter.slot(f"host{i}:443"):
            pass
        t.now += 0.001
    # Buckets refill within 10 ms of simulated time, so sweeps keep the table near its floor.
    assert len(limiter) <= 2048
    t.now += 10.0
    limiter.sweep()
    assert len(limiter) == 0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        HostLimiter(0, 1.0)
    with pytest.raises(ValueError, match="rate"):
        HostLimiter(1, 0.0)
    with pytest.raises(ValueError, match="burst"):
        HostLimiter(1, 1.0, burst=0)
