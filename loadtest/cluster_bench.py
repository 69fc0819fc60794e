"""End-to-end runs per second through the cluster path — `duetime engine` → NATS JetStream →
`duetime worker` → a loopback receiver — with 1, 2 and 4 worker processes on this machine.

Each round registers a burst of N one-off jobs due at the same instant (directly in the database,
so the API is not what is measured), waits until the receiver has seen every run, and reports the
drain rate (N / (last arrival − due)), lateness quantiles and the CPU seconds each role spent.
With --profile it also samples the busiest worker and engine with py-spy and prints their hottest
functions: that is where the bottleneck sits.

    .venv/bin/python -m loadtest.cluster_bench [--runs 5000] [--workers 1,2,4] [--profile]

Prints one JSON line, then a table. DUETIME_BENCH_PG names the PostgreSQL server (a scratch
database is created and dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from duetime.core.model import JobSpec, OneOffSchedule, WebhookTarget
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.cluster import stop_processes, wait_ready
from loadtest.common import ReceiverProcess, print_report, quantiles, scratch_database
from tests.cluster.harness import Arrivals, NatsServer, cluster_env
from tests.support.processes import DuetimeProcess

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


async def _insert(store: PostgresStore, owner: str, url: str, due: datetime, n: int) -> None:
    spec = JobSpec(target=WebhookTarget(url=url), schedule=OneOffSchedule(due))
    sem = asyncio.Semaphore(64)

    async def one() -> None:
        async with sem:
            await store.create_job(owner, spec)

    await asyncio.gather(*(one() for _ in range(n)))


def _hot_functions(raw: Path, top: int = 8) -> list[tuple[str, float]]:
    """py-spy raw (collapsed) output → the functions with the most self samples, as shares."""
    self_samples: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.split(";")[-1]
        self_samples[leaf] += int(count)
        total += int(count)
    return [(fn, n / total) for fn, n in self_samples.most_common(top)] if total else []


_STAGES = {
    "duetime_fence_seconds": "fence (engine, serial)",
    "duetime_nats_publish_seconds": "publish to PubAck (engine, serial)",
    "duetime_nats_take_seconds": "take (workers, serial each)",
    "duetime_target_latency_seconds": "target calls (workers, concurrent)",
}


async def _stage_seconds(urls: dict[str, str]) -> dict[str, float]:
    """Seconds spent per stage over the round, summed over processes, from their /metrics."""
    import aiohttp

    out: dict[str, float] = dict.fromkeys(_STAGES.values(), 0.0)
    async with aiohttp.ClientSession() as http:
        for url in urls.values():
            async with http.get(url + "/metrics") as resp:
                text = await resp.text()
            for line in text.splitlines():
                name, _, value = line.partition(" ")
                base = name.removesuffix("_sum")
                if name.endswith("_sum") and base in _STAGES:
                    out[_STAGES[base]] += float(value)
    return {k: round(v, 2) for k, v in out.items()}


async def one_round(
    dsn: str, nats: NatsServer, *, workers: int, runs: int, logdir: Path, profile: bool
) -> dict[str, Any]:
    env = cluster_env(
        ",".join(f"{s}={dsn}" for s in range(16)),
        nats.url,
        DUETIME_LOG_LEVEL="WARNING",
        DUETIME_WORKER_CONCURRENCY="512",
        DUETIME_DB_POOL_SIZE="8",
        DUETIME_NATS_RUN_SUBJECT=f"bench.w{workers}",
    )
    receiver = ReceiverProcess()
    receiver.start()
    procs = [DuetimeProcess("engine", {**env, "DUETIME_ENGINE_ID": f"bench-{workers}"}, ["engine"], logdir)]
    procs += [DuetimeProcess(f"worker{i}", env, ["worker"], logdir) for i in range(workers)]
    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=8)
    try:
        for p in procs:
            p.start()
        urls = {p.name: await wait_ready(p) for p in procs}
        owner = f"bench_{uuid.uuid4().hex[:6]}"
        await store.create_api_key(owner)
        lead = 5.0 + runs / 1500
        due = (datetime.now(UTC) + timedelta(seconds=lead)).replace(microsecond=0)
        started = time.monotonic()
        await _insert(store, owner, f"{receiver.url}/bench", due, runs)
        inserted_s = time.monotonic() - started
        await asyncio.sleep(max((due - datetime.now(UTC)).total_seconds() - 1.0, 0))
        pids = {p.name: p.proc.pid for p in procs if p.proc is not None}
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        spies: list[tuple[str, Path, asyncio.subprocess.Process]] = []
        spy_bin = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
        if profile and spy_bin is not None:
            for name in ("engine", "worker0"):
                out = logdir / f"{name}-w{workers}.raw"
                spy = await asyncio.create_subprocess_exec(
                    spy_bin,
                    "record",
                    "--nonblocking",
                    "-f",
                    "raw",
                    "-r",
                    "50",
                    "-d",
                    "8",
                    "-o",
                    str(out),
                    "--pid",
                    str(pids[name]),
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                spies.append((name, out, spy))
        deadline = time.monotonic() + 120 + runs / 50
        arrivals = Arrivals.of([])
        while time.monotonic() < deadline:
            arrivals = Arrivals.of(await receiver.dump())
            if len(arrivals.by_job) >= runs:
                break
            await asyncio.sleep(0.2)
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        stages = await _stage_seconds(urls)
        hot: dict[str, list[tuple[str, float]]] = {}
        for name, out, spy in spies:
            await asyncio.wait_for(spy.wait(), 30)
            if out.exists():
                hot[name] = _hot_functions(out)
        firsts = [calls[0][2] / 1e9 for calls in arrivals.by_job.values()]
        late = [t * 1000 - due.timestamp() * 1000 for t in firsts]
        drain_s = max(firsts) - due.timestamp() if firsts else float("nan")
        return {
            "workers": workers,
            "runs": runs,
            "arrived": len(arrivals.by_job),
            "duplicates": len(arrivals.duplicated()),
            "insert_s": round(inserted_s, 2),
            "drain_s": round(drain_s, 2),
            "runs_per_s": round(len(firsts) / drain_s, 1) if firsts and drain_s > 0 else None,
            "lateness_ms": {k: round(v, 1) for k, v in quantiles(late).items()},
            "cpu_s": {
                "engine": round(cpu["engine"], 2),
                "workers": round(sum(v for k, v in cpu.items() if k.startswith("worker")), 2),
            },
            "stage_busy_s": stages,
            "hot": {k: [(fn, round(share, 3)) for fn, share in v] for k, v in hot.items()},
        }
    finally:
        await stop_processes(procs, grace_s=60)
        await store.close()
        receiver.stop()


async def main(args: argparse.Namespace) -> None:
    logdir = Path(tempfile.mkdtemp(prefix="duetime-cluster-bench-"))
    nats = NatsServer()
    nats.start()
    results = []
    try:
        async with scratch_database("duetime_cluster_bench") as dsn:
            for workers in args.workers:
                results.append(
                    await one_round(
                        dsn, nats, workers=workers, runs=args.runs, logdir=logdir, profile=args.profile
                    )
                )
    finally:
        nats.cleanup()
    rows: list[tuple[str, str]] = []
    for r in results:
        q = r["lateness_ms"]
        rows.append(
            (
                f"{r['workers']} worker process{'es' if r['workers'] > 1 else ''}",
                f"{r['runs_per_s']} runs/s  (drained {r['arrived']}/{r['runs']} in {r['drain_s']} s, "
                f"dup {r['duplicates']}; lateness p50 {q['p50']:.0f} p99 {q['p99']:.0f} ms; "
                f"cpu engine {r['cpu_s']['engine']} s, workers {r['cpu_s']['workers']} s)",
            )
        )
        busy = ", ".join(f"{k} {v} s" for k, v in r["stage_busy_s"].items())
        rows.append(("  busy per stage", busy))
        for name, fns in r["hot"].items():
            rows.append((f"  hottest in {name}", ", ".join(f"{fn} {share:.0%}" for fn, share in fns[:4])))
    print_report(
        "cluster_bench",
        {"cpus": os.cpu_count(), "results": results, "logs": str(logdir)},
        rows,
    )


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=int(os.environ.get("DUETIME_LOADTEST_RUNS", "5000")))
    parser.add_argument(
        "--workers", type=lambda t: [int(x) for x in t.split(",")], default=[1, 2, 4], help="e.g. 1,2,4"
    )
    parser.add_argument("--profile", action="store_true", help="sample the engine and a worker with py-spy")
    return parser.parse_args()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(_parse()))
