"""Per-owner fairness in a burst: owner A's big burst and owner B's small one, due at the same
instant, Redis stream targets; the starts are read from the stream entry ids (the broker's own
millisecond clock), so no receiver process is the bottleneck.

    python -m loadtest.fairness --a 100000 --b 1000

B's runs must start within their normal lateness while A's drain: the table shows both owners'
start lateness and A's drain time. Jobs are seeded in bulk (COPY), then claimed by the engines
before the due instant.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import redis.asyncio as aioredis
import uvloop

from duetime.core.model import Broker, JobSpec, OneOffSchedule, QueueTarget
from duetime.settings import Settings
from duetime.storage.bulk import BulkJob, seed_jobs
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.common import print_report, quantiles, scratch_database
from loadtest.nodes import NodeProcesses

REDIS_URL = "redis://127.0.0.1:6379/0"


async def _starts(r: aioredis.Redis, key: str) -> list[int]:
    """Entry ids are ``<ms>-<seq>``: the broker's clock at XADD."""
    out: list[int] = []
    last = "-"
    while True:
        batch = await r.xrange(key, min=last, count=10_000)
        if last != "-" and batch:
            batch = batch[1:]
        if not batch:
            return out
        ids = [
            str(entry_id, "ascii") if isinstance(entry_id, bytes) else str(entry_id) for entry_id, _ in batch
        ]
        out.extend(int(i.split("-")[0]) for i in ids)
        last = ids[-1]


async def bench(a: int, b: int, processes: int, lead_s: float) -> None:
    tag = uuid.uuid4().hex[:6]
    key_a, key_b = f"fair-a-{tag}", f"fair-b-{tag}"
    r = aioredis.from_url(REDIS_URL)
    async with scratch_database() as dsn:
        settings = Settings.from_env(
            {"DUETIME_DATABASE_URL": dsn, "DUETIME_HTTP_PORT": "0", "DUETIME_REDIS_URL": REDIS_URL}
        )
        t = (datetime.now(UTC) + timedelta(seconds=lead_s)).replace(microsecond=0)
        spec_a = JobSpec(target=QueueTarget(Broker.REDIS, key_a), schedule=OneOffSchedule(t))
        spec_b = JobSpec(target=QueueTarget(Broker.REDIS, key_b), schedule=OneOffSchedule(t))
        # B's jobs are written last, so without fairness they would start after all of A's.
        jobs = [BulkJob("owner-a", spec_a) for _ in range(a)] + [BulkJob("owner-b", spec_b) for _ in range(b)]
        store = await PostgresStore.open(ShardMap.single(dsn), pool_size=2)
        for owner in ("owner-a", "owner-b"):
            await store.create_api_key(owner)  # owners and their signing secrets
        await store.close()
        seeded = time.perf_counter()
        await seed_jobs(settings.shard_dsns(), jobs, datetime.now(UTC))
        seed_s = time.perf_counter() - seeded
        if datetime.now(UTC) > t - timedelta(seconds=5):
            raise SystemExit(f"seeding took {seed_s:.0f} s, too close to T; raise --lead")
        nodes = NodeProcesses(settings, processes)
        nodes.start()
        try:
            t_ms = int(t.timestamp() * 1000)
            deadline = time.monotonic() + lead_s + 120
            while time.monotonic() < deadline:
                await asyncio.sleep(2)
                if await r.xlen(key_a) >= a and await r.xlen(key_b) >= b:
                    break
            starts_a = [s - t_ms for s in await _starts(r, key_a)]
            starts_b = [s - t_ms for s in await _starts(r, key_b)]
        finally:
            nodes.stop()
            await r.delete(key_a, key_b)
            await r.aclose()
    qa, qb = quantiles([float(x) for x in starts_a]), quantiles([float(x) for x in starts_b])
    result = {
        "owner_a_runs": a,
        "owner_b_runs": b,
        "processes": processes,
        "owner_a_started": len(starts_a),
        "owner_b_started": len(starts_b),
        "owner_a_start_lateness_ms": qa,
        "owner_b_start_lateness_ms": qb,
        "owner_a_drain_ms": max(starts_a, default=None),
    }

    def row(q: dict[str, float]) -> str:
        return " / ".join(f"{q[k]:.0f}" for k in ("p50", "p90", "p99", "max")) + " ms"

    print_report(
        "fairness",
        result,
        [
            ("burst", f"owner A {a} + owner B {b} runs due at one instant, Redis streams, seeded in bulk"),
            ("node processes", str(processes)),
            ("owner A start lateness p50/p90/p99/max", row(qa)),
            ("owner B start lateness p50/p90/p99/max", row(qb)),
            ("started A / B", f"{len(starts_a)} / {len(starts_b)}"),
        ],
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", type=int, default=100_000, help="owner A's runs")
    p.add_argument("--b", type=int, default=1_000, help="owner B's runs")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--lead", type=float, default=60.0, help="seconds from start to the due instant")
    a = p.parse_args()
    uvloop.run(bench(a.a, a.b, a.processes, a.lead))


if __name__ == "__main__":
    main()
