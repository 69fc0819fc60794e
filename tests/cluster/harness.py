"""A Duetime cluster of real processes for the cluster tests and the cluster benchmark: `duetime api`,
`duetime engine --shards …` and `duetime worker` started with ``python -m duetime``, a private
nats-server with JetStream, and helpers to register jobs through the API and check what a
receiver saw."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from tests.support import wait
from tests.support.processes import DuetimeProcess

NATS_SERVER = os.environ.get("DUETIME_TEST_NATS_SERVER", "/usr/sbin/nats-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class NatsServer:
    """A private nats-server with JetStream on a free port, its store in a temp dir (kept across a
    restart, so the stream survives it as it would in production)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.store = Path(tempfile.mkdtemp(prefix="duetime-nats-"))
        self.url = f"nats://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self) -> None:
        self._log = open(self.store / "server.log", "ab")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            [NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not _port_open(self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nats-server did not start: {self.tail()}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self._proc is not None:
            self._proc.send_signal(sig)
            try:
                self._proc.wait(20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.store / "server.log").read_text(errors="replace")[-2000:]
        return ""

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.store, ignore_errors=True)


def cluster_env(shard_dsns: str, nats_url: str, **extra: str) -> dict[str, str]:
    """Settings every process of a test cluster shares: short leases so a death costs seconds."""
    return {
        "DUETIME_SHARD_DSNS": shard_dsns,
        "DUETIME_RUN_QUEUE": "nats",
        "DUETIME_NATS_URL": nats_url,
        "DUETIME_HTTP_HOST": "127.0.0.1",
        "DUETIME_HTTP_PORT": "0",
        "DUETIME_WEBHOOK_ALLOW_PRIVATE": "1",
        "DUETIME_POLL_INTERVAL_S": "0.5",
        "DUETIME_JANITOR_INTERVAL_S": "0.5",
        "DUETIME_LEASE_S": "4",
        "DUETIME_HEARTBEAT_S": "1",
        "DUETIME_SHUTDOWN_GRACE_S": "10",
        "DUETIME_NATS_ACK_WAIT_S": "5",
        "DUETIME_QUEUE_WAIT_MAX_S": "30",
        "DUETIME_WORKER_CONCURRENCY": "256",
        "DUETIME_DB_POOL_SIZE": "4",
        "DUETIME_API_OWNER_RATE": "1000000",
        "DUETIME_LOG_LEVEL": "INFO",
        **extra,
    }


@dataclass
class Cluster:
    """The processes of one test: start them by role, stop them all at the end (SIGTERM, then
    SIGKILL for any that does not stop)."""

    env: dict[str, str]
    logdir: Path
    procs: dict[str, DuetimeProcess] = field(default_factory=dict)
    api_url: str = ""

    async def api(self, name: str = "api") -> DuetimeProcess:
        port = free_port()
        self.api_url = f"http://127.0.0.1:{port}"
        return await self._start(name, {"DUETIME_HTTP_PORT": str(port)}, ["api"])

    async def engine(self, name: str, shards: str | None = None) -> DuetimeProcess:
        """``duetime engine`` as ``test-<name>``; without ``shards`` it may serve all 16 and the
        dealing decides which it serves."""
        args = ["engine"] if shards is None else ["engine", "--shards", shards]
        return await self._start(name, {"DUETIME_ENGINE_ID": f"test-{name}"}, args)

    async def status(self) -> dict[str, Any]:
        """``duetime cluster status --json`` with the cluster's settings, parsed."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "duetime",
            "cluster",
            "status",
            "--json",
            env={**os.environ, **self.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, f"cluster status exited {proc.returncode}: {err.decode()[-2000:]}"
        answer: dict[str, Any] = json.loads(out)
        return answer

    async def worker(self, name: str) -> DuetimeProcess:
        return await self._start(name, {}, ["worker"])

    async def restart(self, name: str) -> DuetimeProcess:
        old = self.procs[name]
        new = DuetimeProcess(name, old.env, old.args, self.logdir).start()
        self.procs[name] = new
        await new.ready()
        return new

    async def _start(self, name: str, env: dict[str, str], args: list[str]) -> DuetimeProcess:
        proc = DuetimeProcess(name, {**self.env, **env}, args, self.logdir).start()
        self.procs[name] = proc
        await proc.ready()
        return proc

    async def stop_all(self) -> dict[str, int]:
        codes: dict[str, int] = {}
        live = [p for p in self.procs.values() if p.alive]
        for p in live:
            p.signal(signal.SIGTERM)
        for p in live:
            try:
                codes[p.name] = await p.wait(60)
            except TimeoutError:
                p.kill()
                codes[p.name] = -9
        for p in self.procs.values():
            p.kill()  # closes the logs of the ones that were already dead
        return codes

    def logs(self) -> str:
        return "\n".join(f"==== {p.name}\n{p.output()[-4000:]}" for p in self.procs.values())


# --------------------------------------------------------------------------- registering and checking


async def register(
    api_url: str,
    api_key: str,
    specs: Sequence[dict[str, Any]],
    *,
    concurrency: int = 64,
) -> list[str]:
    """POST every spec concurrently through the API; returns the job ids in order."""
    ids: list[str] = [""] * len(specs)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(specs)):
        queue.put_nowait(i)
    headers = {"Authorization": f"Bearer {api_key}"}

    async def one(http: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            for attempt in range(20):
                async with http.post(f"{api_url}/v1/jobs", json=specs[i], headers=headers) as resp:
                    body = await resp.json(content_type=None)
                    if resp.status == 201:
                        ids[i] = body["id"]
                        break
                    if resp.status not in (429, 503) or attempt == 19:
                        raise AssertionError(f"create failed: {resp.status} {body}")
                await asyncio.sleep(0.2)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(*(one(http) for _ in range(concurrency)))
    return ids


def one_off_specs(
    url: str, first: datetime, spread_s: float, n: int
) -> tuple[list[dict[str, Any]], dict[int, datetime]]:
    """n one-off webhook jobs due evenly over [first, first + spread_s], to the millisecond."""
    specs = []
    due: dict[int, datetime] = {}
    for i in range(n):
        at = first + timedelta(milliseconds=int(spread_s * 1000 * i / max(n, 1)))
        due[i] = at
        specs.append(
            {
                "target": {"type": "webhook", "url": url},
                "schedule": {"run_at": at.isoformat(timespec="milliseconds").replace("+00:00", "Z")},
            }
        )
    return specs, due


@dataclass
class Arrivals:
    """What the receiver saw, by job: [(attempt, fencing token, arrival ns)] in arrival order."""

    by_job: dict[str, list[tuple[int, int, int]]]
    keys: dict[str, set[str]]

    @classmethod
    def of(cls, records: list[tuple[str, int, int, int]]) -> Arrivals:
        by_job: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        keys: dict[str, set[str]] = defaultdict(set)
        for key, attempt, token, arrived in sorted(records, key=lambda r: r[3]):
            job = key.split(":", 1)[0]
            by_job[job].append((attempt, token, arrived))
            keys[job].add(key)
        return cls(dict(by_job), dict(keys))

    def duplicated(self) -> dict[str, list[tuple[int, int, int]]]:
        return {j: calls for j, calls in self.by_job.items() if len(calls) > 1}

    def total(self) -> int:
        return sum(len(c) for c in self.by_job.values())


async def wait_for_arrivals(
    receiver: Any, expected: set[str], *, within: float, settle_s: float = 2.0
) -> Arrivals:
    """Poll the receiver until every expected job arrived (then a little longer, so a duplicate
    that is on its way is seen too)."""
    deadline = time.monotonic() + within
    while True:
        arrivals = Arrivals.of(await receiver.dump())
        if expected <= arrivals.by_job.keys():
            await asyncio.sleep(settle_s)
            return Arrivals.of(await receiver.dump())
        if time.monotonic() > deadline:
            missing = expected - arrivals.by_job.keys()
            raise AssertionError(
                f"{len(missing)} of {len(expected)} runs never arrived, e.g. {sorted(missing)[:3]}"
            )
        await asyncio.sleep(0.5)


def lateness_ms(arrivals: Arrivals, due_by_job: dict[str, datetime]) -> list[float]:
    """First arrival minus due time, per job, in ms."""
    out = []
    for job, calls in arrivals.by_job.items():
        due = due_by_job.get(job)
        if due is not None:
            out.append(calls[0][2] / 1e6 - due.timestamp() * 1000)
    return out


async def until(
    check: Callable[[], Awaitable[bool]], *, within: float, what: str, every: float = 0.1
) -> None:
    """``tests.support.wait.until`` at this module's pace (every 0.1 s: a check here may dump a
    receiver's whole recording or start a ``duetime cluster status`` process)."""
    await wait.until(check, within=within, what=what, every=every)


async def arrived_jobs(receiver: Any) -> int:
    return len(Arrivals.of(await receiver.dump()).by_job)


def new_owner() -> str:
    return "cluster_" + uuid.uuid4().hex[:8]


def utcnow() -> datetime:
    return datetime.now(UTC)
