"""Precision benchmark: N jobs a second due at distinct instants for D seconds, webhook target on
loopback, all-in-one Duetime nodes, receiver in its own process.

    python -m loadtest.precision --rate 1000 --seconds 60

Nodes run in child processes (``--processes``, default 2: what ``DUETIME_PROCESSES=2 duetime run``
does), each owning half of the shards. Prints fire lateness at the engine (fire instant - due
instant, exact per run) and start lateness at the receiver (arrival - due), lost and duplicated
runs, and what the fence before each call costs. Jobs are registered straight through the store
(not over HTTP) so registration does not compete with firing; say so in any figure you quote.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta

import uvloop

from duetime.core.model import JobSpec, OneOffSchedule, WebhookTarget
from duetime.core.signing import idempotency_key
from duetime.settings import Settings
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.common import ReceiverProcess, print_report, quantiles, scratch_database
from loadtest.nodes import NodeProcesses


async def bench(rate: int, seconds: int, lead_s: float, processes: int) -> None:
    receiver = ReceiverProcess()
    receiver.start()
    async with scratch_database() as dsn:
        settings = Settings.from_env(
            {"DUETIME_DATABASE_URL": dsn, "DUETIME_HTTP_PORT": "0", "DUETIME_WEBHOOK_ALLOW_PRIVATE": "1"}
        )
        nodes = NodeProcesses(settings, processes)
        nodes.start()
        store = await PostgresStore.open(ShardMap.single(dsn), pool_size=20)
        await store.create_api_key("bench")
        total = rate * seconds
        t0 = (datetime.now(UTC) + timedelta(seconds=lead_s)).replace(microsecond=0)
        step = timedelta(microseconds=1_000_000 // rate)
        due: dict[str, datetime] = {}
        sem = asyncio.Semaphore(32)
        reg_started = time.perf_counter()

        async def make(i: int) -> None:
            at = t0 + step * i
            spec = JobSpec(target=WebhookTarget(url=receiver.url + "/hook"), schedule=OneOffSchedule(at))
            async with sem:
                job, _ = await store.create_job("bench", spec)
            due[idempotency_key(job.id, at)] = at

        await asyncio.gather(*(make(i) for i in range(total)))
        reg_s = time.perf_counter() - reg_started
        await store.close()
        if datetime.now(UTC) > t0:
            raise SystemExit(f"registration took {reg_s:.1f} s, past the first due instant; raise --lead")
        end = t0 + step * total
        # wait until the last run is due, then a few seconds for the last calls to land
        await asyncio.sleep(max((end - datetime.now(UTC)).total_seconds(), 0) + 4)
        calls = await receiver.dump()
        reports = nodes.stop()
    receiver.stop()

    fire_late = [x for r in reports for x in r.fire_lateness_ms]
    fence_statements = sum(r.fence_statements for r in reports)
    fence_time = sum(r.fence_time_s for r in reports)
    seen: dict[str, int] = {}
    start_late: list[float] = []
    for k, _attempt, _token, arrived_ns in calls:
        seen[k] = seen.get(k, 0) + 1
        if k in due and seen[k] == 1:
            start_late.append(arrived_ns / 1e6 - due[k].timestamp() * 1000)
    lost = sum(1 for k in due if k not in seen)
    dup = sum(n - 1 for n in seen.values() if n > 1)
    fq = quantiles([float(x) for x in fire_late])
    sq = quantiles(start_late)
    result = {
        "runs": total,
        "rate_per_s": rate,
        "seconds": seconds,
        "processes": processes,
        "registration_per_s": round(total / reg_s),
        "fire_lateness_ms": {k: round(v, 2) for k, v in fq.items()},
        "start_lateness_ms": {k: round(v, 2) for k, v in sq.items()},
        "lost": lost,
        "duplicated": dup,
        "fence_statements": fence_statements,
        "fence_runs_per_statement": round(total / max(fence_statements, 1), 2),
        "fence_us_per_run": round(fence_time / max(total, 1) * 1e6, 1),
        "node_peak_rss_mb": [round(r.peak_rss_mb, 1) for r in reports],
    }

    def row(q: dict[str, float]) -> str:
        return " / ".join(f"{q[k]:.1f}" for k in ("p50", "p90", "p99", "max")) + " ms"

    print_report(
        "precision",
        result,
        [
            ("runs (rate x seconds)", f"{total} ({rate}/s x {seconds} s), webhook on loopback"),
            ("node processes", str(processes)),
            ("registration (store, 32 concurrent)", f"{result['registration_per_s']}/s"),
            ("fire lateness at engine p50/p90/p99/max", row(fq)),
            ("start lateness at receiver p50/p90/p99/max", row(sq)),
            ("lost / duplicated", f"{lost} / {dup}"),
            (
                "fence: statements, runs each, time per run",
                f"{fence_statements}, {result['fence_runs_per_statement']}, {result['fence_us_per_run']} us",
            ),
            ("peak RSS per node", ", ".join(f"{r.peak_rss_mb:.0f} MB" for r in reports)),
        ],
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=int, default=1000, help="runs due per second (distinct instants)")
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--lead", type=float, default=75.0, help="seconds between start and the first due run")
    p.add_argument("--processes", type=int, default=2, help="node processes sharing the shards")
    a = p.parse_args()
    uvloop.run(bench(a.rate, a.seconds, a.lead, a.processes))


if __name__ == "__main__":
    main()
