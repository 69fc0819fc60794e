"""Shared pieces of the benchmarks: a scratch database, claimed one-off jobs in it, a receiver in
its own process, quantiles, and the two outputs every benchmark prints (one JSON line, one human
table)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import multiprocessing as mp
import os
import re
import resource
import secrets
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class ReceivedCall:
    """One call as a receiver saw it: the contract headers, its arrival instant (the receiver's
    clock, ns since the epoch) and the port it came to (which "host" it was for)."""

    key: str
    attempt: int
    token: int
    arrived_ns: int
    port: int


@dataclass(frozen=True, slots=True)
class InflightSample:
    """Requests open at each port of a receiver at one instant (received, not answered yet)."""

    at_ns: int
    open_by_port: dict[int, int]


_HEAD_END = b"\r\n\r\n"
_FIELDS = re.compile(
    rb"\r\n(idempotency-key|duetime-attempt|duetime-fencing-token|content-length|connection)"
    rb"[ \t]*:[ \t]*([^\r]*)",
    re.IGNORECASE,
)
_REASONS = {200: b"OK", 202: b"Accepted", 429: b"Too Many Requests", 500: b"Internal Server Error"}


def _response(status: int, body: bytes = b"") -> bytes:
    reason = _REASONS.get(status, b"Status")
    return b"HTTP/1.1 %d %s\r\ncontent-length: %d\r\n\r\n%s" % (status, reason, len(body), body)


def _receiver_main(ports: list[int], ready: Any, status: int, delay_s: float, sample_s: float | None) -> None:
    """A uvloop webhook receiver in its own process, so its timing is not the engine's loop.

    Listens on every port of ``ports`` (each a "host" to the workers' per-host limits). Records
    (idempotency key, attempt, fencing token, arrival ns, port) per call, and answers ``status``
    ``delay_s`` later (a slow or hanging target). GET /__dump returns the calls as lines; with
    ``sample_s``, GET /__inflight returns the requests open per port, sampled that often.

    HTTP/1.1 is parsed by hand on an ``asyncio.Protocol`` (keep-alive, pipelined requests,
    ``Content-Length`` bodies) rather than served by a web framework: a framework's server costs
    about ten times the CPU per request, and on a 2-core box the receiver shares the cores with
    the scheduler it measures, so its own cost would be counted against the scheduler's throughput.
    """
    import uvloop

    records: list[str] = []
    open_now = dict.fromkeys(ports, 0)
    samples: list[str] = []
    answer = _response(status)

    class Conn(asyncio.Protocol):
        __slots__ = ("buf", "closing", "port", "transport")

        def __init__(self, port: int) -> None:
            self.port = port
            self.buf = b""
            self.closing = False
            self.transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport

        def connection_lost(self, exc: Exception | None) -> None:
            self.transport = None

        def data_received(self, data: bytes) -> None:
            arrived = time.time_ns()
            buf = self.buf + data if self.buf else data
            while True:
                end = buf.find(_HEAD_END)
                if end < 0:
                    break
                head = buf[:end]
                fields = {m[1].lower(): m[2] for m in _FIELDS.finditer(head)}
                size = int(fields.get(b"content-length", b"0"))
                if len(buf) < end + 4 + size:
                    break
                buf = buf[end + 4 + size :]
                self.request(head, fields, arrived)
            self.buf = buf

        def request(self, head: bytes, fields: dict[bytes, bytes], arrived: int) -> None:
            line = head[: head.find(b"\r\n")] if b"\r\n" in head else head
            path = line.split(b" ", 2)[1] if line.count(b" ") >= 2 else b"/"
            if fields.get(b"connection", b"").lower() == b"close":
                self.closing = True
            if path == b"/__dump":
                self.send(_response(200, "\n".join(records).encode()))
                return
            if path == b"/__inflight":
                self.send(_response(200, "\n".join(samples).encode()))
                return
            key, attempt, token = (
                value.decode() if (value := fields.get(name)) is not None else None
                for name in (b"idempotency-key", b"duetime-attempt", b"duetime-fencing-token")
            )
            records.append(f"{key}\t{attempt}\t{token}\t{arrived}\t{self.port}")
            if delay_s > 0:
                open_now[self.port] += 1
                asyncio.get_running_loop().call_later(delay_s, self.answer_late)
            else:
                self.send(answer)

        def answer_late(self) -> None:
            open_now[self.port] -= 1
            self.send(answer)

        def send(self, response: bytes) -> None:
            if self.transport is None or self.transport.is_closing():
                return
            self.transport.write(response)
            if self.closing:
                self.transport.close()

    async def sample() -> None:
        assert sample_s is not None
        while True:
            samples.append(f"{time.time_ns()}\t" + ",".join(f"{p}:{n}" for p, n in open_now.items()))
            await asyncio.sleep(sample_s)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for port in ports:  # a server lives as long as its loop: nothing to hold
            await loop.create_server(functools.partial(Conn, port), "127.0.0.1", port, backlog=4096)
        _sampler = asyncio.create_task(sample()) if sample_s else None  # held: tasks are weak refs
        ready.set()
        await asyncio.Event().wait()

    uvloop.run(main())


class ReceiverProcess:
    """A webhook receiver in its own process (``_receiver_main``). ``hosts`` ports, each a
    distinct ``127.0.0.1:port`` host to the workers; ``delay_s``: it answers that long after a
    call arrived (0: at once); ``sample_s``: how often it samples its open requests (None: never).
    ``url``/``port`` are the first host's."""

    def __init__(
        self, status: int = 200, *, delay_s: float = 0.0, hosts: int = 1, sample_s: float | None = None
    ) -> None:
        if hosts < 1:
            raise ValueError("a receiver needs at least one host (port)")
        self.ports = [free_port() for _ in range(hosts)]
        while len(set(self.ports)) < hosts:  # a port freed and handed out again
            self.ports = [free_port() for _ in range(hosts)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.port = self.ports[0]
        self.url = self.urls[0]
        ctx = mp.get_context("spawn")
        self._ready = ctx.Event()
        self._proc = ctx.Process(
            target=_receiver_main,
            args=(self.ports, self._ready, status, delay_s, sample_s),
            daemon=True,
        )

    def start(self) -> None:
        self._proc.start()
        if not self._ready.wait(30):
            raise RuntimeError("receiver process did not start")

    @property
    def pid(self) -> int | None:
        pid: int | None = self._proc.pid
        return pid

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the receiver process has used so far: what a benchmark
        subtracts to know what the receiver, not the scheduler, cost of the box's two cores."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def _get(self, path: str) -> str:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as http, http.get(self.url + path) as resp:
            return await resp.text()

    async def dump(self) -> list[tuple[str, int, int, int]]:
        """(idempotency key, attempt, fencing token, arrival ns) per call, in arrival order."""
        out = []
        for line in (await self._get("/__dump")).splitlines():
            key, attempt, token, arrived, _port = line.split("\t")
            out.append((key, int(attempt), int(token), int(arrived)))
        return out

    async def calls(self) -> list[ReceivedCall]:
        """Every call with the port (host) it came to, in arrival order."""
        out = []
        for line in (await self._get("/__dump")).splitlines():
            key, attempt, token, arrived, port = line.split("\t")
            out.append(ReceivedCall(key, int(attempt), int(token), int(arrived), int(port)))
        return out

    async def inflight(self) -> list[InflightSample]:
        """The open-request samples (``sample_s``), oldest first."""
        out = []
        for line in (await self._get("/__inflight")).splitlines():
            at, _, counts = line.partition("\t")
            by_port = {int(p): int(n) for p, _, n in (c.partition(":") for c in counts.split(",") if c)}
            out.append(InflightSample(int(at), by_port))
        return out

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.join(5)
