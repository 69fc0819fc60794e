"""Registration benchmark: sustained POST /v1/jobs per second with 50 concurrent clients.

    python -m loadtest.register --seconds 20 --clients 50 --api-processes 2

Starts ``duetime api`` processes on a scratch database (several share one port with
SO_REUSEPORT), drives them with wrk (Debian package ``wrk``; a Python client is the fallback, and
is itself CPU-bound on a small machine), then counts the jobs that really landed in PostgreSQL so
the figure is of durable registrations, not of answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp
import asyncpg
import uvloop

from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.common import free_port, print_report, quantiles, scratch_database

BODY = {
    "name": "bench",
    "target": {"type": "webhook", "url": "https://hooks.example.com/duetime", "headers": {"X-Token": "t"}},
    "payload": {"order": 12345, "items": ["a", "b", "c"]},
    "schedule": {"cron": "0 0 * * *", "timezone": "Europe/Berlin"},
    "retry": {"max_attempts": 3},
}

_LUA = """
wrk.method = "POST"
wrk.body = [[%s]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
"""


def _run_wrk(url: str, key: str, clients: int, seconds: int) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(_LUA % (json.dumps(BODY), key))
        script = f.name
    try:
        out = subprocess.run(
            ["wrk", "-t2", f"-c{clients}", f"-d{seconds}s", "--latency", "-s", script, url + "/v1/jobs"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        os.unlink(script)

    def ms(text: str) -> float:
        value, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    lat = dict(re.findall(r"\s+(50|90|99)%\s+(\S+)", out))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "client": "wrk",
        "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "latency_ms": {f"p{k}": ms(v) for k, v in lat.items()},
        "errors": int(non2xx.group(1)) if non2xx else 0,
    }


async def _run_python(url: str, key: str, clients: int, seconds: int) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    body = json.dumps(BODY).encode()

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.monotonic() < deadline:
            t = time.perf_counter()
            async with http.post(url + "/v1/jobs", data=body, headers=headers) as resp:
                await resp.read()
                if resp.status != 201:
                    errors += 1
            latencies.append((time.perf_counter() - t) * 1000)

    started = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    q = quantiles(latencies)
    return {
        "client": "python",
        "requests_per_s": len(latencies) / (time.monotonic() - started),
        "latency_ms": {k: q[k] for k in ("p50", "p90", "p99")},
        "errors": errors,
    }


def _start_apis(env: dict[str, str], n: int) -> list[subprocess.Popen[bytes]]:
    # Plain subprocess from a thread: uvloop's own subprocess support leaks descriptors into
    # long-lived children (see duetime/embedded_pg.py).
    return [
        subprocess.Popen(
            [sys.executable, "-m", "duetime", "api"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]


def _stop_apis(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)


async def bench(seconds: int, clients: int, api_processes: int, pool_size: int) -> None:
    async with scratch_database() as dsn:
        store = await PostgresStore.open(ShardMap.single(dsn), pool_size=2)
        key, _ = await store.create_api_key("bench")
        await store.close()
        port = free_port()
        env = {
            **os.environ,
            "DUETIME_DATABASE_URL": dsn,
            "DUETIME_HTTP_PORT": str(port),
            "DUETIME_DB_POOL_SIZE": str(pool_size),
            "DUETIME_LOG_LEVEL": "WARNING",
        }
        procs = await asyncio.to_thread(_start_apis, env, api_processes)
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http:
                for _ in range(200):
                    try:
                        async with http.get(url + "/healthz") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # let every process bind
            if shutil.which("wrk"):
                result = await asyncio.to_thread(_run_wrk, url, key, clients, seconds)
            else:
                result = await _run_python(url, key, clients, seconds)
        finally:
            await asyncio.to_thread(_stop_apis, procs)
        conn = await asyncpg.connect(dsn)
        try:
            landed = await conn.fetchval("SELECT count(*) FROM jobs")
        finally:
            await conn.close()
    result.update(
        {
            "seconds": seconds,
            "clients": clients,
            "api_processes": api_processes,
            "jobs_in_database": landed,
            "durable_per_s": round(landed / seconds),
        }
    )
    print_report(
        "register",
        result,
        [
            ("load", f"{clients} concurrent clients for {seconds} s ({result['client']})"),
            ("API processes", str(api_processes)),
            ("POST /v1/jobs answered per second", f"{result['requests_per_s']:.0f}"),
            ("jobs durable in PostgreSQL per second", f"{result['durable_per_s']}"),
            (
                "latency p50/p90/p99",
                " / ".join(f"{result['latency_ms'][k]:.1f}" for k in ("p50", "p90", "p99")) + " ms",
            ),
            ("non-201 answers", str(result["errors"])),
        ],
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--api-processes", type=int, default=2)
    p.add_argument("--pool-size", type=int, default=20, help="DUETIME_DB_POOL_SIZE per API process")
    a = p.parse_args()
    uvloop.run(bench(a.seconds, a.clients, a.api_processes, a.pool_size))


if __name__ == "__main__":
    main()
