"""The record stage alone: CPU per run of ``complete_runs`` on the node and in PostgreSQL.

Seeds one-off jobs like the burst's (bulk COPY, a Redis stream target), claims and fences them,
then finishes them in batches of ``--batch`` succeeded reports, one batch at a time, alternating
the two completion paths round by round on fresh rows: ``finish_ordinary`` (one statement for
the ordinary reports, the default) and the general path alone (``lock_for_completion`` +
``core.lifecycle`` + ``apply_plans``/``insert_runs``). Measures, per run:

* node: this process's CPU (``time.process_time``: the driver's encoding and decoding, the
  completion's Python, the event loop), around the ``complete_runs`` calls only;
* PostgreSQL: ``utime + stime`` from ``/proc`` of the pool's backend, around the same calls;
* WAL bytes written meanwhile (``pg_current_wal_lsn``; the server's, so anything else writing
  to it counts too), and a check that every run got its one history row.

Usage: ``python -m loadtest.record_bench --runs 20000 --rounds 4``. Everything else on the
machine runs beside it, so compare the two paths within one invocation (they alternate) and note
the load average it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import UTC, datetime
from typing import Any

import uvloop

from duetime.core.model import Outcome
from duetime.core.runpath import AttemptReport, FencedRun, Verdict
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.common import claimed_one_offs, scratch_database
from loadtest.stages import procs_cpu_s


async def _fenced(store: PostgresStore, dsn: str, n: int) -> list[FencedRun]:
    """``n`` one-off jobs due a second ago, claimed and fenced."""
    runs: list[FencedRun] = []
    for claims in await claimed_one_offs(store, dsn, n, topic="bench-record"):
        runs.extend(await store.fence_runs(claims, lease_s=600))
    return runs


async def _record(
    store: PostgresStore, runs: list[FencedRun], batch: int, pids: list[int]
) -> dict[str, float]:
    now = datetime.now(UTC)
    ok = Verdict(Outcome.SUCCEEDED, False, None)
    reports = [AttemptReport(r, ok, now, now) for r in runs]
    for r in runs:
        _ = r.spec.parsed  # the worker parsed it for the call; not the record stage's cost
    lsn = "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"
    wal0 = await store.home_pool.fetchval(lsn)
    node0, pg0, wall0 = time.process_time(), procs_cpu_s(pids), time.perf_counter()
    applied = 0
    for i in range(0, len(reports), batch):
        applied += (await store.complete_runs(reports[i : i + batch])).applied
    node, pg, wall = time.process_time() - node0, procs_cpu_s(pids) - pg0, time.perf_counter() - wall0
    wal = await store.home_pool.fetchval(lsn) - wal0
    history = await store.home_pool.fetchval(
        "SELECT count(*) FROM runs WHERE job_id = ANY($1::uuid[])", [r.job_id for r in runs]
    )
    assert applied == len(reports) == history, (applied, len(reports), history)
    n = len(runs)
    return {"node_us": node / n * 1e6, "pg_us": pg / n * 1e6, "wal_b": float(wal) / n, "wall_s": wall}


async def main(a: argparse.Namespace) -> None:
    async with scratch_database("duetime_recordbench") as dsn:
        store = await PostgresStore.open(ShardMap.single(dsn), pool_size=1)
        try:
            async with store.home_pool.acquire() as conn:
                pids = [
                    r["pid"]
                    for r in await conn.fetch(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    )
                ]
            out: dict[str, list[dict[str, float]]] = {"ordinary": [], "general": []}
            for rnd in range(a.rounds):
                both = ("ordinary", "general") if rnd % 2 == 0 else ("general", "ordinary")
                for path in (p for p in both if a.only in (None, p)):
                    runs = await _fenced(store, dsn, a.runs)
                    store.finish_ordinary = path == "ordinary"
                    out[path].append(await _record(store, runs, a.batch, pids))
            summary: dict[str, Any] = {
                "benchmark": "record",
                "runs_per_round": a.runs,
                "batch": a.batch,
                "load_1m": os.getloadavg()[0],
                "backends": len(pids),
            }
            for path, results in out.items():
                if not results:
                    continue
                keys = ("node_us", "pg_us", "wal_b")
                mean = {k: round(sum(r[k] for r in results) / len(results), 2) for k in keys}
                summary[path] = mean | {
                    "node_us_each": [round(r["node_us"], 1) for r in results],
                    "pg_us_each": [round(r["pg_us"], 1) for r in results],
                    "wall_s_each": [round(r["wall_s"], 2) for r in results],
                }
            print(json.dumps(summary))
        finally:
            store.finish_ordinary = True
            await store.close()


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20_000, help="runs per round and path")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--batch", type=int, default=500, help="reports per complete_runs call (the Completer's)")
    p.add_argument("--only", choices=("ordinary", "general"), default=None, help="one path (profiling)")
    uvloop.run(main(p.parse_args()))


if __name__ == "__main__":
    cli()
