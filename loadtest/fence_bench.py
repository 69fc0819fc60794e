"""The fence stage alone: CPU per run of a fence on the node and in PostgreSQL.

Seeds one-off jobs like the burst's (bulk COPY and ANALYZE, a Redis stream target), claims them all, packs
each claim into the 43-byte wheel entry the engine keeps (``runqueue.wire``), then fences them in
batches of ``--batch`` as the engine's fencer does: the entries unpacked, ``fence_runs`` on them.
Measures, per run:

* node: this process's CPU (``time.process_time``), split into the unpacking of the entries and
  the ``fence_runs`` call (its arguments, the driver's encoding and decoding, a ``FencedRun`` per
  row, the event loop);
* PostgreSQL: ``utime + stime`` from ``/proc`` of the pool's backend around the same calls;
* that every run passed its fence;
* the share of the fence's row updates that were HOT (a new version on the same page, no index
  entry) and the WAL written per run, from PostgreSQL's counters around the fences (the WAL is
  the server's: other work on it counts too).

Each round fences fresh rows; the best round and the mean are printed, because the machine's
other work only ever adds time. Compare two versions of the code by running this in each (a
worktree for the older one), one right after the other, and note the load average it prints.

Usage: ``python -m loadtest.fence_bench --runs 20000 --rounds 5``. Prints one JSON line and a
table.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import uvloop

from duetime.runqueue import wire
from duetime.storage.bulk import table_writes
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.common import claimed_one_offs, print_report, scratch_database
from loadtest.stages import procs_cpu_s


async def _entries(store: PostgresStore, dsn: str, n: int) -> list[bytes]:
    """``n`` one-off jobs due a second ago, claimed (after an ANALYZE, as the burst does), each
    packed as the engine packs a claim."""
    lane = wire.owner_lane("bench")
    return [
        wire.pack_entry(wire.to_ms(c.due_at), c.job_id, c.lease_token, c.scheduled_for, c.shard, lane)
        for claims in await claimed_one_offs(store, dsn, n, topic="bench-fence", analyze=True)
        for c in claims
    ]


async def _fence(store: PostgresStore, entries: list[bytes], batch: int, pids: list[int]) -> dict[str, float]:
    unpack_s = call_s = 0.0
    fenced = 0
    pg0, wall0 = procs_cpu_s(pids), time.perf_counter()
    for i in range(0, len(entries), batch):
        t0 = time.process_time()
        items = [wire.unpack_entry(e) for e in entries[i : i + batch]]
        t1 = time.process_time()
        fenced += len(await store.fence_runs(items, lease_s=600))
        call_s += time.process_time() - t1
        unpack_s += t1 - t0
    pg, wall = procs_cpu_s(pids) - pg0, time.perf_counter() - wall0
    assert fenced == len(entries), (fenced, len(entries))
    n = len(entries)
    return {
        "unpack_us": unpack_s / n * 1e6,
        "call_us": call_s / n * 1e6,
        "node_us": (unpack_s + call_s) / n * 1e6,
        "pg_us": pg / n * 1e6,
        "wall_us": wall / n * 1e6,
    }


async def _counters(store: PostgresStore, dsn: str) -> dict[str, int]:
    """PostgreSQL's write counters with the pool's own counts in them. A backend keeps its counts
    to itself until it flushes them, and a pooled connection left idle did not within seconds
    (the fence's HOT updates were missing from pg_stat_user_tables while its pages held them), so
    the connection is told to flush at its next statement, and given one."""
    async with store.home_pool.acquire() as conn:
        await conn.execute("SELECT pg_stat_force_next_flush()")
        await conn.execute("SELECT 1")
    return await table_writes([dsn])


async def main(a: argparse.Namespace) -> None:
    async with scratch_database("duetime_fencebench") as dsn:
        store = await PostgresStore.open(ShardMap.single(dsn), pool_size=1)
        try:
            async with store.home_pool.acquire() as conn:
                pids = [
                    r["pid"]
                    for r in await conn.fetch(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    )
                ]
            rounds = []
            for _ in range(a.rounds):
                entries = await _entries(store, dsn, a.runs)
                before = await _counters(store, dsn)
                one = await _fence(store, entries, a.batch, pids)
                after = await _counters(store, dsn)
                updates = after["upd"] - before["upd"]
                one["hot_share"] = (after["hot_upd"] - before["hot_upd"]) / updates if updates else 0.0
                one["wal_b"] = (after["wal_bytes"] - before["wal_bytes"]) / len(entries)
                rounds.append(one)
        finally:
            await store.close()
    keys = ("unpack_us", "call_us", "node_us", "pg_us", "wall_us")
    summary: dict[str, Any] = {
        "benchmark": "fence",
        "label": a.label,
        "runs_per_round": a.runs,
        "batch": a.batch,
        "rounds": a.rounds,
        "load_1m": round(os.getloadavg()[0], 2),
        "best": {k: round(min(r[k] for r in rounds), 2) for k in keys},
        "mean": {k: round(sum(r[k] for r in rounds) / len(rounds), 2) for k in keys},
        "each": {k: [round(r[k], 1) for r in rounds] for k in keys},
        "hot_share": [round(r["hot_share"], 3) for r in rounds],
        "wal_bytes_per_run": [round(r["wal_b"]) for r in rounds],
    }
    print_report(
        "fence",
        summary,
        [
            (f"µs per run, {k.removesuffix('_us')}", f"best {summary['best'][k]}, mean {summary['mean'][k]}")
            for k in keys
        ]
        + [
            ("HOT share of updates", ", ".join(f"{h:.0%}" for h in summary["hot_share"])),
            ("WAL per run (B)", ", ".join(str(w) for w in summary["wal_bytes_per_run"])),
            ("load (1 min)", str(summary["load_1m"])),
        ],
    )


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20_000, help="runs per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=500, help="entries per fence (the engine's fence_batch)")
    p.add_argument("--label", default="", help="a name for this run in the JSON line (before, after)")
    uvloop.run(main(p.parse_args()))


if __name__ == "__main__":
    cli()
