"""Client CPU per webhook call, without the engine or the database: the worker's real call path.

``WorkerPool.call`` (secret cache, watchdog, metrics) → ``Dispatcher.deliver`` (host limiter, global
cap, JSON body) → ``workers.webhook.call`` (SSRF check, contract headers and signature, the
keep-alive client of ``workers/http1.py``),
against ``loadtest.common.ReceiverProcess`` in another process, ``--concurrency`` calls in flight
as a node's ``DUETIME_WORKER_CONCURRENCY`` makes them. Reports this process's CPU µs per call
(getrusage: user + system) and calls/s; the receiver's CPU is not counted.

    python -m loadtest.webhook_bench --calls 20000 --concurrency 1024

Run it under ``py-spy record --native`` to see where the client's time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import uvloop

from duetime.core import ssrf
from duetime.core.model import JobSpec, OneOffSchedule, Outcome, WebhookTarget
from duetime.core.runpath import FencedRun, RunSpec
from duetime.core.signing import new_signing_secret
from duetime.storage.ports import SigningKeys
from duetime.workers.dispatch import Dispatcher
from duetime.workers.pool import WorkerPool
from loadtest.common import ReceiverProcess, print_report


class _Keys:
    """The only storage the call path reads: the owner's signing secret (cached by the pool)."""

    def __init__(self) -> None:
        self.keys = SigningKeys(new_signing_secret(), None, None)

    async def signing_keys(self, owner: str) -> SigningKeys:
        return self.keys


def _runs(n: int, url: str) -> list[FencedRun]:
    now = datetime.now(UTC)
    spec = RunSpec.of(
        JobSpec(
            schedule=OneOffSchedule(now + timedelta(seconds=1)),
            target=WebhookTarget(url=url, timeout_s=30),
            payload={"bench": True, "n": 1},
        )
    )
    return [
        FencedRun(
            job_id=uuid.uuid4(),
            shard=0,
            owner="bench",
            lease_token=i + 1,
            scheduled_for=now,
            due_at=now,
            attempt=1,
            spec=spec,
            run_kind="one_off",
        )
        for i in range(n)
    ]


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _bench(url: str, calls: int, concurrency: int, warmup: int) -> dict[str, Any]:
    dispatcher = Dispatcher(
        policy=ssrf.AddressPolicy(allow_private=os.environ.get("BENCH_STRICT") != "1"),
        nats_url=None,
        redis_url=None,
    )
    await dispatcher.start()
    pool = WorkerPool(_Keys(), None, dispatcher, None, concurrency=concurrency)  # type: ignore[arg-type]
    try:

        async def drive(runs: list[FencedRun]) -> dict[str, int]:
            it = iter(runs)
            outcomes: dict[str, int] = {}

            async def worker() -> None:
                for run in it:
                    report = await pool.call(run)
                    o = report.verdict.outcome.value
                    outcomes[o] = outcomes.get(o, 0) + 1
                    if report.verdict.outcome is not Outcome.SUCCEEDED and outcomes[o] == 1:
                        print("first failure:", report.verdict)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return outcomes

        await drive(_runs(warmup, url))
        runs = _runs(calls, url)
        gc.collect()
        cpu0, t0 = _cpu_s(), time.perf_counter()
        outcomes = await drive(runs)
        cpu1, t1 = _cpu_s(), time.perf_counter()
    finally:
        await dispatcher.close()
    return {
        "calls": calls,
        "concurrency": concurrency,
        "outcomes": outcomes,
        "wall_s": round(t1 - t0, 3),
        "calls_per_s": round(calls / (t1 - t0)),
        "client_cpu_us_per_call": round((cpu1 - cpu0) / calls * 1e6, 1),
        "load_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=2000)
    p.add_argument("--url", default=None, help="an already running receiver (default: start one)")
    args = p.parse_args()
    gc.freeze()
    gc.set_threshold(20_000, 20, 100)  # as a node (duetime.app.tune_gc)
    receiver = None
    url = args.url
    if url is None:
        receiver = ReceiverProcess()
        receiver.start()
        url = receiver.url + "/hook"
    try:
        result = uvloop.run(_bench(url, args.calls, args.concurrency, args.warmup))
    finally:
        if receiver is not None:
            receiver.stop()
    print_report(
        "webhook_bench",
        result,
        [
            ("calls", str(result["calls"])),
            ("concurrency", str(result["concurrency"])),
            ("outcomes", str(result["outcomes"])),
            ("calls/s", str(result["calls_per_s"])),
            ("client CPU µs/call", str(result["client_cpu_us_per_call"])),
            ("load (1 min)", str(result["load_1m"])),
        ],
    )


if __name__ == "__main__":
    main()
