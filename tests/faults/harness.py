"""Real Duetime processes for the fault scenarios, an owner that talks HTTP to the API process,
and the step every scenario ends with: gather jobs and histories from the API, the recording
from the target, and hand them to the checker.

Processes write their output to a file (never to a pipe nobody reads: a chatty process blocked
on a full pipe would look like a hang we injected), which the secrets test also greps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from loadtest.common import free_port
from tests.faults.checker import Expected, JobView, Report, check, job_view_from_api
from tests.faults.recorder import RecorderProcess

ROOT = Path(__file__).resolve().parents[2]


def seeded(name: str) -> tuple[int, random.Random]:
    """The scenario's seed (DUETIME_FAULT_SEED, else a fresh one), printed so a failure replays."""
    raw = os.environ.get("DUETIME_FAULT_SEED")
    seed = int(raw) if raw else random.SystemRandom().randrange(1 << 32)
    print(f"\n[{name}] seed {seed} (replay with DUETIME_FAULT_SEED={seed})", flush=True)
    return seed, random.Random(seed)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


def node_env(dsn: str, **extra: str) -> dict[str, str]:
    """Short leases and quick janitor rounds, so a lapse resolves in seconds, not minutes."""
    return {
        "DUETIME_DATABASE_URL": dsn,
        "DUETIME_HTTP_HOST": "127.0.0.1",
        "DUETIME_HTTP_PORT": "0",
        "DUETIME_WEBHOOK_ALLOW_PRIVATE": "1",
        "DUETIME_POLL_INTERVAL_S": "0.5",
        "DUETIME_JANITOR_INTERVAL_S": "0.5",
        "DUETIME_LEASE_S": "3",
        "DUETIME_HEARTBEAT_S": "1",
        "DUETIME_SHUTDOWN_GRACE_S": "5",
        "DUETIME_WORKER_CONCURRENCY": "128",
        "DUETIME_DB_POOL_SIZE": "4",
        "DUETIME_API_OWNER_RATE": "0",
        **extra,
    }


class NodeProc:
    """``python -m duetime <command>`` with its output in ``log``."""

    def __init__(self, env: Mapping[str, str], command: str, log: Path) -> None:
        self.command = command
        self.log = log
        self.env = dict(env)
        self._out = log.open("ab")
        self._offset = log.stat().st_size
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "duetime", command],
            env={**os.environ, **self.env},
            cwd=ROOT,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        self.url = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def ready(self, within: float = 60.0) -> str:
        """Wait for the ready line; returns the URL it serves (API or health/metrics)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            text = self.log.read_bytes()[self._offset :].decode(errors="replace")
            for line in text.splitlines():
                if "serving http" in line or "health and metrics on http" in line:
                    self.url = line.rsplit(" ", 1)[1].strip()
                    return self.url
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.command} exited with {self.proc.returncode}:\n{text[-3000:]}")
            await asyncio.sleep(0.05)
        raise AssertionError(f"{self.command} did not get ready within {within} s")

    def tail(self, chars: int = 3000) -> str:
        """The end of this process's output, for an assertion message."""
        return self.log.read_bytes()[self._offset :].decode(errors="replace")[-chars:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    async def proc_wait(self, within: float) -> int | None:
        """Until the process exits (its exit code), or None if it still runs after ``within`` s."""
        try:
            return await asyncio.to_thread(self.proc.wait, within)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    async def kill(self) -> None:
        self.signal(signal.SIGKILL)
        await asyncio.to_thread(self.proc.wait)
        self._out.close()

    async def stop(self, within: float = 30.0) -> int | None:
        """SIGTERM (after SIGCONT, in case it was stopped); SIGKILL if it will not go."""
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout=within)
            except TimeoutError:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        self._out.close()
        return self.proc.returncode


async def metric(url: str, name: str) -> float:
    """One counter's value (summed over labels) from a process's /metrics."""
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        text = await resp.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            metric_name = line.split("{")[0].split(" ")[0]
            if metric_name == name:
                total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class Owner:
    """An owner with a key, talking to the API process."""

    base: str
    key: str
    http: aiohttp.ClientSession
    created: list[str] = field(default_factory=list)
    dsn: str | None = None  # the database, for the raw rows a failure message shows

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.key}"}
        async with self.http.request(method, self.base + path, json=body, headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)

    async def create(self, spec: dict[str, Any]) -> dict[str, Any]:
        for _ in range(50):
            status, body = await self.call("POST", "/v1/jobs", spec)
            if status == 201:
                self.created.append(body["id"])
                return body  # type: ignore[no-any-return]
            if status not in (429, 503):
                raise AssertionError(f"create answered {status}: {body}")
            await asyncio.sleep(0.2)
        raise AssertionError("create kept answering 429/503")

    async def create_many(
        self, specs: Iterable[dict[str, Any]], concurrency: int = 32
    ) -> list[dict[str, Any]]:
        items = list(specs)
        out: list[dict[str, Any] | None] = [None] * len(items)
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with sem:
                out[i] = await self.create(items[i])

        await asyncio.gather(*(one(i) for i in range(len(items))))
        return [o for o in out if o is not None]

    async def runs(self, job_id: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor = None
        while True:
            path = f"/v1/jobs/{job_id}/runs?limit=1000" + (f"&cursor={cursor}" if cursor else "")
            status, page = await self.call("GET", path)
            assert status == 200, page
            items.extend(page["items"])
            cursor = page["next_cursor"]
            if not cursor:
                return items

    async def views(self, job_ids: Iterable[str], concurrency: int = 16) -> dict[str, JobView]:
        ids = list(job_ids)
        out: dict[str, JobView] = {}
        sem = asyncio.Semaphore(concurrency)

        async def one(job_id: str) -> None:
            async with sem:
                status, job = await self.call("GET", f"/v1/jobs/{job_id}")
                assert status == 200, job
                out[job_id] = job_view_from_api(job, await self.runs(job_id))

        await asyncio.gather(*(one(i) for i in ids))
        return out

    async def ids(self, state: str) -> set[str]:
        out: set[str] = set()
        cursor = None
        while True:
            path = f"/v1/jobs?state={state}&limit=1000" + (f"&cursor={cursor}" if cursor else "")
            status, page = await self.call("GET", path)
            assert status == 200, page
            out.update(job["id"] for job in page["items"])
            cursor = page["next_cursor"]
            if not cursor:
                return out

    async def settle(self, within: float, *, exclude: Iterable[str] = ()) -> None:
        """Until no job of this owner is still scheduled (every one-off finished, every bounded
        cron past its end), except ``exclude`` (jobs moved far ahead on purpose), or fail."""
        skip = set(exclude)
        deadline = time.monotonic() + within
        left: set[str] = set()
        while time.monotonic() < deadline:
            left = await self.ids("scheduled") - skip
            if not left:
                return
            await asyncio.sleep(0.5)
        explained = await self._explain(left)
        raise AssertionError(f"{len(left)} jobs still scheduled after {within} s:\n{explained}")

    async def _explain(self, ids: Iterable[str], at_most: int = 3) -> str:
        """What a stuck job looks like: its API view, its runs and its raw row, so a failure in CI
        can be understood without reproducing it."""
        lines: list[str] = []
        for job_id in sorted(ids)[:at_most]:
            lines.append(f"job {json.dumps((await self.call('GET', f'/v1/jobs/{job_id}'))[1])}")
            lines.append(f"runs {json.dumps((await self.call('GET', f'/v1/jobs/{job_id}/runs'))[1])}")
            if self.dsn is not None:
                conn = await asyncpg.connect(self.dsn)
                try:
                    row = await conn.fetchrow("SELECT * FROM jobs WHERE job_id = $1::uuid", job_id)
                    lines.append(f"row {dict(row) if row is not None else None}")
                finally:
                    await conn.close()
        return "\n".join(lines)


@contextlib.asynccontextmanager
async def owner_on(api_url: str, dsn: str) -> AsyncIterator[Owner]:
    from duetime.storage.postgres import PostgresStore
    from duetime.storage.shardmap import ShardMap

    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=1)
    try:
        key, _ = await store.create_api_key("fault_" + os.urandom(4).hex())
    finally:
        await store.close()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        yield Owner(api_url, key, http, dsn=dsn)


def utc(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def whole_second(delay_s: float) -> datetime:
    return (datetime.now(UTC) + timedelta(seconds=delay_s)).replace(microsecond=0)


def one_off(url: str, at: datetime, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": {"type": "webhook", "url": url, "timeout_s": 10},
        "schedule": {"run_at": utc(at)},
        "retry": {"max_attempts": 5, "backoff_initial_s": 0.2, "backoff_max_s": 1},
    }
    spec.update(extra)
    return spec


def every_second(url: str, start: datetime, end: datetime, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": {"type": "webhook", "url": url, "timeout_s": 10},
        "schedule": {"cron": "* * * * * *", "start_at": utc(start), "end_at": utc(end)},
        "retry": {"max_attempts": 5, "backoff_initial_s": 0.2, "backoff_max_s": 1},
        "misfire_grace_s": 3600,
    }
    spec.update(extra)
    return spec


def expected_for(job: Mapping[str, Any]) -> list[Expected]:
    """A job's occurrences from its spec: one-offs by their run_at, crons by croniter."""
    from tests.faults.checker import cron_occurrences
    from tests.faults.recorder import parse_time

    schedule = job["schedule"]
    if "run_at" in schedule:
        return [Expected(job["id"], parse_time(schedule["run_at"]))]
    assert schedule.get("timezone", "UTC") == "UTC", "the reference handles UTC crons only"
    start, end = parse_time(schedule["start_at"]), parse_time(schedule["end_at"])
    return [Expected(job["id"], t) for t in cron_occurrences(schedule["cron"], start, end)]


async def account(
    owner: Owner,
    recorder: RecorderProcess,
    expected: list[Expected],
    *,
    job_ids: Iterable[str] | None = None,
    **kwargs: Any,
) -> Report:
    ids = list(job_ids) if job_ids is not None else sorted({e.job_id for e in expected})
    views = await owner.views(ids)
    wanted = set(ids)
    records = [r for r in recorder.records() if r.job_id in wanted]
    return check(expected, views, records, **kwargs)


def free_ports(n: int) -> list[int]:
    return [free_port() for _ in range(n)]
