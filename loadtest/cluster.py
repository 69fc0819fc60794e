"""Separate ``duetime engine`` and ``duetime worker`` processes for the benchmarks, over the NATS
run queue: start them (``tests.support.processes.DuetimeProcess``, the same launcher the
tests use), wait until each one's /readyz answers 200, read a counter from their /metrics, stop
them all (SIGTERM, SIGKILL after a grace) and delete the run queue's stream afterwards.

Used by ``loadtest.burst --topology cluster`` and ``loadtest.cluster_bench``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from duetime.app import split_shards
from duetime.runqueue.natsqueue import stream_name
from duetime.settings import format_shard_set
from tests.support.processes import DuetimeProcess


async def wait_ready(proc: DuetimeProcess, within: float = 60.0) -> str:
    """The process's health URL once its /readyz answers 200 (the CLI's "is running" line comes
    first: it names the port; /readyz then says whether the database and NATS are reachable)."""
    deadline = time.monotonic() + within
    line = await proc.ready(within=within)
    url = line.rsplit(" ", 1)[-1].strip()
    last = ""
    async with aiohttp.ClientSession() as http:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url + "/readyz") as resp:
                    if resp.status == 200:
                        return url
                    last = f"{resp.status} {await resp.text()}"
            if not proc.alive:
                raise RuntimeError(f"{proc.name} exited while starting:\n{proc.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{proc.name} did not become ready ({last}):\n{proc.output()[-3000:]}")
            await asyncio.sleep(0.1)


async def stop_processes(procs: Sequence[DuetimeProcess], grace_s: float = 30.0) -> dict[str, int]:
    """SIGTERM to every live process, then each gets ``grace_s`` to exit before SIGKILL; returns
    the exit codes by name (-9 for a killed one)."""
    codes: dict[str, int] = {}
    live = [p for p in procs if p.alive]
    for p in live:
        p.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in live:
        try:
            codes[p.name] = await p.wait(max(deadline - time.monotonic(), 0.1))
        except TimeoutError:
            p.kill()
            codes[p.name] = -9
    for p in procs:
        p.kill()  # closes the logs of those that had already exited
    return codes


async def counter_total(http: aiohttp.ClientSession, url: str, name: str) -> float:
    """The sum over all label sets of one counter in a process's /metrics."""
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[-1])
    return total


async def delete_stream(nats_url: str, prefix: str) -> bool:
    """Delete the run queue's work-queue stream (and its consumer with it); False when absent."""
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(nats_url)
    try:
        try:
            ok: bool = await nc.jetstream().delete_stream(stream_name(prefix))
        except NotFoundError:
            return False
        return ok
    finally:
        await nc.close()


class EnginesAndWorkers:
    """``engines`` ``duetime engine`` processes sharing the 16 shards and ``workers`` ``duetime
    worker`` processes, all with DUETIME_RUN_QUEUE=nats and the run-queue subject prefix ``prefix``.

    By default the engines run without ``--shards`` and deal the shards among themselves (the
    production shape); ``split=True`` gives each a disjoint ``--shards`` set instead (as
    ``duetime.app.split_shards`` deals them), the hand-written layout of earlier figures."""

    def __init__(
        self,
        env: dict[str, str],
        shards: frozenset[int],
        *,
        engines: int,
        workers: int,
        nats_url: str,
        prefix: str,
        logdir: Path,
        name: str = "bench",
        split: bool = False,
    ) -> None:
        self.nats_url = nats_url
        self.prefix = prefix
        common = {
            **env,
            "DUETIME_RUN_QUEUE": "nats",
            "DUETIME_NATS_URL": nats_url,
            "DUETIME_NATS_RUN_SUBJECT": prefix,
            "DUETIME_HTTP_HOST": "127.0.0.1",
            "DUETIME_HTTP_PORT": "0",
        }
        groups = split_shards(shards, engines) if split else [shards] * engines
        self.engines = [
            DuetimeProcess(
                f"engine-{i}",
                {**common, "DUETIME_ENGINE_ID": f"{name}-engine-{i}"},
                ["engine", "--shards", format_shard_set(group)] if split or len(group) < 16 else ["engine"],
                logdir,
            )
            for i, group in enumerate(groups)
        ]
        self.killed: set[str] = set()
        self.workers = [DuetimeProcess(f"worker-{i}", common, ["worker"], logdir) for i in range(workers)]
        self.urls: dict[str, str] = {}

    @property
    def procs(self) -> list[DuetimeProcess]:
        return [*self.engines, *self.workers]

    async def start(self, within: float = 90.0) -> None:
        """Start all at once (they load in parallel) and wait until every one is ready."""
        for p in self.procs:
            p.start()
        urls = await asyncio.gather(*(wait_ready(p, within) for p in self.procs))
        self.urls = {p.name: url for p, url in zip(self.procs, urls, strict=True)}

    def named_pids(self) -> dict[str, int]:
        return {p.name: p.proc.pid for p in self.procs if p.proc is not None}

    def alive(self) -> bool:
        """Every process runs, except the ones ``kill`` was asked to kill."""
        return all(p.alive for p in self.procs if p.name not in self.killed)

    def kill(self, name: str) -> None:
        """SIGKILL one process (a failover measurement): no release, no goodbye."""
        self.killed.add(name)
        next(p for p in self.procs if p.name == name).kill()

    def logs(self) -> str:
        return "\n".join(f"==== {p.name}\n{p.output()[-3000:]}" for p in self.procs)

    async def claims(self, http: aiohttp.ClientSession) -> float:
        """Rows claimed into the engines' wheels so far (their duetime_claims_total)."""
        totals = await asyncio.gather(
            *(
                counter_total(http, self.urls[p.name], "duetime_claims_total")
                for p in self.engines
                if p.name not in self.killed
            )
        )
        return sum(totals)

    async def stop(self, grace_s: float = 30.0) -> dict[str, int]:
        """Stop every process, then delete the run queue's stream so runs never collide."""
        try:
            return await stop_processes(self.procs, grace_s)
        finally:
            with contextlib.suppress(Exception):
                await delete_stream(self.nats_url, self.prefix)
