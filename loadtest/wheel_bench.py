"""Timer wheel benchmark: memory per waiting run, insert/expire rates, and driver fire lateness.

Run ``python -m loadtest.wheel_bench --entries 1000000``. Prints one JSON line (for CI logs and
trend tracking) and a human table. Targets: fire lateness p50 <= 2 ms and p99 <= 10 ms; <= 250 bytes
of RSS per waiting entry; a one-millisecond burst of a million entries fired without holding the
event loop for seconds.

Entry layout used here (52 bytes, the size the engine budgets for one claimed run)::

    offset size  field
    0      8     due instant, ms since epoch, big-endian int64 (the wheel's fixed header)
    8      16    job id (UUID bytes)
    24     8     lease token, int64
    32     8     scheduled_for, ms since epoch, int64 (the fire key with the job id)
    40     2     attempt, uint16
    42     1     shard, uint8
    43     9     spare (zero here; room for run kind / misfire flags without re-measuring)

Memory is measured twice: RSS from ``/proc/self/statm`` before and after building and inserting
the entries (what the kernel really charges, entries included, since the entries are the wheel's
storage), and ``tracemalloc`` over the same work in a second, separate wheel (what Python itself
allocated; immune to allocator slack and page reuse, but slower to run).

Burst figures: ``burst_cascade_s`` / ``burst_expire_s`` are single unlimited ``expire`` calls (the
raw cost of moving and of firing a million entries due in one millisecond); the ``burst_driver_*``
figures push the same burst through ``WheelDriver`` (sliced ``expire(limit=batch)``) while a 1 ms
ticker task records the longest the event loop was held.

Lateness: ``--lateness-entries`` entries at distinct due milliseconds (the window is widened to one
ms per entry when needed: 20,000 entries take 20 s), fed in claim batches of 500 through the driver
on the chosen loop, lateness = wall time in ``on_fire`` minus the due instant. ``--early-ms`` sets
the driver's spin window (0, the default, is what the engine uses).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import struct
import sys
import time
import tracemalloc
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from duetime.engine.clock import SystemClock
from duetime.engine.wheel import TimerWheel, WheelDriver, entry_due_ms

ENTRY = struct.Struct(">q16sqqHB9x")
assert ENTRY.size == 52

CLAIM_BATCH = 500  # the engine inserts what one claim query returns


def make_entries(count: int, due: Callable[[int], int], seed: int = 7) -> Iterator[bytes]:
    """Realistic entries; ``due(i)`` gives the i-th due instant. A generator, so no list is held."""
    rng = random.Random(seed)
    for i in range(count):
        d = due(i)
        yield ENTRY.pack(d, rng.randbytes(16), rng.getrandbits(62), d - rng.randrange(0, 500), 0, i & 63)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def _batches(it: Iterator[bytes], size: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for e in it:
        batch.append(e)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _pct(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def bench_memory_and_insert(n: int) -> dict[str, float]:
    """RSS per entry and the claim-batch insert rate, for n entries spread over the next 60 s."""
    now = SystemClock().now_ms()
    rng = random.Random(1)
    gc.collect()
    rss0 = _rss_bytes()
    wheel = TimerWheel(now)
    t0 = time.perf_counter()
    for batch in _batches(make_entries(n, lambda i: now + rng.randrange(1, 60_000)), CLAIM_BATCH):
        wheel.insert_many(batch)
    build_insert_s = time.perf_counter() - t0
    gc.collect()
    rss1 = _rss_bytes()
    assert len(wheel) == n

    # Insert rate alone (entries pre-built, as the engine has them after decoding a claim).
    entries = wheel.drain()
    wheel2 = TimerWheel(now)
    t0 = time.perf_counter()
    for i in range(0, n, CLAIM_BATCH):
        wheel2.insert_many(entries[i : i + CLAIM_BATCH])
    insert_s = time.perf_counter() - t0
    # And expiring the whole minute in one jump (cascades from level 1 included).
    t0 = time.perf_counter()
    fired = wheel2.expire(now + 60_000)
    expire_spread_s = time.perf_counter() - t0
    assert len(fired) == n
    del entries, fired, wheel, wheel2
    gc.collect()

    # Second figure: what Python allocated, traced, for the same build + insert into a new wheel.
    tracemalloc.start()
    wheel3 = TimerWheel(now)
    rng = random.Random(1)
    for batch in _batches(make_entries(n, lambda i: now + rng.randrange(1, 60_000)), CLAIM_BATCH):
        wheel3.insert_many(batch)
    traced, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(wheel3) == n
    del wheel3
    gc.collect()
    return {
        "rss_bytes_per_entry": (rss1 - rss0) / n,
        "tracemalloc_bytes_per_entry": traced / n,
        "build_and_insert_per_s": n / build_insert_s,
        "insert_per_s": n / insert_s,
        "expire_spread_per_s": n / expire_spread_s,
    }


def bench_burst_expire(n: int) -> dict[str, float]:
    """A million entries due in the same millisecond: the cascade, then the fire."""
    now = SystemClock().now_ms()
    due = now + 30_000  # claimed ahead, so they wait at level 1 and cascade before firing
    wheel = TimerWheel(now)
    for batch in _batches(make_entries(n, lambda i: due), CLAIM_BATCH):
        wheel.insert_many(batch)
    cascade_at = wheel.next_due_ms()
    assert cascade_at is not None and cascade_at <= due
    t0 = time.perf_counter()
    early = wheel.expire(cascade_at) if cascade_at < due else []
    cascade_s = time.perf_counter() - t0
    assert early == []
    t0 = time.perf_counter()
    fired = wheel.expire(due)
    fire_s = time.perf_counter() - t0
    assert len(fired) == n and entry_due_ms(fired[0]) == due and entry_due_ms(fired[-1]) == due
    return {
        "burst_cascade_s": cascade_s,
        "burst_expire_s": fire_s,
        "burst_expire_per_s": n / fire_s,
    }


async def _lateness(entries: int, window_s: float, early_ms: float) -> dict[str, float]:
    """Fire lateness through the real driver: entries at distinct instants, real wall clock."""
    clock = SystemClock()
    start = clock.now_ms() + 500
    window_ms = max(int(window_s * 1000), entries)  # distinct instants need enough milliseconds
    instants = sorted(random.Random(3).sample(range(window_ms), entries))
    lateness: list[float] = []
    done = asyncio.Event()

    def on_fire(batch: list[bytes]) -> None:
        now = time.time_ns() / 1e6
        for e in batch:
            lateness.append(now - entry_due_ms(e))
        if len(lateness) >= entries:
            done.set()

    wheel = TimerWheel(clock.now_ms())
    driver = WheelDriver(wheel, clock, on_fire, early_wake_ms=early_ms)
    driver.start()
    # Feed the wheel the way the engine does: claim batches of 500, a little ahead of time.
    made = list(make_entries(entries, lambda i: start + instants[i]))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for batch in _batches(iter(made), CLAIM_BATCH):
        driver.insert_many(batch)
        await asyncio.sleep(0)
    await asyncio.wait_for(done.wait(), window_ms / 1000 + 30)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await driver.stop()
    lateness.sort()
    return {
        "late_p50_ms": _pct(lateness, 50),
        "late_p99_ms": _pct(lateness, 99),
        "late_max_ms": lateness[-1],
        "late_min_ms": lateness[0],
        "lateness_entries": float(len(lateness)),
        "lateness_window_s": window_ms / 1000,
        "lateness_cpu_share": cpu / wall,
    }


async def _burst_through_driver(n: int) -> dict[str, float]:
    """The midnight burst through the driver: how long until all are handed over, and how long
    the event loop was held at most meanwhile (a 1 ms ticker measures its own worst gap)."""
    clock = SystemClock()
    now = clock.now_ms()
    due = now + 3000
    wheel = TimerWheel(now)
    for batch in _batches(make_entries(n, lambda i: due), CLAIM_BATCH):
        wheel.insert_many(batch)
    handed = 0
    finished_at = 0.0
    done = asyncio.Event()

    def on_fire(batch: list[bytes]) -> None:
        nonlocal handed, finished_at
        handed += len(batch)
        if handed >= n:
            finished_at = time.time_ns() / 1e6
            done.set()

    max_gap = 0.0
    stop_ticker = False

    async def ticker() -> None:
        nonlocal max_gap
        last = time.perf_counter()
        while not stop_ticker:
            await asyncio.sleep(0.001)
            t = time.perf_counter()
            max_gap = max(max_gap, t - last)
            last = t

    ticker_task = asyncio.create_task(ticker())
    driver = WheelDriver(wheel, clock, on_fire)
    driver.start()
    await asyncio.wait_for(done.wait(), 60)
    stop_ticker = True
    await ticker_task
    await driver.stop()
    return {
        "burst_driver_all_handed_after_due_ms": finished_at - due,
        "burst_driver_loop_max_stall_ms": max_gap * 1000,
    }


def _run(coro: Coroutine[Any, Any, dict[str, float]], loop_kind: str) -> dict[str, float]:
    if loop_kind == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--entries", type=int, default=1_000_000, help="entries for memory/rate/burst runs")
    parser.add_argument("--lateness-entries", type=int, default=20_000)
    parser.add_argument("--lateness-window-s", type=float, default=10.0)
    parser.add_argument("--early-ms", type=float, default=0.0, help="driver early_wake_ms (spin window)")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--skip-driver", action="store_true", help="only the pure wheel figures")
    args = parser.parse_args(argv)

    result: dict[str, Any] = {
        "bench": "wheel",
        "entries": args.entries,
        "entry_bytes": ENTRY.size,
        "loop": args.loop,
        "early_wake_ms": args.early_ms,
        "python": sys.version.split()[0],
    }
    result.update(bench_memory_and_insert(args.entries))
    result.update(bench_burst_expire(args.entries))
    if not args.skip_driver:
        result.update(
            _run(_lateness(args.lateness_entries, args.lateness_window_s, args.early_ms), args.loop)
        )
        result.update(_run(_burst_through_driver(args.entries), args.loop))
    result["targets_met"] = bool(
        result["rss_bytes_per_entry"] <= 250
        and (args.skip_driver or (result["late_p50_ms"] <= 2 and result["late_p99_ms"] <= 10))
    )
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))

    rows = [
        ("RSS per waiting entry", f"{result['rss_bytes_per_entry']:.0f} B", "<= 250 B"),
        ("tracemalloc per entry", f"{result['tracemalloc_bytes_per_entry']:.0f} B", ""),
        ("build+insert (claim batches)", f"{result['build_and_insert_per_s'] / 1e6:.2f} M/s", ""),
        ("insert (claim batches)", f"{result['insert_per_s'] / 1e6:.2f} M/s", ""),
        ("expire 1 min spread, one jump", f"{result['expire_spread_per_s'] / 1e6:.2f} M/s", ""),
        ("burst: cascade L1->L0", f"{result['burst_cascade_s'] * 1000:.0f} ms", ""),
        ("burst: expire 1 ms", f"{result['burst_expire_s'] * 1000:.0f} ms", ""),
    ]
    if not args.skip_driver:
        rows += [
            ("fire lateness p50", f"{result['late_p50_ms']:.2f} ms", "<= 2 ms"),
            ("fire lateness p99", f"{result['late_p99_ms']:.2f} ms", "<= 10 ms"),
            ("fire lateness max", f"{result['late_max_ms']:.2f} ms", ""),
            ("fire lateness min (never < 0)", f"{result['late_min_ms']:.2f} ms", ">= 0"),
            ("CPU share while firing", f"{result['lateness_cpu_share'] * 100:.0f} %", ""),
            (
                "burst via driver: all handed",
                f"{result['burst_driver_all_handed_after_due_ms']:.0f} ms after due",
                "",
            ),
            ("burst via driver: loop max stall", f"{result['burst_driver_loop_max_stall_ms']:.0f} ms", ""),
        ]
    width = max(len(r[0]) for r in rows)
    print(f"\ntimer wheel, {args.entries:,} entries of {ENTRY.size} B, loop={args.loop}")
    for name, value, target in rows:
        print(f"  {name:<{width}}  {value:>22}  {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
