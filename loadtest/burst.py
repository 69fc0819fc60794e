"""The midnight burst: N one-off jobs due at one instant T, and how fast Duetime starts them all.

    python -m loadtest.burst --jobs 100000 --target redis --topology all-in-one \\
        --seed-mode bulk --processes 2
    python -m loadtest.burst --jobs 100000 --target redis --topology cluster \\
        --seed-mode bulk --processes 2 --workers 2

Registers N jobs due at the same whole second T, either through the HTTP API with many concurrent
clients (``--seed-mode api``: a ``duetime api`` process, ``--clients`` connections) or straight
into storage with COPY (``--seed-mode bulk``: ``storage.bulk``, for the million-row case; the
output says which). Then it waits and records when each run *started at the target*, from the
target's own clock so that the measuring side is never the bottleneck:

* ``webhook``: a uvloop receiver in its own process (``loadtest.common.ReceiverProcess``), arrival
  time per call;
* ``redis``: the stream entry id of each XADD (its first part is the Redis server's ms clock);
* ``nats``: the JetStream stored-message timestamp (message metadata).

``--topology all-in-one`` runs P node processes, each an engine for its share of the shards with
in-process workers (what ``DUETIME_PROCESSES=P duetime run`` does). ``--topology cluster`` runs P
separate ``duetime engine`` processes without ``--shards``, which deal the 16 shards among
themselves (DUETIME_SHARD_REPLICAS per shard; ``--split-shards`` gives each a disjoint
``--shards`` set instead, as ``duetime.app.split_shards`` does) and W (``--workers``) ``duetime
worker`` processes, over the
NATS run queue (DUETIME_RUN_QUEUE=nats) with a subject prefix of their own, so two runs on one
NATS never share a stream; the stream is deleted afterwards (``loadtest.cluster``). There the
benchmark counts completions from the database (history rows) and claims from the engines'
/metrics, and samples each process's RSS with psutil; the figures only an in-process node can
report (fire lateness at the engine, RSS per run waiting in the wheel, fence statements, GC time)
are null in the JSON and "n/a" in the table.

``--hosts H`` (webhook) spreads the jobs over H loopback ports of the receiver, each a host to the
workers' per-host limits; ``--target-delay-ms MS`` makes it answer each call MS after it arrived.

``--kill-engine-at S`` (cluster only) measures failover: S seconds after T it SIGKILLs engine-0,
having read from the membership which shards it served, and reports per such shard the time from
the kill to the first start of a run of that shard, and the lateness of the runs of those shards
that started after the kill (the ones that were waiting there).

Prints one JSON line and a table: registration rate, claims/s before T, starts/s after T (a
per-second series), completions/s, start lateness p50/p90/p99/max, drain time (last start − T),
lost and duplicated runs, database row writes per run (pg_stat_user_tables deltas, minus the N
inserts of the jobs themselves), WAL bytes per run, engine RSS per run waiting in the wheel, and
peak RSS of every process, and the load average at start and end; writes a PNG under
loadtest/out/.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import ctypes
import dataclasses
import gc
import itertools
import json
import math
import multiprocessing as mp
import os
import resource
import secrets
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import uvloop

from duetime.app import split_shards
from duetime.core import codec
from duetime.core.ids import shard_of
from duetime.core.model import (
    Broker,
    JobSpec,
    OneOffSchedule,
    QueueTarget,
    RetryPolicy,
    Target,
    WebhookTarget,
)
from duetime.settings import Settings
from duetime.storage.bulk import (
    BulkJob,
    HistoryLeft,
    OldHistory,
    analyze_jobs,
    old_history_left,
    outcome_counts,
    seed_jobs,
    seed_old_history,
    table_writes,
)
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest import pgstats
from loadtest.cluster import EnginesAndWorkers
from loadtest.common import ADMIN_DSN, ReceiverProcess, free_port, print_report, quantiles, scratch_database
from loadtest.plot import cumulative_to_rate, per_second, write_burst_plot, write_memory_plot
from loadtest.stages import StageWindow, report_rows

REDIS_URL = os.environ.get("DUETIME_BENCH_REDIS", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("DUETIME_BENCH_NATS", "nats://127.0.0.1:4222")
OUT_DIR = Path(__file__).parent / "out"
_PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------- accounting (pure)


@dataclass
class StartAccount:
    """What the target saw, against what was registered: lateness, lost, duplicated."""

    lateness_ms: list[float]
    first_start_s: dict[str, float]
    lost: int
    duplicated: int
    unexpected: int


def account_starts(expected: set[str], starts: Sequence[tuple[str, float]], t_due_s: float) -> StartAccount:
    """``starts`` are (job id, start instant in epoch seconds) as the target recorded them, in any
    order. The first start of a job counts for its lateness; each further one is a duplicate."""
    first: dict[str, float] = {}
    duplicated = 0
    unexpected = 0
    for job_id, at in starts:
        if job_id not in expected:
            unexpected += 1
            continue
        seen = first.get(job_id)
        if seen is None:
            first[job_id] = at
        else:
            duplicated += 1
            first[job_id] = min(seen, at)
    lateness = [(at - t_due_s) * 1000.0 for at in first.values()]
    return StartAccount(
        lateness_ms=lateness,
        first_start_s=first,
        lost=len(expected) - len(first),
        duplicated=duplicated,
        unexpected=unexpected,
    )


def job_id_of_key(key: str) -> str:
    """The job id part of an Idempotency-Key ``<job id>:<occurrence>``."""
    return key.partition(":")[0]


def redis_entry_ms(entry_id: bytes | str) -> int:
    """The server's ms clock at XADD: the first half of an auto-generated stream entry id."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])


def writes_per_run(before: dict[str, int], after: dict[str, int], runs: int, seeded: int) -> dict[str, float]:
    """Row writes (inserts + updates in jobs and runs) and WAL per run between two reads of
    ``storage.bulk.table_writes``; the ``seeded`` job inserts are the registration, not the run."""
    ins = after["ins"] - before["ins"] - seeded
    upd = after["upd"] - before["upd"]
    hot = after["hot_upd"] - before["hot_upd"]
    n = max(runs, 1)
    return {
        "inserts_per_run": round(ins / n, 2),
        "updates_per_run": round(upd / n, 2),
        "row_writes_per_run": round((ins + upd) / n, 2),
        "hot_update_share": round(hot / upd, 3) if upd else 0.0,
        "wal_bytes_per_run": round((after["wal_bytes"] - before["wal_bytes"]) / n),
    }


def wheel_bytes_per_run(samples: Sequence[tuple[float, int, float, float, float]]) -> float | None:
    """RSS growth per run waiting in the wheel, from a node's samples
    (t, wheel entries, claims, completions, rss bytes): RSS at the wheel's peak minus RSS before
    the first claim, over the entries then waiting."""
    if not samples:
        return None
    base = next((s[4] for s in samples if s[2] == 0), samples[0][4])
    peak = max(samples, key=lambda s: s[1])
    if peak[1] <= 0:
        return None
    return (peak[4] - base) / peak[1]


# ---------------------------------------------------------------- node processes


@dataclass
class NodeSamples:
    pid: int
    shards: list[int]
    # (t, wheel entries, claims so far, completions so far, rss bytes), every 100 ms
    samples: list[tuple[float, int, float, float, float]]
    fire_lateness_ms: list[int]
    peak_rss_mb: float
    fence_statements: int
    fence_time_s: float
    # time in the cyclic garbage collector after start, per generation (gc.callbacks)
    gc_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    # about once a second: what holds the node's memory (``memory_sample``)
    memory: list[MemorySample] = field(default_factory=list)
    # at the end, after the last sample: what one full collection found (gc.DEBUG_SAVEALL: the
    # unreachable objects by type, most first) and the memory after it
    garbage_by_type: list[tuple[str, int]] = field(default_factory=list)
    after_collect: MemorySample | None = None


@dataclass
class MemorySample:
    """One look at where a node's memory is: the kernel's view (RSS, anonymous pages), the
    allocator's (glibc ``mallinfo2``: bytes its arenas took from the kernel, in use by live
    blocks, free but kept), Python's (tracemalloc, when ``DUETIME_BENCH_TRACEMALLOC=1``), and how
    many runs each in-memory stage of the node holds."""

    t: float
    rss: int
    anon: int | None
    arena: int | None  # mallinfo2: sbrk'd main arena + mmap'd arenas (bytes)
    in_use: int | None  # mallinfo2.uordblks: allocated blocks (bytes)
    free: int | None  # mallinfo2.fordblks: free blocks the allocator keeps (bytes)
    mmapped: int | None  # mallinfo2.hblkhd: large blocks mmap'd on their own (bytes)
    traced: int | None  # tracemalloc's live Python allocations (bytes), if tracing
    # pymalloc (Python's own allocator for objects of ≤ 512 B, in 1 MiB arenas of its own, not in
    # malloc's): arena bytes, bytes in live blocks; every fifth sample (None between)
    py_arenas: int | None
    py_in_use: int | None
    wheel: int
    fired: int  # fired, waiting for the fencer (claims, not fenced yet)
    queued: int  # fenced, waiting in the run queue
    inflight: int  # taken by workers, call in flight
    pending: int  # outcomes waiting for the completer
    held: int  # the lease keeper's held runs (fenced, not recorded)


_SAMPLE_WIDTH = 5  # time, wheel, claims, completions, RSS
_MEMORY_FIELDS = [f.name for f in dataclasses.fields(MemorySample)]
_MEMORY_WIDTH = len(_MEMORY_FIELDS)


def _memory_row(m: MemorySample) -> tuple[float, ...]:
    """A memory sample as doubles (exact: byte counts stay far below 2**53), None as NaN."""
    return tuple(math.nan if v is None else float(v) for v in (getattr(m, f) for f in _MEMORY_FIELDS))


def _memory_samples(rows: array.array[float]) -> list[MemorySample]:
    out = []
    for row in zip(*[iter(rows)] * _MEMORY_WIDTH, strict=True):
        values = {
            f: None if math.isnan(v) else v if f == "t" else int(v)
            for f, v in zip(_MEMORY_FIELDS, row, strict=True)
        }
        out.append(MemorySample(**values))  # type: ignore[arg-type]
    return out


def _rss_bytes() -> float:
    with open("/proc/self/statm") as f:
        return float(f.read().split()[1]) * _PAGE


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> Any:
    """glibc, when this process runs on it (``mallinfo2`` is glibc 2.33+); else None."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        return libc
    return None


def _anon_bytes() -> int | None:
    """Anonymous (heap, not file-backed) resident bytes, from /proc/self/smaps_rollup."""
    with contextlib.suppress(OSError), open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    return None


def pymalloc_stats() -> tuple[int, int] | None:
    """(bytes of pymalloc arenas, bytes in their allocated blocks), from
    ``sys._debugmallocstats``, which prints to the C stderr: caught through a temporary file."""
    import re
    import tempfile

    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    arenas = re.search(r"(\d+) arenas \* (\d+) bytes/arena", text)
    used = re.search(r"# bytes in allocated blocks\s+=\s+([\d,]+)", text)
    if arenas is None or used is None:
        return None
    return int(arenas[1]) * int(arenas[2]), int(used[1].replace(",", ""))


def memory_sample(node: Any, libc: Any, *, pymalloc: bool = False) -> MemorySample:
    """Where this node's memory is now (see ``MemorySample``); cheap enough for once a second."""
    import tracemalloc

    engine, pool = node._engine, node._pool
    info = libc.mallinfo2() if libc is not None else None
    py = pymalloc_stats() if pymalloc else None
    return MemorySample(
        t=time.time(),
        rss=int(_rss_bytes()),
        anon=_anon_bytes(),
        arena=info.arena + info.hblkhd if info is not None else None,
        in_use=info.uordblks if info is not None else None,
        free=info.fordblks if info is not None else None,
        mmapped=info.hblkhd if info is not None else None,
        traced=tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None,
        py_arenas=py[0] if py is not None else None,
        py_in_use=py[1] if py is not None else None,
        wheel=engine.waiting_runs if engine is not None else 0,
        fired=engine._fired_count if engine is not None else 0,
        queued=pool._queue.qsize() + pool.queues.waiting if pool is not None else 0,
        inflight=pool.queues.in_flight if pool is not None else 0,
        pending=pool.completer.pending() if pool is not None else 0,
        held=len(node._keeper) if node._keeper is not None else 0,
    )


def _dump_tasks(node: Any) -> None:
    """``kill -USR1 <node pid>``: what every task of this node is waiting on, grouped by stack,
    and the engine's queues, to ``loadtest/out/tasks-<pid>.txt``. py-spy shows only the frame
    that holds the GIL; a stalled asyncio process needs the suspended coroutines' stacks."""
    import collections
    import io

    groups: collections.Counter[str] = collections.Counter()
    for task in asyncio.all_tasks():
        lines: list[str] = []
        coro: Any = task.get_coro()
        while coro is not None and len(lines) < 16:  # the suspended chain, outermost first
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is not None:
                lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}\n")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        groups[f"{task.get_name().rstrip('0123456789')}\n{''.join(lines)}"] += 1
    out = io.StringIO()
    engine, pool = node._engine, node._pool
    if engine is not None:
        print(
            f"wheel={engine.waiting_runs} fired_unfenced={engine._fired_count} "
            f"lanes={sum(len(q) for q in engine._lanes.values())} fences={engine.fence_statements}",
            file=out,
        )
    if pool is not None:
        print(
            f"queue={pool._queue.qsize()} waiting={pool.queues.waiting} inflight={pool.queues.in_flight} "
            f"completer_pending={pool.completer.pending()} held={len(node._keeper)}",
            file=out,
        )
    for text, n in groups.most_common():
        print(f"--- {n} task(s): {text}", file=out)
    import tracemalloc

    if tracemalloc.is_tracing():  # DUETIME_BENCH_TRACEMALLOC=1: where the node's memory is
        snapshot = tracemalloc.take_snapshot()
        print(f"--- traced: {tracemalloc.get_traced_memory()[0] / 2**20:.1f} MB", file=out)
        for stat in snapshot.statistics("lineno")[:25]:
            print(f"  {stat}", file=out)
        for stat in snapshot.statistics("traceback")[:6]:
            print(f"--- {stat.size / 2**20:.1f} MB in {stat.count} blocks:", file=out)
            for line in stat.traceback.format()[-12:]:
                print(f"  {line}", file=out)
    if os.environ.get("DUETIME_BENCH_REFERRERS") == "1":
        _who_holds_runs(out)
    if os.environ.get("DUETIME_BENCH_ARENAS") == "1":  # which live blocks keep pymalloc's arenas
        from loadtest import arenas

        arenas.report(out, sparse_pools=31)
    OUT_DIR.mkdir(exist_ok=True)
    (OUT_DIR / f"tasks-{os.getpid()}.txt").write_text(out.getvalue())


def _who_holds_runs(out: Any) -> None:
    """With ``DUETIME_BENCH_REFERRERS=1``: how many fenced runs and reports are alive, and what
    refers to a sample of them, two levels up (the way the perf-mem work found the idle workers'
    frames): a run no stage counts is held by something the dump then names."""
    import collections

    from duetime.core.runpath import AttemptReport, FencedRun

    objs = gc.get_objects()
    runs = [o for o in objs if type(o) is FencedRun]
    reports = [o for o in objs if type(o) is AttemptReport]
    print(f"--- alive: {len(runs)} FencedRun, {len(reports)} AttemptReport", file=out)
    for name, n in collections.Counter(type(o).__qualname__ for o in objs).most_common(25):
        print(f"  {n:>9} {name}", file=out)
    del objs
    ignore = {id(runs), id(reports)}
    from loadtest.arenas import describe

    chains: collections.Counter[str] = collections.Counter()
    for sample in (runs[:: max(1, len(runs) // 20)] + reports[:: max(1, len(reports) // 20)])[:40]:
        for ref in gc.get_referrers(sample):
            if id(ref) in ignore:
                continue
            ups = [describe(r2) for r2 in gc.get_referrers(ref) if id(r2) not in ignore][:4]
            chains[f"{type(sample).__qualname__} <- {describe(ref)} <- {ups}"] += 1
    for text, n in chains.most_common(30):
        print(f"  {n}x {text}", file=out)


def _node_main(settings: Settings, started: Any, stop: Any, done: Any, out: Any) -> None:
    """One all-in-one node (engine + in-process workers) that samples itself every 100 ms."""
    from duetime.app import Node
    from duetime.runqueue import metrics

    def total(counter: Any) -> float:
        # Only this counter's samples: the registry-wide collect reads /proc and every histogram.
        return float(sum(x.value for m in counter.collect() for x in m.samples if x.name.endswith("_total")))

    gc_s = [0.0, 0.0, 0.0]
    gc_start = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_s[info["generation"]] += time.perf_counter() - gc_start[0]

    async def main() -> None:
        if os.environ.get("DUETIME_BENCH_ARENAS") == "1":
            from loadtest import arenas  # noqa: F401 - imported while idle, not into the burst's arenas
        if os.environ.get("DUETIME_BENCH_TRACEMALLOC") == "1":
            import tracemalloc

            tracemalloc.start(12)
        node = Node(settings, api=False)
        await node.start()
        assert node._engine is not None
        engine = node._engine
        late = array.array("q")
        engine.lateness_probe = late.extend

        # Samples go into flat arrays of doubles, not lists of tuples and dataclasses: a Python
        # object per sample, allocated every 100 ms all through the burst and kept to the end,
        # lands in the holes the fired runs leave in pymalloc's pools and keeps their arenas from
        # being returned, i.e. the measurement itself held memory it then reported as the node's.
        samples = array.array("d")  # _SAMPLE_WIDTH doubles a sample
        memory = array.array("d")  # _MEMORY_WIDTH doubles a sample, None as NaN
        libc = _libc()
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _dump_tasks, node)
        gc.callbacks.append(on_gc)
        started.set()
        tick = 0
        while not stop.is_set():
            completions = total(metrics.COMPLETIONS)
            samples.extend(
                (time.time(), engine.waiting_runs, total(metrics.CLAIMS), completions, _rss_bytes())
            )
            if tick % 10 == 0:
                memory.extend(_memory_row(memory_sample(node, libc, pymalloc=tick % 50 == 0)))
            tick += 1
            done.value = int(completions)
            await asyncio.sleep(0.1)
        statements, spent = engine.fence_statements, engine.fence_time_s
        # What a full collection would free now: cyclic garbage the thresholds left in place.
        import collections

        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        gc.set_debug(0)
        kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
        gc.garbage.clear()
        gc.collect()
        after_collect = memory_sample(node, libc, pymalloc=True)
        _dump_tasks(node)  # with DUETIME_BENCH_TRACEMALLOC=1: what is still allocated, and where
        await node.stop()
        out.send(
            NodeSamples(
                pid=os.getpid(),
                shards=sorted(settings.shards),
                samples=[
                    (t, int(wheel), claims, done, rss)
                    for t, wheel, claims, done, rss in zip(*[iter(samples)] * _SAMPLE_WIDTH, strict=True)
                ],
                fire_lateness_ms=late.tolist(),
                peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                fence_statements=statements,
                fence_time_s=spent,
                gc_s=[round(x, 2) for x in gc_s],
                memory=_memory_samples(memory),
                garbage_by_type=kinds.most_common(20),
                after_collect=after_collect,
            )
        )
        out.close()

    uvloop.run(main())


class BurstNodes:
    """P all-in-one nodes in child processes, each owning a share of the shards."""

    def __init__(self, settings: Settings, processes: int) -> None:
        ctx = mp.get_context("spawn")
        self._stop = ctx.Event()
        self._procs: list[tuple[Any, Any, Any, Any]] = []
        for i, group in enumerate(split_shards(settings.shards, processes)):
            child = dataclasses.replace(settings, shards=group, engine_id=f"burst-{i}", http_port=0)
            started = ctx.Event()
            done = ctx.Value("q", 0, lock=False)
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_node_main, args=(child, started, self._stop, done, send), name=f"burst-node-{i}"
            )
            self._procs.append((proc, started, done, recv))

    def start(self) -> None:
        for proc, _, _, _ in self._procs:
            proc.start()
        for proc, started, _, _ in self._procs:
            if not started.wait(60):
                raise RuntimeError(f"burst node {proc.pid} did not start")

    def pids(self) -> list[int]:
        return [p.pid for p, _, _, _ in self._procs]

    def named_pids(self) -> dict[str, int]:
        return {f"node-{i}": pid for i, pid in enumerate(self.pids())}

    def completions(self) -> int:
        return sum(int(d.value) for _, _, d, _ in self._procs)

    async def completed(self) -> int:
        return self.completions()

    async def finish(self) -> list[NodeSamples]:
        return await asyncio.to_thread(self.stop)

    async def close(self) -> None:
        if self.alive():
            await asyncio.to_thread(self.stop)

    @staticmethod
    def series(reports: Sequence[NodeSamples]) -> list[list[tuple[float, float, float]]]:
        """(t, claims so far, completions so far) per node, every 100 ms."""
        return [[(s[0], s[2], s[3]) for s in r.samples] for r in reports]

    def alive(self) -> bool:
        return all(p.is_alive() for p, _, _, _ in self._procs)

    def stop(self) -> list[NodeSamples]:
        self._stop.set()
        reports: list[NodeSamples] = []
        for proc, _, _, recv in self._procs:
            if recv.poll(180):
                reports.append(recv.recv())
            recv.close()
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        return reports


class BurstCluster:
    """``--topology cluster``: ``engines`` ``duetime engine`` and ``workers`` ``duetime worker``
    processes over the NATS run queue, with a run-queue subject prefix unique to this run.

    Nothing of the benchmark runs inside them, so what it reports is read from outside, every
    half second: completions as the history rows in the database (``runs``: one per attempt
    recorded, and every burst job has exactly one attempt), claims as the engines'
    ``duetime_claims_total`` on /metrics, RSS with psutil."""

    SAMPLE_S = 0.5

    def __init__(
        self,
        settings: Settings,
        env: dict[str, str],
        dsn: str,
        *,
        engines: int,
        workers: int,
        rss: _RssWatch,
        split: bool = False,
        retries: bool = False,
    ) -> None:
        self.prefix = f"duetime.burst-runs.{secrets.token_hex(4)}"
        self.logdir = Path(tempfile.mkdtemp(prefix="duetime-burst-cluster-"))
        self.fleet = EnginesAndWorkers(
            env,
            settings.shards,
            engines=engines,
            workers=workers,
            nats_url=settings.nats_url or NATS_URL,
            prefix=self.prefix,
            logdir=self.logdir,
            name="burst",
            split=split,
        )
        self.samples: list[tuple[float, float, float]] = []
        # One attempt per job, so one history row per finished job -- unless runs are retried (a
        # failover measurement): then a job is done once it succeeded, whatever came before.
        self._done_sql = (
            "SELECT count(*) FROM runs"
            if not retries
            else "SELECT count(DISTINCT job_id) FROM runs WHERE outcome = 'succeeded'"
        )
        self._dsn = dsn
        self._rss = rss
        self._task: asyncio.Task[None] | None = None
        self._finished = False

    async def start(self) -> None:
        try:
            await self.fleet.start()
        except BaseException:
            await self.close()
            raise
        self._task = asyncio.create_task(self._monitor(), name="burst-cluster-monitor")

    async def _monitor(self) -> None:
        import aiohttp
        import asyncpg

        conn = await asyncpg.connect(self._dsn)
        try:
            async with aiohttp.ClientSession() as http:
                while True:
                    at = time.time()
                    done = await conn.fetchval(self._done_sql)
                    try:
                        claims = await self.fleet.claims(http)
                    except aiohttp.ClientError:  # an engine died: alive() says so to _measure
                        claims = self.samples[-1][1] if self.samples else 0.0
                    self.samples.append((at, claims, float(done)))
                    self._rss.sample(self.named_pids())
                    await asyncio.sleep(self.SAMPLE_S)
        finally:
            await conn.close()

    def named_pids(self) -> dict[str, int]:
        return self.fleet.named_pids()

    async def kill_engine(self, index: int) -> tuple[float, frozenset[int]]:
        """SIGKILL engine ``index``; returns the kill instant (epoch s) and the shards it served
        by the membership, read just before."""
        import asyncpg

        engine = self.fleet.engines[index]
        conn = await asyncpg.connect(self._dsn)
        try:
            serving = await conn.fetchval(
                "SELECT serving FROM engines WHERE engine_id = $1", engine.env["DUETIME_ENGINE_ID"]
            )
        finally:
            await conn.close()
        self.fleet.kill(engine.name)
        return time.time(), frozenset(serving or ())

    async def completed(self) -> int:
        return int(self.samples[-1][2]) if self.samples else 0

    def alive(self) -> bool:
        return self.fleet.alive() and (self._task is None or not self._task.done())

    def series(self, _reports: Sequence[NodeSamples]) -> list[list[tuple[float, float, float]]]:
        return [list(self.samples)]

    async def finish(self) -> list[NodeSamples]:
        """Stop sampling, stop every process (SIGTERM, SIGKILL after a grace), delete the
        stream. No in-process reports: an empty list."""
        await self.close()
        return []

    async def close(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        codes = await self.fleet.stop(grace_s=30.0)
        bad = {name: code for name, code in codes.items() if code != 0}
        if bad:
            print(f"  cluster processes did not stop cleanly: {bad}; logs in {self.logdir}", file=sys.stderr)
        else:
            shutil.rmtree(self.logdir, ignore_errors=True)


Fleet = BurstNodes | BurstCluster


# ---------------------------------------------------------------- targets


class BurstTarget:
    """Where runs land and how their start instants are read back."""

    name = "?"

    async def setup(self) -> list[Target]:
        """The targets the jobs are spread over (one each but for a webhook with ``--hosts``)."""
        raise NotImplementedError

    async def starts(self) -> list[tuple[str, float]]:
        """(job id, start instant, epoch seconds) per delivery, duplicates included."""
        raise NotImplementedError

    async def count(self) -> int | None:
        """Deliveries so far, when the target can say cheaply (else None)."""
        return None

    async def teardown(self) -> None:
        return None

    def pids(self) -> list[int]:
        return []


class WebhookBurstTarget(BurstTarget):
    """One receiver process listening on ``hosts`` loopback ports, each a distinct host to the
    workers' per-host limits, answering ``delay_s`` after a call arrives."""

    name = "webhook"

    def __init__(self, hosts: int = 1, delay_s: float = 0.0) -> None:
        self.receiver = ReceiverProcess(hosts=hosts, delay_s=delay_s)

    async def setup(self) -> list[Target]:
        await asyncio.to_thread(self.receiver.start)
        return [WebhookTarget(url=url + "/hook", timeout_s=30) for url in self.receiver.urls]

    async def starts(self) -> list[tuple[str, float]]:
        return [(job_id_of_key(k), ns / 1e9) for k, _a, _t, ns in await self.receiver.dump()]

    async def teardown(self) -> None:
        self.receiver.stop()

    def pids(self) -> list[int]:
        proc = getattr(self.receiver, "_proc", None)
        return [proc.pid] if proc is not None and proc.pid else []


class RedisBurstTarget(BurstTarget):
    name = "redis"

    def __init__(self) -> None:
        import redis.asyncio as aioredis

        self.key = f"duetime-burst-{secrets.token_hex(4)}"
        # Reading back a million entries is slow for Redis too: a generous per-read timeout.
        self._r = aioredis.Redis.from_url(REDIS_URL, socket_timeout=300)

    async def setup(self) -> list[Target]:
        await self._r.delete(self.key)
        return [QueueTarget(broker=Broker.REDIS, topic=self.key)]

    async def count(self) -> int | None:
        n: int = await self._r.xlen(self.key)
        return n

    async def starts(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        start = "-"
        while True:
            batch: list[tuple[bytes, dict[bytes, bytes]]] = await self._r.xrange(
                self.key, min=start, count=5_000
            )  # type: ignore[assignment]
            if not batch:
                return out
            for entry_id, fields in batch:
                key = fields[b"idempotency_key"].decode()
                out.append((job_id_of_key(key), redis_entry_ms(entry_id) / 1000.0))
            start = "(" + batch[-1][0].decode()

    async def teardown(self) -> None:
        await self._r.delete(self.key)
        await self._r.aclose()


class NatsBurstTarget(BurstTarget):
    name = "nats"

    def __init__(self) -> None:
        tag = secrets.token_hex(4)
        self.stream = f"DUETIME_BURST_{tag}"
        self.subject = f"duetime.burst.{tag}"
        self._nc: Any = None

    async def setup(self) -> list[Target]:
        import nats

        self._nc = await nats.connect(NATS_URL)
        js = self._nc.jetstream()
        await js.add_stream(name=self.stream, subjects=[self.subject])
        return [QueueTarget(broker=Broker.NATS, topic=self.subject)]

    async def count(self) -> int | None:
        info = await self._nc.jetstream().stream_info(self.stream)
        n: int = info.state.messages
        return n

    async def starts(self) -> list[tuple[str, float]]:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        js = self._nc.jetstream()
        sub = await js.pull_subscribe(
            self.subject,
            stream=self.stream,
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
        )
        total = (await js.stream_info(self.stream)).state.messages
        out: list[tuple[str, float]] = []
        try:
            while len(out) < total:
                try:
                    msgs = await sub.fetch(5000, timeout=5)
                except TimeoutError:
                    break
                for m in msgs:
                    key = (m.headers or {}).get("Idempotency-Key", "")
                    out.append((job_id_of_key(key), m.metadata.timestamp.timestamp()))
        finally:
            await sub.unsubscribe()
        return out

    async def teardown(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.jetstream().delete_stream(self.stream)
            await self._nc.close()


def make_target(name: str, *, hosts: int = 1, delay_ms: float = 0.0) -> BurstTarget:
    if name == "webhook":
        return WebhookBurstTarget(hosts, delay_ms / 1000.0)
    if name == "redis":
        return RedisBurstTarget()
    if name == "nats":
        return NatsBurstTarget()
    raise ValueError(f"unknown target {name!r}")


# ---------------------------------------------------------------- registration


def burst_spec(target: Target, due: datetime, attempts: int = 1) -> JobSpec:
    # One attempt: a failed start is a lost run in this benchmark, not a retry a minute later. A
    # failover measurement allows retries: the killed engine's runs come back as lease_expired.
    return JobSpec(target=target, schedule=OneOffSchedule(due), retry=RetryPolicy(max_attempts=attempts))


def burst_owners(n: int, owners: int) -> Iterator[str]:
    """The owner of each of ``n`` jobs: ``bench`` alone, or ``owners`` owners taking turns (a
    midnight spread over many tenants: each has its own fairness lane, and its runs share claim
    batches with the others')."""
    if owners <= 1:
        return itertools.repeat("bench", n)
    return (f"bench-{i % owners}" for i in range(n))


async def seed_bulk(settings: Settings, specs: Sequence[JobSpec], n: int, owners: int = 1) -> list[str]:
    """``n`` jobs, the ``specs`` taking turns (one per target host), owners as ``burst_owners``."""
    now = datetime.now(UTC)
    dsns = settings.shard_dsns()
    last = [0.0]

    def progress(done: int) -> None:
        if time.monotonic() - last[0] > 5:
            last[0] = time.monotonic()
            print(f"  seeded {done}/{n}", file=sys.stderr, flush=True)

    jobs = (BulkJob(owner, specs[i % len(specs)]) for i, owner in enumerate(burst_owners(n, owners)))
    ids = await seed_jobs(dsns, jobs, now, progress=progress)
    await analyze_jobs(dsns)
    return [str(i) for i in ids]


@contextlib.asynccontextmanager
async def api_process(settings_env: dict[str, str]) -> AsyncIterator[str]:
    """A real ``duetime api`` process; yields its base URL."""
    port = free_port()
    env = {**os.environ, **settings_env, "DUETIME_HTTP_PORT": str(port), "DUETIME_LOG_LEVEL": "WARNING"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "duetime", "api", env=env, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
        if b"serving" not in line:
            raise RuntimeError(f"duetime api did not start: {line!r}")
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        if proc.stdout is not None:
            proc.stdout.feed_eof()


async def seed_api(url: str, api_key: str, specs: Sequence[JobSpec], n: int, clients: int) -> list[str]:
    """``n`` jobs through the API from ``clients`` concurrent clients, the ``specs`` taking turns."""
    import aiohttp

    bodies = [json.dumps(codec.spec_to_json(spec)).encode() for spec in specs]
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    ids: list[str] = []
    next_i = [0]

    async def client(http: aiohttp.ClientSession) -> None:
        while next_i[0] < n:
            body = bodies[next_i[0] % len(bodies)]
            next_i[0] += 1
            async with http.post(url + "/v1/jobs", data=body, headers=headers) as resp:
                data = await resp.json()
                if resp.status != 201:
                    raise RuntimeError(f"create answered {resp.status}: {data}")
                ids.append(data["id"])

    conn = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=conn) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return ids


# ---------------------------------------------------------------- the benchmark


@dataclass
class BurstArgs:
    jobs: int
    target: str
    topology: str
    seed_mode: str
    processes: int
    workers: int = 2
    lead_s: float | None = None
    clients: int = 64
    timeout_s: float | None = None
    settings_env: dict[str, str] = field(default_factory=dict)
    plot: bool = True
    label: str = ""
    split_shards: bool = False
    kill_engine_at_s: float | None = None
    old_finished_jobs: int = 0
    old_runs_per_job: int = 10
    old_cron_runs: int = 0
    old_age_s: float = 40 * 86_400.0
    # --stages: "off"; "cpu" (CPU seconds from /proc only); "native" or "python" (and py-spy's
    # stage split, with or without native frames: loadtest/stages.py)
    stages: str = "off"
    stages_rate: int = 100
    # --pg-statements: per statement and per index, from the benchmark server (loadtest/pgstats.py)
    pg_statements: bool = False
    # all-in-one: keep the nodes (and their memory samples) running this long after the last
    # outcome, for the RSS the drain leaves behind
    after_drain_s: float = 60.0
    # bulk, queue targets: the jobs' owners take turns among this many (burst_owners)
    owners: int = 1
    # webhook: the receiver's ports (each a host to the workers), the jobs taking turns; and how
    # long it takes to answer
    hosts: int = 1
    target_delay_ms: float = 0.0


def default_lead(a: BurstArgs, lookahead_s: float) -> float:
    """Registration must end before claiming starts (T − lookahead) for "claims before T" to mean
    what it says: a generous estimate of the registration time, plus the lookahead, plus 10 s."""
    rate = 40_000.0 if a.seed_mode == "bulk" else 700.0
    return round(a.jobs / rate + lookahead_s + 10.0)


class _RssWatch:
    """Peak RSS of processes this benchmark did not write a reporter into (receiver, API)."""

    def __init__(self) -> None:
        self.peak: dict[str, float] = {}

    def sample(self, named_pids: dict[str, int]) -> None:
        import psutil  # type: ignore[import-untyped]

        for name, pid in named_pids.items():
            with contextlib.suppress(psutil.Error):
                rss = psutil.Process(pid).memory_info().rss
                self.peak[name] = max(self.peak.get(name, 0.0), rss / 2**20)


async def run_burst(a: BurstArgs) -> dict[str, Any]:
    if a.topology not in ("all-in-one", "cluster"):
        raise ValueError(f"unknown topology {a.topology!r}")
    load_start = os.getloadavg()[0]
    target = make_target(a.target, hosts=a.hosts, delay_ms=a.target_delay_ms)
    spec_targets = await target.setup()
    rss = _RssWatch()
    try:
        async with scratch_database("duetime_burst") as dsn:
            env = {
                "DUETIME_DATABASE_URL": dsn,
                "DUETIME_HTTP_PORT": "0",
                # A benchmark seeds one owner with up to millions of jobs: the owner caps are off.
                "DUETIME_API_OWNER_RATE": "0",
                "DUETIME_MAX_JOBS_PER_OWNER": "0",
                "DUETIME_MAX_JOB_BYTES_PER_OWNER": "0",
                "DUETIME_WEBHOOK_ALLOW_PRIVATE": "1",
                "DUETIME_REDIS_URL": REDIS_URL,
                "DUETIME_NATS_URL": NATS_URL,
                "DUETIME_LOG_LEVEL": "WARNING",
                **a.settings_env,
            }
            settings = Settings.from_env(env)
            lead = a.lead_s if a.lead_s is not None else default_lead(a, settings.lookahead_s)
            store = await PostgresStore.open(ShardMap.single(dsn), pool_size=4)
            api_key, _secret = await store.create_api_key("bench")
            await store.close()
            old = await seed_old(a, dsn, spec_targets[0])
            fleet: Fleet
            if a.topology == "cluster":
                fleet = BurstCluster(
                    settings,
                    env,
                    dsn,
                    engines=a.processes,
                    workers=a.workers,
                    rss=rss,
                    split=a.split_shards,
                    retries=a.kill_engine_at_s is not None,
                )
                await fleet.start()
            else:
                fleet = BurstNodes(settings, a.processes)
                await asyncio.to_thread(fleet.start)
            try:
                result = await _measure(
                    a,
                    settings=settings,
                    env=env,
                    dsn=dsn,
                    fleet=fleet,
                    target=target,
                    spec_targets=spec_targets,
                    lead=lead,
                    api_key=api_key,
                    rss=rss,
                    old=old,
                )
            finally:
                await fleet.close()
    finally:
        await target.teardown()
    if isinstance(fleet, BurstCluster):
        result["run_queue_prefix"] = fleet.prefix  # its stream is deleted by now
    result["load_1m"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    return result


async def _measure(
    a: BurstArgs,
    *,
    settings: Settings,
    env: dict[str, str],
    dsn: str,
    fleet: Fleet,
    target: BurstTarget,
    spec_targets: Sequence[Target],
    lead: float,
    api_key: str,
    rss: _RssWatch,
    old: OldHistory | None = None,
) -> dict[str, Any]:
    t_due = (datetime.now(UTC) + timedelta(seconds=lead)).replace(microsecond=0)
    t_due_s = t_due.timestamp()
    attempts = 1 if a.kill_engine_at_s is None else 5
    specs = [burst_spec(t, t_due, attempts=attempts) for t in spec_targets]
    writes_before = await table_writes([dsn])
    reg_started = time.time()
    if a.seed_mode == "bulk":
        ids = await seed_bulk(settings, specs, a.jobs, a.owners)
    else:
        async with api_process({k: v for k, v in env.items() if k != "DUETIME_HTTP_PORT"}) as url:
            ids = await seed_api(url, api_key, specs, a.jobs, a.clients)
    reg_done = time.time()
    reg_s = reg_done - reg_started
    ahead_s = t_due_s - reg_done
    print(
        f"  registered {a.jobs} in {reg_s:.1f} s ({a.jobs / reg_s:.0f}/s, {a.seed_mode}); "
        f"T is {ahead_s:.1f} s ahead",
        file=sys.stderr,
        flush=True,
    )
    if ahead_s <= 0:
        raise SystemExit(f"registration ended {-ahead_s:.1f} s after T; raise --lead")
    indexes_before = None
    if a.pg_statements:
        indexes_before = await pgstats.index_state(dsn)
        if not await pgstats.reset_statements(ADMIN_DSN):
            print("  --pg-statements: the server does not load pg_stat_statements", file=sys.stderr)

    timeout = a.timeout_s if a.timeout_s is not None else max(120.0, a.jobs / 2000.0)
    deadline = t_due_s + timeout
    named = fleet.named_pids()
    window: StageWindow | None = None
    if a.stages != "off":
        # From here to the last recorded outcome: the claims (T - lookahead) are inside.
        window = StageWindow(
            list(named.values()),
            admin_dsn=ADMIN_DSN,
            database=dsn.rpartition("/")[2],
            rate=a.stages_rate,
            native=a.stages == "native",
            profile=a.stages in ("native", "python"),
            roles={pid: name.rpartition("-")[0] for name, pid in named.items()},
        )
        await window.start()
    marked = False
    # the window proper starts just before the claims do (T - lookahead); until then, idle
    begin_at = t_due_s - settings.lookahead_s - 1.0
    begun = window is None
    named |= {f"{target.name}-receiver": pid for pid in target.pids()}
    last_print = 0.0
    killed: tuple[float, frozenset[int]] | None = None
    probe = None if old is None else await asyncpg.connect(dsn)
    left: list[tuple[float, HistoryLeft]] = []
    last_probe = 0.0
    try:
        while time.time() < deadline:
            if probe is not None and old is not None and time.time() - last_probe >= 1.0:
                last_probe = time.time()
                left.append((last_probe, await old_history_left(probe, old)))
            if not begun and window is not None and time.time() >= begin_at:
                begun = True
                await window.begin()
            if window is not None and not marked and time.time() >= t_due_s:
                marked = True
                await window.mark()
            if (
                a.kill_engine_at_s is not None
                and killed is None
                and isinstance(fleet, BurstCluster)
                and time.time() >= t_due_s + a.kill_engine_at_s
            ):
                killed = await fleet.kill_engine(0)
                print(
                    f"  T{killed[0] - t_due_s:+.1f} s: SIGKILL engine-0 (shards {sorted(killed[1])})",
                    file=sys.stderr,
                    flush=True,
                )
            rss.sample(named)
            done = await fleet.completed()
            if done >= a.jobs:
                break
            if not fleet.alive():
                raise RuntimeError("a burst process died; see its log above")
            if time.time() - last_print > 10:
                last_print = time.time()
                print(f"  T{time.time() - t_due_s:+.0f} s: {done} completed", file=sys.stderr, flush=True)
            await asyncio.sleep(0.25)
    except BaseException:
        if window is not None:
            await window.abort()
        if probe is not None:
            await probe.close()
        raise
    cpu = await window.stop(a.jobs) if window is not None else None
    drained_at = time.time()
    reports: list[NodeSamples] | None = None
    if isinstance(fleet, BurstCluster):
        # Stopped first: a backend that went idle less than a second after its last report keeps
        # its table statistics until a timeout, and a short burst's worker backends undercounted
        # by half; a backend reports them when its process disconnects.
        reports = await fleet.finish()
    if probe is not None and old is not None:
        left.append((time.time(), await old_history_left(probe, old)))
        await probe.close()
    await asyncio.sleep(1.5)  # backends flush their table statistics once idle, at most once a second
    writes_after = await table_writes([dsn])
    outcomes = await outcome_counts([dsn])
    starts = await target.starts()
    if reports is None:
        settle = drained_at + a.after_drain_s - time.time()
        if settle > 0:
            print(f"  drained; sampling memory for {settle:.0f} s more", file=sys.stderr, flush=True)
            await asyncio.sleep(settle)
        reports = await fleet.finish()
    result = summarise(
        a,
        t_due_s=t_due_s,
        reg_s=reg_s,
        ahead_s=ahead_s,
        ids=ids,
        starts=starts,
        reports=reports,
        series=fleet.series(reports),
        sample_s=BurstCluster.SAMPLE_S if isinstance(fleet, BurstCluster) else 0.1,
        writes_before=writes_before,
        writes_after=writes_after,
        rss=rss,
        outcomes=outcomes,
    )
    if reports:
        result["memory"] = memory_figures(reports, t_due_s=t_due_s, drained_at=drained_at)
        if a.plot:
            result["memory_plot"] = str(
                write_memory_plot(
                    OUT_DIR / f"{Path(result['plot']).stem}-rss.png",
                    title=f"{a.jobs} runs due at T, {a.target}, {a.topology}, P={a.processes}: node memory",
                    t_due_s=t_due_s,
                    drained_s=drained_at - t_due_s,
                    nodes=[r.memory for r in reports],
                )
            )
    if killed is not None:
        result["failover"] = failover(ids, starts, t_due_s, killed[0], killed[1])
    if old is not None:
        result["old_history"] = old_history_during(old, left, t_due_s, result["drain_s"])
    if cpu is not None:
        result["cpu"] = cpu
    if indexes_before is not None:
        result["pg_statements"] = {
            "statements": await pgstats.statements(ADMIN_DSN, dsn.rpartition("/")[2], a.jobs),
            "indexes": pgstats.index_growth(indexes_before, await pgstats.index_state(dsn), a.jobs),
        }
    return result


def memory_figures(
    reports: Sequence[NodeSamples], *, t_due_s: float, drained_at: float
) -> list[dict[str, Any]]:
    """Per node: RSS idle (the last sample before the first claim), at its peak, and at the last
    sample (``--after-drain`` seconds after the last outcome); and at the peak, what the allocator,
    tracemalloc and each in-memory stage held."""
    mb = 2**20
    out: list[dict[str, Any]] = []
    for r in reports:
        if not r.memory:
            continue
        first_claim = next((s[0] for s in r.samples if s[2] > 0), t_due_s)
        idle = [m for m in r.memory if m.t < first_claim] or r.memory[:1]
        peak = max(r.memory, key=lambda m: m.rss)
        last = r.memory[-1]
        most = max(r.memory, key=lambda m: m.held)
        with_py = [m for m in r.memory if m.py_arenas is not None]
        py_peak = max(with_py, key=lambda m: m.rss) if with_py else None

        def view(m: MemorySample) -> dict[str, Any]:
            return {
                "s_after_T": round(m.t - t_due_s, 1),
                "rss_mb": round(m.rss / mb, 1),
                "anon_mb": round(m.anon / mb, 1) if m.anon is not None else None,
                "malloc_arena_mb": round(m.arena / mb, 1) if m.arena is not None else None,
                "malloc_in_use_mb": round(m.in_use / mb, 1) if m.in_use is not None else None,
                "malloc_free_kept_mb": round(m.free / mb, 1) if m.free is not None else None,
                "malloc_mmapped_mb": round(m.mmapped / mb, 1) if m.mmapped is not None else None,
                "traced_mb": round(m.traced / mb, 1) if m.traced is not None else None,
                "pymalloc_arenas_mb": round(m.py_arenas / mb, 1) if m.py_arenas is not None else None,
                "pymalloc_in_use_mb": round(m.py_in_use / mb, 1) if m.py_in_use is not None else None,
                "wheel": m.wheel,
                "fired_unfenced": m.fired,
                "run_queue": m.queued,
                "in_flight": m.inflight,
                "completer_pending": m.pending,
                "held": m.held,
            }

        out.append(
            {
                "pid": r.pid,
                "idle_rss_mb": round(idle[-1].rss / mb, 1),
                "peak_rss_mb": round(peak.rss / mb, 1),
                "after_drain_rss_mb": round(last.rss / mb, 1),
                "after_drain_s": round(last.t - drained_at, 1),
                "after_drain_over_idle": round(last.rss / idle[-1].rss, 2),
                "at_peak": view(peak),
                "at_most_held": view(most),
                "at_peak_pymalloc_sample": view(py_peak) if py_peak is not None else None,
                "after_drain_pymalloc_sample": view(with_py[-1]) if with_py else None,
                "after_drain": view(last),
                "after_full_collection": view(r.after_collect) if r.after_collect is not None else None,
                "garbage_by_type": dict(r.garbage_by_type),
            }
        )
    return out


async def seed_old(a: BurstArgs, dsn: str, target: Target) -> OldHistory | None:
    """``--old-finished-jobs`` and ``--old-cron-runs``: history finished ``--old-age-s`` ago, for
    the maintenance service of the nodes to delete while the burst runs (with the default
    retention of 30 days and the default age of 40 days, all of it is due for deletion). Written
    before the nodes start, so their first retention round begins on it at once."""
    if not (a.old_finished_jobs or a.old_cron_runs):
        return None
    before = datetime.now(UTC) - timedelta(seconds=a.old_age_s)
    started = time.perf_counter()
    old = await seed_old_history(
        dsn,
        JobSpec(target=target, schedule=OneOffSchedule(before)),
        owner="old",
        finished_jobs=a.old_finished_jobs,
        runs_per_job=a.old_runs_per_job,
        cron_runs=a.old_cron_runs,
        finished_before=before,
    )
    print(
        f"  old history: {old.finished_jobs} finished jobs, {old.runs} history rows "
        f"in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return old


def old_history_during(
    old: OldHistory, left: Sequence[tuple[float, HistoryLeft]], t_due_s: float, drain_s: float
) -> dict[str, Any]:
    """What the maintenance service deleted of the old history between T and the last start (from
    the samples nearest each), and what was left at the end: whether retention was at work during
    the whole burst, and how fast."""

    def nearest(at: float) -> tuple[float, HistoryLeft]:
        return min(left, key=lambda s: abs(s[0] - at))

    t0, at_t = nearest(t_due_s)
    t1, at_drain = nearest(t_due_s + drain_s)
    span = t1 - t0
    deleted = at_t.runs - at_drain.runs
    return {
        "seeded": {"finished_jobs": old.finished_jobs, "history_rows": old.runs},
        "left_at_T": {"history_rows": at_t.runs, "finished_jobs": at_t.finished_jobs},
        "left_at_last_start": {"history_rows": at_drain.runs, "finished_jobs": at_drain.finished_jobs},
        "left_at_end": {"history_rows": left[-1][1].runs, "finished_jobs": left[-1][1].finished_jobs},
        "history_rows_deleted_T_to_last_start": deleted,
        "finished_jobs_deleted_T_to_last_start": at_t.finished_jobs - at_drain.finished_jobs,
        "deleted_rows_per_s": round(deleted / span) if span > 0 else None,
        "samples_s_after_T": [round(t0 - t_due_s, 1), round(t1 - t_due_s, 1)],
        # (s after T, history rows left, finished jobs left), about one a second
        "series": [[round(t - t_due_s, 1), h.runs, h.finished_jobs] for t, h in left],
    }


def failover(
    ids: Sequence[str],
    starts: Sequence[tuple[str, float]],
    t_due_s: float,
    killed_at: float,
    shards: frozenset[int],
) -> dict[str, Any]:
    """What the death of an engine cost on the shards it served: per shard, the time from the kill
    to the first start of one of its runs; and the lateness (start − T) of the runs of those
    shards that started after the kill, which were waiting there when it died."""
    acc = account_starts(set(ids), starts, t_due_s)
    first_after: dict[int, float] = {}
    waiting_late: list[float] = []
    for job, at in acc.first_start_s.items():
        shard = shard_of(uuid.UUID(job))
        if shard not in shards or at < killed_at:
            continue
        first_after[shard] = min(first_after.get(shard, at), at)
        waiting_late.append((at - t_due_s) * 1000.0)
    to_first = {str(s): round(at - killed_at, 2) for s, at in sorted(first_after.items())}
    return {
        "killed_at_s_after_T": round(killed_at - t_due_s, 2),
        "shards": sorted(shards),
        "kill_to_first_start_s": to_first,
        "kill_to_first_start_max_s": max(to_first.values()) if to_first else None,
        "runs_waiting_on_its_shards": len(waiting_late),
        "their_lateness_ms": {k: round(v, 1) for k, v in quantiles(waiting_late).items()}
        if waiting_late
        else None,
    }


def summarise(
    a: BurstArgs,
    *,
    t_due_s: float,
    reg_s: float,
    ahead_s: float,
    ids: Sequence[str],
    starts: Sequence[tuple[str, float]],
    reports: Sequence[NodeSamples],
    series: Sequence[Sequence[tuple[float, float, float]]],
    sample_s: float,
    writes_before: dict[str, int],
    writes_after: dict[str, int],
    rss: _RssWatch,
    outcomes: dict[str, tuple[int, str | None]],
) -> dict[str, Any]:
    acc = account_starts(set(ids), starts, t_due_s)
    late_q = quantiles(acc.lateness_ms)
    starts_ps = per_second(list(acc.first_start_s.values()), t_due_s)
    claims_ps: dict[int, float] = {}
    completions_ps: dict[int, float] = {}
    claim_times: list[float] = []
    # one series per source: (t, claims so far, completions so far)
    for samples in series:
        for k, v in cumulative_to_rate([(s[0], s[1]) for s in samples], t_due_s).items():
            claims_ps[k] = claims_ps.get(k, 0.0) + v
        for k, v in cumulative_to_rate([(s[0], s[2]) for s in samples], t_due_s).items():
            completions_ps[k] = completions_ps.get(k, 0.0) + v
        prev = 0.0
        for s in samples:
            if s[1] > prev and s[0] < t_due_s:
                claim_times.append(s[0])
            prev = s[1]
    claimed_before = sum(v for k, v in claims_ps.items() if k < 0)
    # each sample counts the claims of the sample_s before it
    claim_span = (max(claim_times) - min(claim_times) + sample_s) if claim_times else 0.0
    completed = sum(completions_ps.values())
    comp_keys = [k for k, v in completions_ps.items() if v > 0 and k >= 0]
    comp_span = (max(comp_keys) + 1) if comp_keys else 0
    drain_s = max(acc.first_start_s.values()) - t_due_s if acc.first_start_s else float("nan")
    writes = writes_per_run(writes_before, writes_after, a.jobs, a.jobs)
    in_process = a.topology == "all-in-one"  # only in-process nodes report the next figures
    wheel_bytes = [wheel_bytes_per_run(r.samples) for r in reports]
    fire_q = quantiles([float(x) for r in reports for x in r.fire_lateness_ms])
    seed_desc = (
        f"API, {a.clients} concurrent clients, one duetime api process"
        if a.seed_mode == "api"
        else "bulk COPY straight into storage (not through the API)"
    )
    # all-in-one: each node's own ru_maxrss; cluster: psutil samples, every SAMPLE_S
    peak_rss = {f"node-{i}": round(r.peak_rss_mb, 1) for i, r in enumerate(reports)}
    peak_rss |= {k: round(v, 1) for k, v in rss.peak.items() if not k.startswith("node-")}
    peak_rss["benchmark"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    result: dict[str, Any] = {
        "label": a.label,
        "jobs": a.jobs,
        "target": a.target,
        "topology": a.topology,
        "processes": a.processes,
        "workers": a.workers if a.topology == "cluster" else None,
        "seed_mode": a.seed_mode,
        "owners": a.owners,
        "hosts": a.hosts,
        "target_delay_ms": a.target_delay_ms,
        "seeding": seed_desc,
        "settings": a.settings_env,
        "registration_per_s": round(a.jobs / reg_s),
        "registered_ahead_s": round(ahead_s, 1),
        "claimed_before_T": int(claimed_before),
        "claims_per_s_before_T": round(claimed_before / claim_span) if claim_span > 0 else None,
        "starts_per_s": {str(k): v for k, v in sorted(starts_ps.items())},
        "completions_per_s": {str(k): round(v) for k, v in sorted(completions_ps.items()) if k >= 0},
        "start_rate_mean_per_s": round(len(acc.first_start_s) / drain_s) if drain_s and drain_s > 0 else None,
        "completion_rate_mean_per_s": round(completed / comp_span) if comp_span else None,
        "start_lateness_ms": {k: round(v, 1) for k, v in late_q.items()},
        "fire_lateness_ms": {k: round(v, 1) for k, v in fire_q.items()} if in_process else None,
        "drain_s": round(drain_s, 2),
        "started": len(acc.first_start_s),
        "lost": acc.lost,
        "outcomes": {k: n for k, (n, _) in outcomes.items()},
        "errors": {k: e for k, (_, e) in outcomes.items() if e},
        "duplicated": acc.duplicated,
        **writes,
        "wheel_rss_bytes_per_run": (
            [round(b) if b is not None else None for b in wheel_bytes] if in_process else None
        ),
        "fence_statements": sum(r.fence_statements for r in reports) if in_process else None,
        "gc_seconds_per_node": [r.gc_s for r in reports] if in_process else None,
        "peak_rss_mb": peak_rss,
    }
    if a.plot:
        name = f"burst-{a.target}-{a.jobs}-{a.topology}-{a.seed_mode}-p{a.processes}"
        if a.topology == "cluster":
            name += f"-w{a.workers}"
        if a.hosts > 1:
            name += f"-h{a.hosts}"
        if a.target_delay_ms:
            name += f"-{a.target_delay_ms:g}ms"
        if a.label:
            name += f"-{a.label}"
        path = write_burst_plot(
            OUT_DIR / f"{name}.png",
            title=f"{a.jobs} runs due at T, {target_desc(a.target, a.hosts, a.target_delay_ms)}, "
            f"{a.topology}, P={a.processes}" + (f", W={a.workers}" if a.topology == "cluster" else ""),
            starts_per_s=starts_ps,
            completions_per_s={k: v for k, v in completions_ps.items() if k >= -2},
            claims_per_s=None,
            lateness_ms=acc.lateness_ms,
        )
        result["plot"] = str(path)
    return result


def target_desc(target: str, hosts: int, delay_ms: float) -> str:
    """``webhook``, or ``webhook (8 hosts, answering in 200 ms)`` when either is not the default."""
    extra = [f"{hosts} hosts"] if hosts > 1 else []
    extra += [f"answering in {delay_ms:g} ms"] if delay_ms else []
    return f"{target} ({', '.join(extra)})" if extra else target


def report(result: dict[str, Any]) -> None:
    def q(d: dict[str, float] | None) -> str:
        if d is None:
            return "n/a"
        return " / ".join(f"{d[k]:.0f}" for k in ("p50", "p90", "p99", "max")) + " ms"

    wheel, fences = result["wheel_rss_bytes_per_run"], result["fence_statements"]
    shape = f"{result['topology']}, P={result['processes']}"
    if result.get("workers") is not None:
        shape += f" engines, W={result['workers']} workers"

    series = ", ".join(f"{k}:{v}" for k, v in list(result["starts_per_s"].items())[:20])
    comp = ", ".join(f"{k}:{v}" for k, v in list(result["completions_per_s"].items())[:20])
    print_report(
        "burst",
        result,
        [
            (
                "runs due at T",
                f"{result['jobs']} → "
                f"{target_desc(result['target'], result['hosts'], result['target_delay_ms'])}, {shape}",
            ),
            ("registration", f"{result['registration_per_s']}/s ({result['seeding']})"),
            ("registered ahead of T", f"{result['registered_ahead_s']} s"),
            ("claimed before T", f"{result['claimed_before_T']} at {result['claims_per_s_before_T']}/s"),
            ("starts/s after T (s:count)", series),
            ("completions/s after T", comp),
            (
                "mean start / completion rate",
                f"{result['start_rate_mean_per_s']}/s, {result['completion_rate_mean_per_s']}/s",
            ),
            ("start lateness p50/p90/p99/max", q(result["start_lateness_ms"])),
            ("fire lateness at engine", q(result["fire_lateness_ms"])),
            ("drain (last start − T)", f"{result['drain_s']} s"),
            (
                "started / lost / duplicated",
                f"{result['started']} / {result['lost']} / {result['duplicated']}",
            ),
            (
                "row writes per run (ins + upd)",
                f"{result['row_writes_per_run']} "
                f"({result['inserts_per_run']} + {result['updates_per_run']}), "
                f"HOT {result['hot_update_share']:.0%}, WAL {result['wal_bytes_per_run']} B",
            ),
            ("engine RSS per waiting run", "n/a" if wheel is None else ", ".join(f"{b} B" for b in wheel)),
            ("fence statements", "n/a" if fences is None else str(fences)),
            ("peak RSS", ", ".join(f"{k} {v:.0f} MB" for k, v in result["peak_rss_mb"].items())),
            ("load average (1 min) start, end", " → ".join(str(x) for x in result.get("load_1m", []))),
            ("plot", result.get("plot", "-")),
            *_memory_rows(result.get("memory"), result.get("memory_plot")),
            *_failover_rows(result.get("failover")),
            *_old_history_rows(result.get("old_history")),
            *(report_rows(result["cpu"]) if result.get("cpu") else []),
            *(pgstats.report_rows(result["pg_statements"]) if result.get("pg_statements") else []),
        ],
    )


def _memory_rows(nodes: list[dict[str, Any]] | None, plot: str | None) -> list[tuple[str, str]]:
    if not nodes:
        return []

    def stages(v: dict[str, Any]) -> str:
        return (
            f"wheel {v['wheel']:,}, fired {v['fired_unfenced']:,}, queue {v['run_queue']:,}, "
            f"in flight {v['in_flight']:,}, completer {v['completer_pending']:,}, held {v['held']:,}"
        )

    def alloc(v: dict[str, Any]) -> str:
        traced = "" if v["traced_mb"] is None else f", traced {v['traced_mb']} MB"
        return (
            f"anon {v['anon_mb']} MB, malloc arenas {v['malloc_arena_mb']} MB "
            f"(in use {v['malloc_in_use_mb']}, free kept {v['malloc_free_kept_mb']}, "
            f"mmapped {v['malloc_mmapped_mb']}){traced}"
        )

    rows: list[tuple[str, str]] = []
    for i, n in enumerate(nodes):
        rows += [
            (
                f"node-{i} RSS idle / peak / {n['after_drain_s']:.0f} s after drain",
                f"{n['idle_rss_mb']:.0f} / {n['peak_rss_mb']:.0f} / {n['after_drain_rss_mb']:.0f} MB "
                f"({n['after_drain_over_idle']}× idle)",
            ),
            (f"node-{i} at peak (T{n['at_peak']['s_after_T']:+.0f} s)", alloc(n["at_peak"])),
            (f"node-{i} at peak: runs held", stages(n["at_peak"])),
            (f"node-{i} most held (T{n['at_most_held']['s_after_T']:+.0f} s)", stages(n["at_most_held"])),
            (f"node-{i} after drain", alloc(n["after_drain"])),
            *(
                [
                    (
                        f"node-{i} after gc.collect()",
                        f"RSS {c['rss_mb']:.0f} MB, pymalloc in live blocks {c['pymalloc_in_use_mb']} MB; "
                        f"garbage found: {sum(n['garbage_by_type'].values()):,} objects ("
                        + ", ".join(f"{k} {v:,}" for k, v in list(n["garbage_by_type"].items())[:6])
                        + ")",
                    )
                    for c in [n["after_full_collection"]]
                    if c is not None
                ]
            ),
            *(
                [
                    (
                        f"node-{i} pymalloc (T{p['s_after_T']:+.0f} s, RSS {p['rss_mb']:.0f} MB)",
                        f"arenas {p['pymalloc_arenas_mb']} MB, in live blocks {p['pymalloc_in_use_mb']} MB",
                    )
                    for p in (n["at_peak_pymalloc_sample"], n["after_drain_pymalloc_sample"])
                    if p is not None
                ]
            ),
        ]
    return [*rows, ("memory plot", plot or "-")]


def _old_history_rows(o: dict[str, Any] | None) -> list[tuple[str, str]]:
    if o is None:
        return []
    return [
        (
            "old history seeded",
            f"{o['seeded']['history_rows']:,} history rows, {o['seeded']['finished_jobs']:,} finished jobs",
        ),
        (
            "retention, T → last start",
            f"{o['history_rows_deleted_T_to_last_start']:,} history rows and "
            f"{o['finished_jobs_deleted_T_to_last_start']:,} jobs deleted "
            f"({o['deleted_rows_per_s']}/s); left at T {o['left_at_T']['history_rows']:,}, "
            f"at the last start {o['left_at_last_start']['history_rows']:,}, "
            f"at the end {o['left_at_end']['history_rows']:,}",
        ),
    ]


def _failover_rows(f: dict[str, Any] | None) -> list[tuple[str, str]]:
    if f is None:
        return []
    late = f["their_lateness_ms"]
    return [
        ("SIGKILL engine-0 at", f"T+{f['killed_at_s_after_T']} s, it served shards {f['shards']}"),
        (
            "kill → first start per shard",
            f"max {f['kill_to_first_start_max_s']} s; "
            + ", ".join(f"{s}:{v}" for s, v in f["kill_to_first_start_s"].items()),
        ),
        (
            "runs waiting there: lateness p50/p90/p99/max",
            "none"
            if late is None
            else f"{f['runs_waiting_on_its_shards']} runs, "
            + " / ".join(f"{late[k]:.0f}" for k in ("p50", "p90", "p99", "max"))
            + " ms",
        ),
    ]


def parse_args(argv: Sequence[str] | None = None) -> BurstArgs:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--target", choices=("webhook", "redis", "nats"), default="redis")
    p.add_argument("--topology", choices=("all-in-one", "cluster"), default="all-in-one")
    p.add_argument("--seed-mode", choices=("api", "bulk"), default="bulk")
    p.add_argument(
        "--processes",
        type=int,
        default=2,
        help="node processes (all-in-one) or `duetime engine` processes (cluster) sharing the 16 shards",
    )
    p.add_argument("--workers", type=int, default=2, help="`duetime worker` processes (--topology cluster)")
    p.add_argument("--lead", type=float, default=None, help="seconds from start to T (default: estimated)")
    p.add_argument("--clients", type=int, default=64, help="concurrent API clients (--seed-mode api)")
    p.add_argument("--timeout", type=float, default=None, help="give up this long after T")
    p.add_argument("--set", action="append", default=[], metavar="DUETIME_X=V", help="a node setting")
    p.add_argument("--label", default="", help="a tag for the output (and the plot's file name)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument(
        "--split-shards",
        action="store_true",
        help="--topology cluster: give each engine a disjoint --shards set instead of dealing",
    )
    p.add_argument(
        "--kill-engine-at",
        type=float,
        default=None,
        metavar="S",
        help="--topology cluster: SIGKILL engine-0 S seconds after T and report the failover",
    )
    p.add_argument(
        "--old-finished-jobs",
        type=int,
        default=0,
        help="finished jobs --old-age-s old, each with --old-runs-per-job history rows, seeded first",
    )
    p.add_argument("--old-runs-per-job", type=int, default=10)
    p.add_argument(
        "--old-cron-runs",
        type=int,
        default=0,
        help="history rows of 16 live (paused) crons, --old-age-s old, seeded first",
    )
    p.add_argument(
        "--old-age-s",
        type=float,
        default=40 * 86_400.0,
        help="how long ago the old history finished (default 40 days: past the default retention)",
    )
    p.add_argument(
        "--stages",
        nargs="?",
        const="native",
        default="off",
        choices=("off", "cpu", "native", "python"),
        help="node, PostgreSQL and Redis CPU per run from /proc; with native (the default when "
        "given) or python, py-spy's split by stage of the run path (loadtest/stages.py)",
    )
    p.add_argument("--stages-rate", type=int, default=100, help="py-spy samples per second (--stages)")
    p.add_argument(
        "--pg-statements",
        action="store_true",
        help="time, rows, buffers and WAL per named statement (pg_stat_statements, which the server at "
        "DUETIME_BENCH_PG must load) and index entries written per index: loadtest/pgstats.py",
    )
    p.add_argument(
        "--owners",
        type=int,
        default=1,
        help="bulk, queue targets: the jobs' owners take turns among this many (default: one, `bench`)",
    )
    p.add_argument(
        "--after-drain",
        type=float,
        default=60.0,
        metavar="S",
        help="all-in-one: keep the nodes running S seconds after the last outcome, sampling their "
        "memory (the RSS a drain leaves behind); 0 stops them at once",
    )
    p.add_argument(
        "--hosts",
        type=int,
        default=1,
        help="webhook: the receiver listens on this many loopback ports, each a host to the workers; "
        "the jobs take turns among them",
    )
    p.add_argument(
        "--target-delay-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="webhook: the receiver answers each call this long after it arrived (default: at once)",
    )
    a = p.parse_args(argv)
    if (a.hosts != 1 or a.target_delay_ms) and a.target != "webhook":
        p.error("--hosts and --target-delay-ms need --target webhook")
    if a.hosts < 1 or a.target_delay_ms < 0:
        p.error("--hosts must be at least 1 and --target-delay-ms at least 0")
    if a.kill_engine_at is not None and a.topology != "cluster":
        p.error("--kill-engine-at needs --topology cluster")
    if a.owners > 1 and (a.seed_mode != "bulk" or a.target == "webhook"):
        p.error("--owners needs --seed-mode bulk and a queue target (webhook owners need signing secrets)")
    env = dict(kv.split("=", 1) for kv in a.set)
    return BurstArgs(
        jobs=a.jobs,
        target=a.target,
        topology=a.topology,
        seed_mode=a.seed_mode,
        processes=a.processes,
        workers=a.workers,
        lead_s=a.lead,
        clients=a.clients,
        timeout_s=a.timeout,
        settings_env=env,
        plot=not a.no_plot,
        label=a.label,
        split_shards=a.split_shards,
        kill_engine_at_s=a.kill_engine_at,
        old_finished_jobs=a.old_finished_jobs,
        old_runs_per_job=a.old_runs_per_job,
        old_cron_runs=a.old_cron_runs,
        old_age_s=a.old_age_s,
        stages=a.stages,
        stages_rate=a.stages_rate,
        pg_statements=a.pg_statements,
        after_drain_s=a.after_drain,
        owners=a.owners,
        hosts=a.hosts,
        target_delay_ms=a.target_delay_ms,
    )


def main(argv: Sequence[str] | None = None) -> None:
    a = parse_args(argv)
    result = uvloop.run(run_burst(a))
    report(result)
    OUT_DIR.mkdir(exist_ok=True)
    with (OUT_DIR / "burst-results.jsonl").open("a") as f:
        f.write(json.dumps({"at": datetime.now(UTC).isoformat(), **result}, default=str) + "\n")


if __name__ == "__main__":
    main()
