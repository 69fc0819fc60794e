"""CPU per run, split by stage of the run path (issue 16): ``python -m loadtest.burst --stages``.

Two measurements of the same window (from the end of the registration to the last recorded
outcome), taken from the processes themselves, never from the benchmark's wall clock:

* **How much.** Each node process's CPU seconds (``utime + stime`` of ``/proc/<pid>/stat``, all
  its threads) at the start of the window, at T and at the end; and the same for every PostgreSQL
  backend connected to the burst's scratch database (``pg_stat_activity``, sampled every 0.5 s, so
  backends that come and go are counted too), for the server's shared background processes
  (walwriter, checkpointer, background writer: shared with every other database on the server)
  and for redis-server (shared with every other client). Divided by the runs of the burst.
* **Where.** ``py-spy record`` attached to each node for the same window (``--native``, so that
  the garbage collector and C callbacks show as their own frames; ``--format raw``: collapsed
  stacks with counts). py-spy records only samples of threads that are running or runnable, so
  on a loaded machine the samples are proportional to "wanted the CPU", which is why they are used
  only as *shares*, multiplied by the CPU seconds /proc reports.

**How a sample is given a stage** (``stage_of``). A sample is a stack, root to leaf. The frames
are looked at from the leaf towards the root, and the first frame that one of ``RULES`` names
decides: the deepest named frame wins, so a metric observed inside the fencer is "metrics" and
the wheel's own insert called by the admission is "wheel". Frames no rule names (asyncpg,
redis-py, json, codec, wire, datetime, the standard library) belong to whatever named frame
called them. A stack with no named frame at all is "loop": uvloop's own work and the C protocol
callbacks that run straight from the loop without a Python frame above them -- asyncpg decoding
the rows of a reply arrives this way, so part of each statement's cost lands there and not in
its stage. The stages:

=========  ===========================================================================
claim      the claim loops (``Engine._claim_loop``, take-backs, overlap splits) and the store's
           ``claim_due``/``retake_claims`` with their row decoding
admit      ``Engine._admit``: claimed rows into wheel entries (misfire policy, packing)
wheel      the timer wheel (``engine/wheel.py``: insert, ticks, firing) and the hand-over of
           fired entries to the fencer's lanes (``_on_fire``, ``_queue_fired``)
fence      ``Engine._fence_loop``/``_take_fair`` and the store's ``fence_runs``: unpacking entries,
           the fence statement, a ``FencedRun`` per run, the put on the run queue
deliver    the workers (``WorkerPool._work`` and the calls under it, ``workers/dispatch.py``,
           ``workers/queues.py``: Redis XADD pipelines, or webhooks): the target call
record     ``Completer`` and the store's completion (``storage/postgres/completion.py``,
           ``storage/completion_rules.py``, ``core/lifecycle.py``): the fenced completion and
           the history row
=========  ===========================================================================

and "other", split into: ``gc`` (native ``gc_collect_main`` and its kin), ``metrics``
(prometheus_client), ``logging``, ``upkeep`` (lease heartbeats, janitor, failure events,
membership, retention, due-age sampling), ``bench`` (the benchmark's own 10 Hz sampler inside each
node), ``loop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STAGES = ("claim", "admit", "wheel", "fence", "deliver", "record")
OTHER = ("gc", "metrics", "logging", "upkeep", "bench", "loop")
_TICK = os.sysconf("SC_CLK_TCK")
# py-spy is a dev dependency: beside this interpreter in the project's virtualenv.
_PYSPY = os.environ.get("DUETIME_BENCH_PYSPY") or str(
    next((p for p in (Path(sys.executable).parent / "py-spy",) if p.exists()), "py-spy")
)


@dataclass(frozen=True, slots=True)
class Rule:
    """Frames in a file ending with ``file`` (any file when empty) whose function is one of
    ``functions`` (any when empty) belong to ``stage``. Native frames name their library or C
    file instead of a Python file; ``file`` then matches that."""

    stage: str
    file: str = ""
    functions: frozenset[str] = frozenset()

    def matches(self, function: str, file: str) -> bool:
        if self.file:
            # "pkg/" names a whole package (py-spy shortens paths to "pkg/module.py")
            inside = file.startswith(self.file) or f"/{self.file}" in file
            if not (inside if self.file.endswith("/") else file.endswith(self.file)):
                return False
        return not self.functions or function in self.functions


def _r(stage: str, file: str = "", *functions: str) -> Rule:
    return Rule(stage, file, frozenset(functions))


# Checked in order for each frame; the frame nearest the leaf with any match decides.
RULES: tuple[Rule, ...] = (
    # the collector runs inside whatever allocated: its native frames come first
    _r("gc", "", "gc_collect_main", "gc_collect_with_callback", "gc_collect_generations"),
    _r("metrics", "prometheus_client/metrics.py"),
    _r("metrics", "prometheus_client/values.py"),
    _r("metrics", "prometheus_client/registry.py"),
    _r("metrics", "prometheus_client/samples.py"),
    _r("metrics", "duetime/runqueue/metrics.py"),
    _r("logging", "logging/__init__.py"),
    _r("logging", "duetime/logs.py"),
    # every stack's root is the benchmark's _node_main: only its sampler's own frames are "bench"
    _r(
        "bench",
        "loadtest/burst.py",
        "_node_main.<locals>.main",
        "_node_main.<locals>.total",
        "_node_main.<locals>.on_gc",
        "_rss_bytes",
        "_dump_tasks",
    ),
    # engine
    _r("admit", "engine/service.py", "Engine._admit"),
    _r("wheel", "engine/wheel.py"),
    _r("wheel", "engine/service.py", "Engine._on_fire", "Engine._queue_fired"),
    _r("fence", "engine/service.py", "Engine._fence_loop", "Engine._take_fair"),
    _r("fence", "storage/postgres/runpath.py", "RunPathPart.fence_runs"),
    _r(
        "claim",
        "engine/service.py",
        "Engine._claim_loop",
        "Engine._take_back",
        "Engine._split_overlapping",
        "Engine._claim_slack_s",
        "Engine._listen",
        "Engine._on_due",
    ),
    _r(
        "claim",
        "storage/postgres/runpath.py",
        "RunPathPart.claim_due",
        "RunPathPart.retake_claims",
        "_claimed",
    ),
    _r("claim", "storage/postgres/hints.py"),
    _r(
        "upkeep",
        "engine/service.py",
        "Engine._janitor_loop",
        "Engine._keep_waiting_claims",
        "Engine._release",
    ),
    _r("upkeep", "runqueue/leases.py", "LeaseKeeper.beat", "LeaseKeeper._run"),
    _r("upkeep", "engine/membership.py"),
    _r("upkeep", "engine/retention.py"),
    _r("upkeep", "engine/due_age.py"),
    _r("upkeep", "workers/events.py"),  # failure events: not a run's own delivery
    # workers: the completer first (it lives in workers/pool.py beside the workers)
    _r(
        "record",
        "workers/pool.py",
        "Completer.add",
        "Completer._run",
        "Completer._take",
        "Completer.room",
    ),
    _r("record", "storage/postgres/completion.py"),
    _r("record", "storage/completion_rules.py"),
    _r("record", "core/lifecycle.py"),
    _r("deliver", "workers/pool.py"),
    _r("deliver", "workers/dispatch.py"),
    _r("deliver", "workers/queues.py"),
    _r("deliver", "workers/webhook.py"),
    _r("deliver", "workers/http1.py"),
    _r("deliver", "workers/limits.py"),
    _r("deliver", "workers/hostqueues.py"),
    _r("deliver", "workers/targets.py"),
    _r("deliver", "core/targethealth.py"),
    _r("deliver", "workers/tracing.py"),
)

# Of a stage's samples, those under one of these frames (anywhere in the stack): not stages of
# their own, but what the next step of issue 16 asks about.
PARTS: dict[str, tuple[Rule, ...]] = {
    "spec_parse": (
        _r("", "core/runpath.py", "RunSpec.parsed", "RunSpec.reuse"),
        _r("", "core/codec.py", "spec_from_json"),
        _r("", "core/spectext.py", "spec_from_text"),
    ),
    "format_time": (_r("", "core/codec.py", "format_time"),),
    # its Python frames, and its Cython protocol's native ones (protocol.c, pgproto.c)
    "asyncpg": (_r("", "asyncpg/"), _r("", "protocol.c"), _r("", "pgproto.c")),
    "redis_py": (_r("", "redis/"),),
}

# A sample whose deepest frame is one of these waits in the kernel: py-spy counted it because the
# thread was runnable (woken, not yet on a core), not because it used the CPU. Not counted.
BLOCKED = frozenset(
    {
        "epoll_pwait",
        "epoll_wait",
        "poll",
        "ppoll",
        "select",
        "pselect6",
        "clock_nanosleep",
        "nanosleep",
        "futex",
        "__futex_abstimed_wait_common",
    }
)

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def parse_frame(text: str) -> tuple[str, str]:
    """``function (file:line)`` as py-spy writes it → (function, file)."""
    m = _FRAME.match(text.strip())
    if m is None:
        return text.strip(), ""
    return m["function"], m["file"]


def stage_of(frames: Sequence[tuple[str, str]]) -> str:
    """The stage of one sample, its frames root first (see the module's docstring)."""
    for function, file in reversed(frames):
        for rule in RULES:
            if rule.matches(function, file):
                return rule.stage
    return "loop"


def parse_raw(text: str) -> Iterable[tuple[list[tuple[str, str]], int]]:
    """py-spy's ``--format raw`` lines, ``frame;frame;... count`` → (frames root first, count)."""
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        yield [parse_frame(f) for f in stack.split(";")], int(count)


@dataclass
class StageSamples:
    """Samples per stage, per (stage, part), and each stage's hottest leaf Python functions."""

    stages: Counter[str] = field(default_factory=Counter)
    parts: Counter[tuple[str, str]] = field(default_factory=Counter)
    leaves: dict[str, Counter[str]] = field(default_factory=dict)
    blocked: int = 0  # samples in a blocking system call (BLOCKED): left out of every share

    @property
    def total(self) -> int:
        return sum(self.stages.values())

    def add(self, frames: Sequence[tuple[str, str]], count: int) -> None:
        if frames and frames[-1][0] in BLOCKED:
            self.blocked += count
            return
        stage = stage_of(frames)
        self.stages[stage] += count
        for part, rules in PARTS.items():
            if any(r.matches(f, file) for f, file in frames for r in rules):
                self.parts[stage, part] += count
        leaf = next((f"{f} ({file})" for f, file in reversed(frames) if file.endswith(".py")), "native")
        self.leaves.setdefault(stage, Counter())[leaf] += count

    def merge(self, other: StageSamples) -> None:
        self.blocked += other.blocked
        self.stages.update(other.stages)
        self.parts.update(other.parts)
        for stage, counter in other.leaves.items():
            self.leaves.setdefault(stage, Counter()).update(counter)


def classify(text: str) -> StageSamples:
    out = StageSamples()
    for frames, count in parse_raw(text):
        out.add(frames, count)
    return out


def split_cpu(samples: StageSamples, cpu_s: float, runs: int) -> dict[str, float]:
    """CPU µs per run of each stage and "other" part: its share of the samples × the CPU seconds."""
    total = samples.total
    if not total or runs <= 0:
        return {}
    return {name: samples.stages.get(name, 0) / total * cpu_s / runs * 1e6 for name in (*STAGES, *OTHER)}


# ---------------------------------------------------------------- reading processes


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process (all its threads), in seconds; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / _TICK


def procs_cpu_s(pids: Iterable[int]) -> float:
    """utime + stime of several processes together, in seconds; a process gone counts 0."""
    return sum(proc_cpu_s(pid) or 0.0 for pid in pids)


def proc_start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return int(text.rpartition(")")[2].split()[19])  # field 22, starttime, ticks after boot


def boot_ticks_now() -> int:
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * _TICK)


def pids_named(*parts: str) -> dict[str, int]:
    """Processes whose command line contains one of ``parts``: {the part: pid}, first found."""
    out: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        for part in parts:
            if part in cmd and part not in out:
                out[part] = int(entry)
    return out


PG_BACKGROUND = ("walwriter", "checkpointer", "background writer")


class PgCpu:
    """CPU of the PostgreSQL backends serving one database, sampled every ``every_s``.

    A backend is counted from the start of the window (or from its birth, when it connected after
    the start) to the last time it was seen."""

    def __init__(self, admin_dsn: str, database: str, every_s: float = 0.5) -> None:
        self._admin_dsn = admin_dsn
        self._database = database
        self._every = every_s
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._start_ticks = 0
        self._task: asyncio.Task[None] | None = None
        self._conn: Any = None
        self._lock = asyncio.Lock()  # the sampler task and the window's readings share one connection

    async def start(self) -> None:
        import asyncpg

        self._conn = await asyncpg.connect(self._admin_dsn)
        self._start_ticks = boot_ticks_now()
        await self.sample()
        self._task = asyncio.create_task(self._loop(), name="pg-cpu-sampler")

    async def sample(self) -> None:
        async with self._lock:
            rows = await self._conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = $1", self._database
            )
        for r in rows:
            pid = r["pid"]
            cpu = proc_cpu_s(pid)
            if cpu is None:
                continue
            if pid not in self._first:
                born = proc_start_ticks(pid)
                self._first[pid] = 0.0 if born is not None and born > self._start_ticks else cpu
            self._last[pid] = cpu

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            with contextlib.suppress(Exception):
                await self.sample()

    def cpu_s(self) -> float:
        return sum(self._last[p] - self._first[p] for p in self._last)

    def backends(self) -> int:
        return len(self._last)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self.sample()
        if self._conn is not None:
            await self._conn.close()


# ---------------------------------------------------------------- py-spy


class Spy:
    """``py-spy record`` on one process until ``stop``; its raw output classified by stage."""

    def __init__(self, pid: int, *, rate: int, native: bool) -> None:
        self.pid = pid
        self._rate = rate
        self._native = native
        self._dir = Path(tempfile.mkdtemp(prefix="duetime-stages-"))
        self.out = self._dir / f"spy-{pid}.txt"
        self._proc: subprocess.Popen[bytes] | None = None
        self.error: str | None = None

    def _cmd(self) -> list[str]:
        cmd = [_PYSPY, "record", "--pid", str(self.pid), "--rate", str(self._rate), "--format", "raw"]
        cmd += ["-o", str(self.out), "--native" if self._native else "--nonblocking"]
        return cmd

    def start(self, tries: int = 5) -> bool:
        """Attach; py-spy sometimes fails to read the interpreter's version on its first look at a
        process ("Failed to find python version"), so a failed attach is tried again."""
        for _ in range(tries):
            with open(self._dir / "stderr.txt", "wb") as err:
                self._proc = subprocess.Popen(self._cmd(), stdout=subprocess.DEVNULL, stderr=err)
            time.sleep(1.0)
            if self._proc.poll() is None:
                return True
            lines = (self._dir / "stderr.txt").read_text(errors="replace").splitlines()
            self.error = lines[0] if lines else f"py-spy exited with {self._proc.returncode}"
        return False

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(5)

    def stop(self) -> StageSamples | None:
        if self._proc is None or self._proc.poll() is not None:
            return None
        self._proc.send_signal(signal.SIGINT)
        try:
            self._proc.wait(60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5)
        if not self.out.exists():
            self.error = "py-spy wrote no output"
            return None
        return classify(self.out.read_text(errors="replace"))


# ---------------------------------------------------------------- the window


@dataclass
class CpuReading:
    at: float
    load_1m: float
    node_s: dict[int, float]
    pg_s: float
    pg_background_s: float
    redis_s: float
    nats_s: float = 0.0


class StageWindow:
    """Everything of one ``--stages`` measurement: CPU readings of the nodes, PostgreSQL and Redis
    at the start, at T and at the end, and a py-spy per node for the whole window."""

    def __init__(
        self,
        node_pids: Sequence[int],
        *,
        admin_dsn: str,
        database: str,
        rate: int = 100,
        native: bool = True,
        profile: bool = True,
        roles: dict[int, str] | None = None,
    ) -> None:
        self.node_pids = list(node_pids)
        # pid → role ("engine", "worker", "node"): the cluster topology's CPU per process kind
        self.roles = roles or {}
        self.pg = PgCpu(admin_dsn, database)
        self._spies = [Spy(p, rate=rate, native=native) for p in node_pids] if profile else []
        self._background = {
            name: pid for name, pid in pids_named(*(f"postgres: 15/main: {n}" for n in PG_BACKGROUND)).items()
        }
        self._redis = pids_named("redis-server").get("redis-server")
        self._nats = pids_named("nats-server").get("nats-server")
        self.readings: dict[str, CpuReading] = {}
        self.attached: list[bool] = []
        self.native = native
        self.rate = rate

    def _read(self) -> CpuReading:
        return CpuReading(
            at=time.time(),
            load_1m=os.getloadavg()[0],
            node_s={p: proc_cpu_s(p) or 0.0 for p in self.node_pids},
            pg_s=self.pg.cpu_s(),
            pg_background_s=procs_cpu_s(self._background.values()),
            redis_s=(proc_cpu_s(self._redis) or 0.0) if self._redis else 0.0,
            nats_s=(proc_cpu_s(self._nats) or 0.0) if self._nats else 0.0,
        )

    async def start(self) -> None:
        """At the end of the registration: the nodes are idle until the claims begin, which
        gives the idle CPU rate that ``summary`` reports beside the figures."""
        await self.pg.start()
        self.readings["idle"] = self._read()

    async def begin(self) -> None:
        """Just before the claims begin (T - lookahead): the window starts, py-spy attaches."""
        self.attached = [await asyncio.to_thread(s.start) for s in self._spies]
        await self.pg.sample()
        self.readings["claims"] = self._read()

    async def mark(self) -> None:
        """At T: CPU before T is the claims' and the admission's (and the idle wait for T)."""
        await self.pg.sample()
        self.readings["T"] = self._read()

    async def stop(self, runs: int) -> dict[str, Any]:
        await self.pg.sample()
        self.readings["end"] = self._read()
        samples = [await asyncio.to_thread(s.stop) for s in self._spies]
        await self.pg.stop()
        return self.summary(runs, samples)

    async def abort(self) -> None:
        """The burst failed: no figures, and no py-spy left behind."""
        for spy in self._spies:
            spy.kill()
        with contextlib.suppress(Exception):
            await self.pg.stop()

    def summary(self, runs: int, samples: Sequence[StageSamples | None]) -> dict[str, Any]:
        r = self.readings
        first, last = r.get("claims", r["idle"]), r["end"]
        n = max(runs, 1)
        node_s = {p: last.node_s[p] - first.node_s[p] for p in self.node_pids}
        node_total = sum(node_s.values())
        window_s = last.at - first.at
        out: dict[str, Any] = {
            "window_s": round(window_s, 1),
            "load_1m": [round(x.load_1m, 2) for x in r.values()],
            "node_cpu_s": {str(p): round(v, 2) for p, v in node_s.items()},
            "node_us_per_run": round(node_total / n * 1e6, 1),
            "pg_backends": self.pg.backends(),
            "pg_us_per_run": round((last.pg_s - first.pg_s) / n * 1e6, 1),
            "pg_background_us_per_run": round((last.pg_background_s - first.pg_background_s) / n * 1e6, 1),
            "redis_us_per_run": round((last.redis_s - first.redis_s) / n * 1e6, 1),
            "nats_us_per_run": round((last.nats_s - first.nats_s) / n * 1e6, 1),
        }
        if self.roles:
            # CPU per run by process kind (engines, workers, nats-server, the burst's PostgreSQL
            # backends), and per process: where the cluster's extra cost per run sits
            by_role: dict[str, float] = {}
            for p, v in node_s.items():
                role = self.roles.get(p, "node")
                by_role[role] = by_role.get(role, 0.0) + v
            out["role_us_per_run"] = {
                **{k: round(v / n * 1e6, 1) for k, v in sorted(by_role.items())},
                "nats-server": out["nats_us_per_run"],
                "postgres": out["pg_us_per_run"],
            }
        idle = r["idle"]
        if "claims" in r and first.at - idle.at >= 2.0:
            # all nodes together, CPU seconds per second while nothing was claimed or due
            rate = sum(first.node_s[p] - idle.node_s[p] for p in self.node_pids) / (first.at - idle.at)
            out["idle_node_cpu_per_s"] = round(rate, 4)
            out["idle_us_per_run"] = round(rate * window_s / n * 1e6, 1)
        if "T" in r:
            mid = r["T"]
            out["node_us_per_run_before_T"] = round(
                sum(mid.node_s[p] - first.node_s[p] for p in self.node_pids) / n * 1e6, 1
            )
            out["node_us_per_run_after_T"] = round(
                sum(last.node_s[p] - mid.node_s[p] for p in self.node_pids) / n * 1e6, 1
            )
            # The database's share of the drain (fence, completion, kept claims) apart from the
            # claims before T, which a burst pays while nothing is due yet.
            out["pg_us_per_run_before_T"] = round((mid.pg_s - first.pg_s) / n * 1e6, 1)
            out["pg_us_per_run_after_T"] = round((last.pg_s - mid.pg_s) / n * 1e6, 1)
        if not self._spies:
            return out
        figures = stage_figures(samples, node_s, n)
        out["profiler"] = {
            "tool": "py-spy record" + (" --native" if self.native else " --nonblocking"),
            "rate_hz": self.rate,
            "samples": figures.pop("samples"),
            "blocked_samples_left_out": figures.pop("blocked_samples_left_out"),
            "nodes_profiled": figures.pop("nodes_profiled"),
            "errors": [s.error for s in self._spies if s.error],
            "raw": [str(s.out) for s in self._spies if s.out.exists()],
        }
        if out["profiler"]["nodes_profiled"] != len(self.node_pids):
            out["profiler"]["note"] = "not every node was profiled: stage figures cover only those that were"
        out.update(figures)
        return out


def stage_figures(
    samples: Sequence[StageSamples | None], node_s: dict[int, float], runs: int
) -> dict[str, Any]:
    """µs per run of each stage, part and "other" line: each node's sample shares times that
    node's own CPU seconds (``node_s``, by pid, in the order of ``samples``), added up."""
    n = max(runs, 1)
    stages: dict[str, float] = {}
    parts: dict[str, float] = {}
    merged = StageSamples()
    profiled = 0
    for pid, s in zip(node_s, samples, strict=True):
        if s is None or not s.total:
            continue
        profiled += 1
        merged.merge(s)
        for name, us in split_cpu(s, node_s[pid], n).items():
            stages[name] = stages.get(name, 0.0) + us
        for (stage, part), count in s.parts.items():
            key = f"{stage}.{part}"
            parts[key] = parts.get(key, 0.0) + count / s.total * node_s[pid] / n * 1e6
    return {
        "samples": merged.total,
        "blocked_samples_left_out": merged.blocked,
        "nodes_profiled": profiled,
        "stage_us_per_run": {k: round(v, 1) for k, v in stages.items()},
        "other_us_per_run": round(sum(stages.get(k, 0.0) for k in OTHER), 1),
        "part_us_per_run": {k: round(v, 1) for k, v in sorted(parts.items())},
        "top_leaves": {
            stage: [(leaf, round(c / merged.total * 100, 1)) for leaf, c in counter.most_common(6)]
            for stage, counter in merged.leaves.items()
        }
        if merged.total
        else {},
    }


def report_rows(cpu: dict[str, Any]) -> list[tuple[str, str]]:
    """The human table's rows for ``--stages`` (the JSON line carries everything)."""
    loads = " / ".join(str(x) for x in cpu["load_1m"])
    idle = cpu.get("idle_us_per_run")
    rows = [
        ("CPU window", f"{cpu['window_s']} s from the claims to the last outcome"),
        ("load (1 min) idle / claims / T / end", loads),
        (
            "node CPU per run",
            f"{cpu['node_us_per_run']} µs"
            + (
                f" ({cpu['node_us_per_run_before_T']} before T, {cpu['node_us_per_run_after_T']} after)"
                if "node_us_per_run_before_T" in cpu
                else ""
            )
            + (f"; an idle node's CPU over the same window: {idle} µs per run" if idle is not None else ""),
        ),
    ]
    stages = cpu.get("stage_us_per_run")
    if stages:
        total = sum(stages.values()) or 1.0
        for name in STAGES:
            us = stages.get(name, 0.0)
            parts = ", ".join(
                f"{k.partition('.')[2]} {v:.1f}"
                for k, v in cpu["part_us_per_run"].items()
                if k.partition(".")[0] == name
            )
            of = f"   (of which {parts})" if parts else ""
            rows.append((f"  {name}", f"{us:6.1f} µs  {us / total:5.1%}{of}"))
        other = cpu["other_us_per_run"]
        replies = cpu["part_us_per_run"].get("loop.asyncpg")
        detail = ", ".join(
            f"{k} {stages.get(k, 0.0):.1f}"
            + (f" [of which asyncpg's replies {replies:.1f}]" if k == "loop" and replies else "")
            for k in OTHER
        )
        rows.append(("  other", f"{other:6.1f} µs  {other / total:5.1%}   ({detail})"))
        prof = cpu["profiler"]
        rows.append(
            (
                "profiler",
                f"{prof['tool']} at {prof['rate_hz']} Hz, {prof['samples']} samples "
                f"(+{prof['blocked_samples_left_out']} in a blocking system call, left out)",
            )
        )
    rows += [
        (
            "PostgreSQL CPU per run",
            f"{cpu['pg_us_per_run']} µs in {cpu['pg_backends']} backends of the burst's database"
            + (
                f" ({cpu['pg_us_per_run_before_T']} before T, {cpu['pg_us_per_run_after_T']} after)"
                if "pg_us_per_run_before_T" in cpu
                else ""
            ),
        ),
        (
            "  server background (shared)",
            f"{cpu['pg_background_us_per_run']} µs (walwriter, checkpointer, bgwriter)",
        ),
        ("redis-server CPU per run (shared)", f"{cpu['redis_us_per_run']} µs"),
        ("nats-server CPU per run (shared)", f"{cpu.get('nats_us_per_run', 0.0)} µs"),
    ]
    if cpu.get("role_us_per_run"):
        roles = ", ".join(f"{k} {v}" for k, v in cpu["role_us_per_run"].items())
        rows.append(("CPU per run by process kind", f"{roles} µs"))
    return rows


def resplit(result: dict[str, Any]) -> dict[str, Any]:
    """A burst's ``cpu`` figures again from its raw py-spy files, with the rules as they are now
    (the files stay in the temporary folders the JSON names)."""
    cpu = dict(result["cpu"])
    prof = dict(cpu["profiler"])
    node_s = {int(p): float(v) for p, v in cpu["node_cpu_s"].items()}
    samples = [classify(Path(path).read_text(errors="replace")) for path in prof["raw"]]
    figures = stage_figures(samples, node_s, int(result["jobs"]))
    for key in ("samples", "blocked_samples_left_out", "nodes_profiled"):
        prof[key] = figures.pop(key)
    cpu.update(figures, profiler=prof)
    return cpu


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m loadtest.stages FILE``: the stage table of each burst JSON line in FILE
    (``loadtest/out/burst-results.jsonl``, or a saved output) with ``cpu.profiler.raw``, split again
    with the current rules."""
    import json

    from loadtest.common import print_report

    for path in argv if argv is not None else sys.argv[1:]:
        for line in Path(path).read_text().splitlines():
            if not line.startswith("{"):
                continue
            result = json.loads(line)
            if not result.get("cpu", {}).get("profiler"):
                continue
            cpu = resplit(result)
            print_report(f"stages {result.get('label', '')}", {"cpu": cpu}, report_rows(cpu))


if __name__ == "__main__":
    main()
