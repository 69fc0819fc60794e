"""Shared pieces of the benchmarks: a scratch database, claimed one-off jobs in it, a receiver in
its own process, quantiles, and the two outputs every benchmark prints (one JSON line, one human
table)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import resource
import secrets
import socket
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from duetime.core.model import Broker, JobSpec, OneOffSchedule, QueueTarget, RetryPolicy
from duetime.core.runpath import Claim
from duetime.storage.bulk import BulkJob, analyze_jobs, seed_jobs
from duetime.storage.migrate import migrate
from duetime.storage.postgres import PostgresStore

ADMIN_DSN = os.environ.get("DUETIME_BENCH_PG", "postgresql://root@127.0.0.1:5432/postgres")


@contextlib.asynccontextmanager
async def scratch_database(prefix: str = "duetime_bench") -> AsyncIterator[str]:
    """A fresh migrated database, dropped afterwards (benchmarks never touch real data)."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    conn = await asyncpg.connect(ADMIN_DSN)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base, _, _ = ADMIN_DSN.rpartition("/")
    dsn = f"{base}/{name}"
    await migrate(dsn)
    try:
        yield dsn
    finally:
        conn = await asyncpg.connect(ADMIN_DSN)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


async def claimed_one_offs(
    store: PostgresStore, dsn: str, n: int, *, topic: str, analyze: bool = False
) -> list[list[Claim]]:
    """``n`` one-off jobs like the burst's (bulk COPY, a Redis stream target, one attempt) due a
    second ago, claimed by the engine "bench" for 600 s: the claims of each ``claim_due`` call
    (at most 500, one shard's). ``analyze``: ANALYZE after the seed, as the burst does, so the
    planner sees the rows (as idle)."""
    due = datetime.now(UTC) - timedelta(seconds=1)
    spec = JobSpec(
        target=QueueTarget(broker=Broker.REDIS, topic=topic),
        schedule=OneOffSchedule(due),
        retry=RetryPolicy(max_attempts=1),
    )
    ids = set(await seed_jobs([dsn] * 16, (BulkJob("bench", spec) for _ in range(n)), datetime.now(UTC)))
    if analyze:
        await analyze_jobs([dsn])
    batches: list[list[Claim]] = []
    for shard in range(16):
        while True:
            claims = [
                c
                for c in await store.claim_due(shard, "bench", lookahead_s=60, lease_s=600, limit=500)
                if c.job_id in ids
            ]
            if not claims:
                break
            batches.append(claims)
    return batches


def quantiles(values: Sequence[float], qs: Sequence[float] = (0.5, 0.9, 0.99)) -> dict[str, float]:
    if not values:
        return {f"p{int(q * 100)}": float("nan") for q in qs} | {"max": float("nan")}
    ordered = sorted(values)
    out = {f"p{int(q * 100)}": ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in qs}
    out["max"] = ordered[-1]
    return out


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def print_report(name: str, result: dict[str, Any], rows: list[tuple[str, str]]) -> None:
    print(json.dumps({"benchmark": name, **result}, default=str))
    width = max(len(k) for k, _ in rows)
    print(f"\n{name}")
    print("-" * (width + 30))
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ---------------------------------------------------------------- receiver process


def _receiver_main(port: int, ready: Any, status: int) -> None:
    """A uvloop webhook receiver in its own process, so its timing is not the engine's loop.

    Records (idempotency key, attempt, fencing token, arrival ns) per call; GET /__dump returns
    them all as JSON lines.
    """
    import uvloop
    from aiohttp import web

    records: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        arrived = time.time_ns()
        if request.path == "/__dump":
            return web.Response(text="\n".join(records))
        h = request.headers
        await request.read()
        records.append(
            f"{h.get('Idempotency-Key')}\t{h.get('Duetime-Attempt')}\t{h.get('Duetime-Fencing-Token')}\t{arrived}"
        )
        return web.Response(status=status)

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        ready.set()
        await asyncio.Event().wait()

    uvloop.run(main())


class ReceiverProcess:
    def __init__(self, status: int = 200) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        ctx = mp.get_context("spawn")
        self._ready = ctx.Event()
        self._proc = ctx.Process(target=_receiver_main, args=(self.port, self._ready, status), daemon=True)

    def start(self) -> None:
        self._proc.start()
        if not self._ready.wait(30):
            raise RuntimeError("receiver process did not start")

    async def dump(self) -> list[tuple[str, int, int, int]]:
        import aiohttp

        async with aiohttp.ClientSession() as http, http.get(self.url + "/__dump") as resp:
            text = await resp.text()
        out = []
        for line in text.splitlines():
            key, attempt, token, arrived = line.split("\t")
            out.append((key, int(attempt), int(token), int(arrived)))
        return out

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.join(5)
