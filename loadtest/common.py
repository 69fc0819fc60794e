"""Shared pieces of the benchmarks: a scratch database, a receiver in its own process, quantiles,
and the two outputs every benchmark prints (one JSON line, one human table)."""

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
from typing import Any

import asyncpg

from duetime.storage.migrate import migrate

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
