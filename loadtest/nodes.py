"""Duetime nodes in child processes for the benchmarks, each an all-in-one node owning a share of
the shards (what ``duetime run`` does with DUETIME_PROCESSES=N), reporting back exact per-run
fire lateness, fence statistics and peak RSS when they stop."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import resource
from dataclasses import dataclass
from typing import Any

from duetime.app import split_shards
from duetime.settings import Settings


@dataclass
class NodeReport:
    shards: list[int]
    fire_lateness_ms: list[int]
    fence_statements: int
    fence_time_s: float
    fenced: int
    peak_rss_mb: float
    wheel_peak: int


def _child(settings: Settings, started: Any, stop: Any, out: Any) -> None:
    import asyncio

    import uvloop

    from duetime.app import Node

    async def main() -> None:
        node = Node(settings, api=False)
        await node.start()
        assert node._engine is not None
        engine = node._engine
        late: list[int] = []
        engine.lateness_probe = late.extend
        peak = 0
        started.set()
        while not stop.is_set():
            peak = max(peak, engine.waiting_runs)
            await asyncio.sleep(0.05)
        statements, spent = engine.fence_statements, engine.fence_time_s
        await node.stop()
        out.send(
            NodeReport(
                shards=sorted(settings.shards),
                fire_lateness_ms=late,
                fence_statements=statements,
                fence_time_s=spent,
                fenced=len(late),
                peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                wheel_peak=peak,
            )
        )

    uvloop.run(main())


class NodeProcesses:
    def __init__(self, settings: Settings, processes: int) -> None:
        ctx = mp.get_context("spawn")
        self._stop = ctx.Event()
        self._procs: list[tuple[Any, Any, Any]] = []
        for i, group in enumerate(split_shards(settings.shards, processes)):
            child = dataclasses.replace(settings, shards=group, engine_id=f"bench-{i}", http_port=0)
            started = ctx.Event()
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(child, started, self._stop, send), daemon=True)
            self._procs.append((proc, started, recv))

    def start(self) -> None:
        for proc, _, _ in self._procs:
            proc.start()
        for proc, started, _ in self._procs:
            if not started.wait(60):
                raise RuntimeError(f"benchmark node {proc.pid} did not start")

    def pids(self) -> list[int]:
        return [p.pid for p, _, _ in self._procs]

    def stop(self) -> list[NodeReport]:
        self._stop.set()
        reports = []
        for proc, _, recv in self._procs:
            if recv.poll(120):
                reports.append(recv.recv())
            proc.join(30)
        return reports
