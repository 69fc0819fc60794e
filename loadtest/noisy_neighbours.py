"""Noisy neighbours: webhook hosts that hang, and whether the healthy hosts' runs still start on time.

    python -m loadtest.noisy_neighbours --hanging 5 --runs-per-hanging 1000 --healthy 1 \\
        --healthy-owner same --processes 1

H hanging hosts (``--hanging``: loopback ports of one receiver process that answers every call
``--hang-s`` after it arrived, default 20 s) get N one-off runs each (``--runs-per-hanging``), all
of owner A and all due at T. K healthy hosts (``--healthy``: one receiver process each, answering
at once) get ``--wave-runs`` runs in each of W waves (``--waves``), due at T, T + gap, T + 2·gap...
(``--wave-gap-s``). ``--healthy-owner`` says whose they are: ``same`` (owner A, the hanging hosts'
owner), ``other`` (owner B) or ``both`` (K hosts of each). The issue-28 scenario is five hosts
answering after 20 s with 1,000 runs each, and one healthy host with two waves of 500, five
seconds apart.

The nodes are what ``DUETIME_PROCESSES=P duetime run`` starts (``--processes``, default 1 as
``duetime run``'s: all-in-one nodes, each an engine for its share of the 16 shards with in-process
workers) on a scratch database, with ``DUETIME_WEBHOOK_ALLOW_PRIVATE=1``; ``--set DUETIME_X=v``
changes a setting. Jobs are written with COPY (``storage.bulk``, the rows ``create_job`` writes)
before T − lookahead, hanging hosts' first, so the engines have claimed them all when T comes;
both owners are created first (webhook calls are signed with the owner's secret).

Starts are timed by the receivers (arrival instant against the run's due instant), and each call
is identified by its Idempotency-Key and Duetime-Attempt headers: a run is lost if no call for it
came before the benchmark stopped waiting (``--timeout-s`` after the last wave's due instant, or
as soon as every run was called and the hanging hosts had answered); a call is duplicated if the
same key and attempt came twice. The hanging receiver samples its open requests every 100 ms:
the calls the workers have in flight to the hanging hosts.

Prints one JSON line (appended to ``loadtest/out/noisy-results.jsonl``) and a table: per wave
and healthy host (owner A / owner B) the calls and start lateness p50/p99/max; the hanging hosts'
calls in flight (peak, mean); lost and duplicated; the engines' fire lateness; the 1-minute load
average at start, at T and at the end; whether the issue's bar is met (start lateness p99 ≤ 1 s
in every wave for both owners, nothing lost or doubled). Writes a PNG under ``loadtest/out/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import uvloop

from duetime.core.model import JobSpec, OneOffSchedule, RetryPolicy, WebhookTarget
from duetime.settings import Settings
from duetime.storage.bulk import BulkJob, analyze_jobs, seed_jobs
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.burst import job_id_of_key
from loadtest.common import (
    InflightSample,
    ReceivedCall,
    ReceiverProcess,
    print_report,
    quantiles,
    scratch_database,
)
from loadtest.nodes import NodeProcesses
from loadtest.plot import write_noisy_plot

OUT_DIR = Path(__file__).parent / "out"
OWNER_A, OWNER_B = "owner-a", "owner-b"
HANGING = "hanging"  # the group of the hanging hosts' runs (owner A)
GROUP_OWNER = {HANGING: OWNER_A, "A": OWNER_A, "B": OWNER_B}
BAR_MS = 1000.0  # issue 28: healthy hosts' start lateness p99 at most this, in every wave
SAMPLE_S = 0.1


# ---------------------------------------------------------------- accounting (pure)


@dataclass(frozen=True, slots=True)
class Planned:
    """One registered run: whose group it is (``HANGING``, ``"A"`` or ``"B"``: a healthy host of
    that owner), the port of its host, its wave (0-based; the hanging runs are due with wave 0)
    and its due instant (epoch seconds)."""

    group: str
    port: int
    wave: int
    due_s: float


@dataclass
class NoisyAccount:
    """What the receivers saw against what was registered."""

    # (group, port, wave) -> start lateness (ms) of each run called, from its earliest call
    lateness_ms: dict[tuple[str, int, int], list[float]]
    planned: dict[str, int]  # runs registered, per group
    called: dict[str, int]  # runs called at least once, per group
    lost: dict[str, int]  # runs never called, per group
    duplicated: dict[str, int]  # calls repeating a (key, attempt) already seen, per group
    unexpected: int  # calls for no registered run
    wrong_host: int  # calls for a registered run that came to another host's port


def account_calls(planned: Mapping[str, Planned], calls: Iterable[ReceivedCall]) -> NoisyAccount:
    """``planned`` by job id; ``calls`` from every receiver, in any order. A run's lateness is its
    earliest call's arrival minus its due instant (a retry does not make it later); a second call
    with the same Idempotency-Key and attempt is a duplicate; a run with no call is lost."""
    first: dict[str, float] = {}
    seen: set[tuple[str, int]] = set()
    groups = sorted({p.group for p in planned.values()})
    duplicated = dict.fromkeys(groups, 0)
    unexpected = wrong_host = 0
    for call in calls:
        job_id = job_id_of_key(call.key)
        plan = planned.get(job_id)
        if plan is None:
            unexpected += 1
            continue
        if call.port != plan.port:
            wrong_host += 1
        if (call.key, call.attempt) in seen:
            duplicated[plan.group] += 1
        seen.add((call.key, call.attempt))
        at = call.arrived_ns / 1e9
        first[job_id] = min(first.get(job_id, at), at)
    lateness: dict[tuple[str, int, int], list[float]] = {}
    planned_n = dict.fromkeys(groups, 0)
    called = dict.fromkeys(groups, 0)
    for job_id, plan in planned.items():
        planned_n[plan.group] += 1
        earliest = first.get(job_id)
        if earliest is None:
            continue
        called[plan.group] += 1
        lateness.setdefault((plan.group, plan.port, plan.wave), []).append((earliest - plan.due_s) * 1000.0)
    return NoisyAccount(
        lateness_ms=lateness,
        planned=planned_n,
        called=called,
        lost={g: planned_n[g] - called[g] for g in groups},
        duplicated=duplicated,
        unexpected=unexpected,
        wrong_host=wrong_host,
    )


def merged(lateness: Mapping[tuple[str, int, int], Sequence[float]], group: str, wave: int) -> list[float]:
    """The lateness of every host of ``group`` in ``wave``, together."""
    return [x for (g, _p, w), xs in lateness.items() if g == group and w == wave for x in xs]


@dataclass(frozen=True, slots=True)
class InflightFigures:
    """The hanging hosts' open requests: the peak of their sum and of each host, and the mean of
    the sum over the busy period (from T to the last sample with any open, both included)."""

    peak: int
    mean: float
    peak_by_port: dict[int, int]
    busy_s: float
    series: list[tuple[float, int]] = field(default_factory=list)  # (s from T, sum), every sample


def inflight_figures(samples: Sequence[InflightSample], ports: Sequence[int], t0_s: float) -> InflightFigures:
    series = [
        (s.at_ns / 1e9 - t0_s, sum(s.open_by_port.get(p, 0) for p in ports))
        for s in sorted(samples, key=lambda s: s.at_ns)
    ]
    peak_by_port = {p: max((s.open_by_port.get(p, 0) for s in samples), default=0) for p in ports}
    busy = [x for x in series if x[0] >= 0]
    last = max((i for i, (_t, n) in enumerate(busy) if n > 0), default=-1)
    busy = busy[: last + 1]
    return InflightFigures(
        peak=max((n for _t, n in series), default=0),
        mean=sum(n for _t, n in busy) / len(busy) if busy else 0.0,
        peak_by_port=peak_by_port,
        busy_s=busy[-1][0] if busy else 0.0,
        series=series,
    )


def bar_failures(
    lateness: Mapping[tuple[str, int, int], Sequence[float]],
    *,
    healthy_groups: Sequence[str],
    waves: int,
    lost: int,
    duplicated: int,
    bar_ms: float = BAR_MS,
) -> list[str]:
    """Why issue 28's bar is not met: each (owner, wave) of the healthy hosts whose start lateness
    p99 is over ``bar_ms`` (or that had no call at all), and any lost or doubled run. Empty: met."""
    out: list[str] = []
    for group in healthy_groups:
        for wave in range(waves):
            late = merged(lateness, group, wave)
            if not late:
                out.append(f"owner {group} wave {wave + 1}: no call")
                continue
            p99 = quantiles(late)["p99"]
            if p99 > bar_ms:
                out.append(f"owner {group} wave {wave + 1}: p99 {p99 / 1000:.1f} s")
    if lost:
        out.append(f"{lost} lost")
    if duplicated:
        out.append(f"{duplicated} duplicated")
    return out


# ---------------------------------------------------------------- the benchmark


@dataclass
class NoisyArgs:
    hanging: int = 5
    runs_per_hanging: int = 1000
    hang_s: float = 20.0
    healthy: int = 1
    healthy_owner: str = "both"  # same | other | both
    waves: int = 2
    wave_gap_s: float = 5.0
    wave_runs: int = 500
    processes: int = 1
    settings_env: dict[str, str] = field(default_factory=dict)
    lead_s: float | None = None
    timeout_s: float = 300.0
    attempts: int = 1
    webhook_timeout_s: int = 30
    label: str = ""
    plot: bool = True

    @property
    def healthy_groups(self) -> list[str]:
        return {"same": ["A"], "other": ["B"], "both": ["A", "B"]}[self.healthy_owner]

    @property
    def total_runs(self) -> int:
        healthy = self.healthy * len(self.healthy_groups) * self.waves * self.wave_runs
        return self.hanging * self.runs_per_hanging + healthy


def plan_runs(
    a: NoisyArgs, t0_s: float, hanging_ports: Sequence[int], healthy_ports: Mapping[str, Sequence[int]]
) -> list[Planned]:
    """Every run to register, hanging hosts' first (the order they are written in: without
    isolation, they would be taken first)."""
    out = [Planned(HANGING, port, 0, t0_s) for port in hanging_ports for _ in range(a.runs_per_hanging)]
    for wave in range(a.waves):
        due = t0_s + wave * a.wave_gap_s
        for group in a.healthy_groups:
            for port in healthy_ports[group]:
                out += [Planned(group, port, wave, due)] * a.wave_runs
    return out


def _spec(url: str, due_s: float, a: NoisyArgs) -> JobSpec:
    return JobSpec(
        target=WebhookTarget(url=url + "/hook", timeout_s=a.webhook_timeout_s),
        schedule=OneOffSchedule(datetime.fromtimestamp(due_s, UTC)),
        retry=RetryPolicy(max_attempts=a.attempts),
    )


async def run_noisy(a: NoisyArgs) -> dict[str, Any]:
    load_start = os.getloadavg()[0]
    hanging = ReceiverProcess(hosts=a.hanging, delay_s=a.hang_s, sample_s=SAMPLE_S) if a.hanging else None
    healthy = {g: [ReceiverProcess() for _ in range(a.healthy)] for g in a.healthy_groups}
    receivers = [r for r in (hanging, *(r for rs in healthy.values() for r in rs)) if r is not None]
    for r in receivers:
        await asyncio.to_thread(r.start)
    try:
        async with scratch_database("duetime_noisy") as dsn:
            env = {
                "DUETIME_DATABASE_URL": dsn,
                "DUETIME_HTTP_PORT": "0",
                "DUETIME_WEBHOOK_ALLOW_PRIVATE": "1",
                "DUETIME_LOG_LEVEL": "WARNING",
                **a.settings_env,
            }
            settings = Settings.from_env(env)
            store = await PostgresStore.open(ShardMap.single(dsn), pool_size=2)
            for owner in (OWNER_A, OWNER_B):
                await store.create_api_key(owner)  # the owner, and the secret its calls are signed with
            await store.close()
            nodes = NodeProcesses(settings, a.processes)
            await asyncio.to_thread(nodes.start)
            try:
                result = await _measure(a, settings, nodes, hanging, healthy)
            finally:
                reports = await asyncio.to_thread(nodes.stop)
    finally:
        for r in receivers:
            r.stop()
    fire = quantiles([float(x) for r in reports for x in r.fire_lateness_ms])
    result["fire_lateness_ms"] = {k: round(v, 1) for k, v in fire.items()}
    result["load_1m"]["start"] = round(load_start, 2)
    result["load_1m"]["end"] = round(os.getloadavg()[0], 2)
    return result


async def _all_calls(receivers: Iterable[ReceiverProcess]) -> list[ReceivedCall]:
    return [c for r in receivers for c in await r.calls()]


async def _measure(
    a: NoisyArgs,
    settings: Settings,
    nodes: NodeProcesses,
    hanging: ReceiverProcess | None,
    healthy: Mapping[str, Sequence[ReceiverProcess]],
) -> dict[str, Any]:
    lead = a.lead_s if a.lead_s is not None else round(a.total_runs / 20_000 + settings.lookahead_s + 10)
    t0 = (datetime.now(UTC) + timedelta(seconds=lead)).replace(microsecond=0)
    t0_s = t0.timestamp()
    hanging_ports = hanging.ports if hanging is not None else []
    healthy_ports = {g: [r.port for r in rs] for g, rs in healthy.items()}
    plan = plan_runs(a, t0_s, hanging_ports, healthy_ports)
    jobs = [BulkJob(GROUP_OWNER[p.group], _spec(f"http://127.0.0.1:{p.port}", p.due_s, a)) for p in plan]
    seeded = time.perf_counter()
    ids = await seed_jobs(settings.shard_dsns(), jobs, datetime.now(UTC))
    await analyze_jobs(settings.shard_dsns())
    planned = {str(i): p for i, p in zip(ids, plan, strict=True)}
    ahead = t0_s - time.time()
    print(
        f"  registered {len(plan)} runs in {time.perf_counter() - seeded:.1f} s; T is {ahead:.1f} s ahead",
        file=sys.stderr,
        flush=True,
    )
    if ahead < settings.lookahead_s:
        print("  (registered inside the lookahead: some runs are claimed late)", file=sys.stderr)
    if ahead <= 0:
        raise SystemExit(f"registration ended {-ahead:.1f} s after T; raise --lead")
    receivers = [r for r in (hanging, *(r for rs in healthy.values() for r in rs)) if r is not None]
    last_due = t0_s + (a.waves - 1) * a.wave_gap_s
    deadline = last_due + a.timeout_s
    load_at_t: float | None = None
    last_print = 0.0
    while time.time() < deadline:
        await asyncio.sleep(2.0)
        if load_at_t is None and time.time() >= t0_s:
            load_at_t = os.getloadavg()[0]
        if time.time() < t0_s:
            continue
        calls = await _all_calls(receivers)
        acc = account_calls(planned, calls)
        hanging_calls = [c.arrived_ns / 1e9 for c in calls if c.port in hanging_ports]
        done = sum(acc.lost.values()) == 0
        answered = not hanging_calls or time.time() > max(hanging_calls) + a.hang_s + 1.0
        if done and answered:
            break
        if time.time() - last_print > 10:
            last_print = time.time()
            print(
                f"  T{time.time() - t0_s:+.0f} s: called "
                + ", ".join(f"{g} {acc.called[g]}/{acc.planned[g]}" for g in sorted(acc.planned)),
                file=sys.stderr,
                flush=True,
            )
    calls = await _all_calls(receivers)
    samples = await hanging.inflight() if hanging is not None else []
    return summarise(
        a,
        planned=planned,
        calls=calls,
        samples=samples,
        t0_s=t0_s,
        hanging_ports=hanging_ports,
        healthy_ports=healthy_ports,
        load_at_t=load_at_t,
    )


def summarise(
    a: NoisyArgs,
    *,
    planned: Mapping[str, Planned],
    calls: Sequence[ReceivedCall],
    samples: Sequence[InflightSample],
    t0_s: float,
    hanging_ports: Sequence[int],
    healthy_ports: Mapping[str, Sequence[int]],
    load_at_t: float | None,
) -> dict[str, Any]:
    acc = account_calls(planned, calls)
    inflight = inflight_figures(samples, hanging_ports, t0_s)

    def q(xs: Sequence[float]) -> dict[str, float] | None:
        return {k: round(v, 1) for k, v in quantiles(xs, (0.5, 0.99)).items()} if xs else None

    cells = [
        {
            "wave": wave + 1,
            "owner": group,
            "host": f"127.0.0.1:{port}",
            "calls": len(acc.lateness_ms.get((group, port, wave), [])),
            "start_lateness_ms": q(acc.lateness_ms.get((group, port, wave), [])),
        }
        for wave in range(a.waves)
        for group in a.healthy_groups
        for port in healthy_ports[group]
    ]
    by_owner = [
        {
            "wave": wave + 1,
            "owner": group,
            "calls": len(merged(acc.lateness_ms, group, wave)),
            "start_lateness_ms": q(merged(acc.lateness_ms, group, wave)),
        }
        for wave in range(a.waves)
        for group in a.healthy_groups
    ]
    lost, dup = sum(acc.lost.values()), sum(acc.duplicated.values())
    failures = bar_failures(
        acc.lateness_ms, healthy_groups=a.healthy_groups, waves=a.waves, lost=lost, duplicated=dup
    )
    result: dict[str, Any] = {
        "label": a.label,
        "hanging_hosts": a.hanging,
        "runs_per_hanging": a.runs_per_hanging,
        "hang_s": a.hang_s,
        "healthy_hosts_per_owner": a.healthy,
        "healthy_owner": a.healthy_owner,
        "waves": a.waves,
        "wave_gap_s": a.wave_gap_s,
        "wave_runs": a.wave_runs,
        "processes": a.processes,
        "attempts": a.attempts,
        "settings": a.settings_env,
        "healthy": cells,
        "healthy_by_owner": by_owner,
        "hanging_calls": acc.called.get(HANGING, 0),
        "hanging_start_lateness_ms": q(merged(acc.lateness_ms, HANGING, 0)),
        "hanging_in_flight": {
            "peak": inflight.peak,
            "mean": round(inflight.mean, 1),
            "peak_by_host": {f"127.0.0.1:{p}": n for p, n in inflight.peak_by_port.items()},
            "busy_s": round(inflight.busy_s, 1),
            # (s after T, open requests), one a second
            "series": [
                [round(t, 1), n] for t, n in inflight.series[:: max(1, round(1 / SAMPLE_S))] if t >= -2
            ],
        },
        "planned": acc.planned,
        "called": acc.called,
        "lost": acc.lost,
        "duplicated": acc.duplicated,
        "unexpected_calls": acc.unexpected,
        "wrong_host_calls": acc.wrong_host,
        "bar_met": not failures,
        "bar_failures": failures,
        "load_1m": {
            "start": None,
            "at_T": round(load_at_t, 2) if load_at_t is not None else None,
            "end": None,
        },
    }
    if a.plot:
        result["plot"] = str(
            write_noisy_plot(
                OUT_DIR / f"noisy-h{a.hanging}x{a.runs_per_hanging}-{a.healthy_owner}-p{a.processes}"
                f"{'-' + a.label if a.label else ''}.png",
                title=f"{a.hanging} hosts hanging {a.hang_s:g} s × {a.runs_per_hanging} runs; "
                f"healthy: {a.healthy_owner} owner, {a.waves} waves of {a.wave_runs}; P={a.processes}",
                lateness_s={
                    f"w{wave + 1} {group}": [x / 1000 for x in merged(acc.lateness_ms, group, wave)]
                    for wave in range(a.waves)
                    for group in a.healthy_groups
                },
                bar_s=BAR_MS / 1000,
                inflight=inflight.series,
                healthy_arrivals_s={
                    f"healthy {group}": [c.arrived_ns / 1e9 - t0_s for c in calls if c.port in ports]
                    for group in a.healthy_groups
                    for ports in [set(healthy_ports[group])]
                },
            )
        )
    return result


def report(result: dict[str, Any]) -> None:
    def q(d: dict[str, float] | None) -> str:
        if d is None:
            return "no call"
        return " / ".join(f"{d[k]:.0f}" for k in ("p50", "p99", "max")) + " ms"

    inflight = result["hanging_in_flight"]
    load = result["load_1m"]
    groups = sorted(result["planned"])
    whose = {"same": "owner A", "other": "owner B", "both": "owner A and owner B"}[result["healthy_owner"]]
    rows = [
        (
            "hanging hosts",
            f"{result['hanging_hosts']} × {result['runs_per_hanging']} runs (owner A), "
            f"answering after {result['hang_s']:g} s, all due at T",
        ),
        (
            "healthy hosts",
            f"{result['healthy_hosts_per_owner']} per owner ({result['healthy_owner']}: {whose}), "
            f"{result['waves']} waves of {result['wave_runs']} runs each, {result['wave_gap_s']:g} s apart",
        ),
        ("node processes", f"{result['processes']} (all-in-one, as DUETIME_PROCESSES)"),
        ("settings", ", ".join(f"{k}={v}" for k, v in result["settings"].items()) or "defaults"),
        *(
            (
                f"wave {c['wave']} {c['host']} (owner {c['owner']}): calls, lateness p50/p99/max",
                f"{c['calls']}, {q(c['start_lateness_ms'])}",
            )
            for c in result["healthy"]
        ),
        *(
            (
                f"wave {c['wave']} owner {c['owner']}, all its healthy hosts",
                f"{c['calls']}, {q(c['start_lateness_ms'])}",
            )
            for c in result["healthy_by_owner"]
            if result["healthy_hosts_per_owner"] > 1
        ),
        (
            "hanging: runs called, lateness p50/p99/max",
            f"{result['hanging_calls']}, {q(result['hanging_start_lateness_ms'])}",
        ),
        (
            "hanging: calls in flight peak / mean",
            f"{inflight['peak']} / {inflight['mean']} (busy {inflight['busy_s']} s after T; per host peak "
            + ", ".join(str(n) for n in inflight["peak_by_host"].values())
            + ")",
        ),
        ("lost", ", ".join(f"{g} {result['lost'][g]}" for g in groups)),
        ("duplicated", ", ".join(f"{g} {result['duplicated'][g]}" for g in groups)),
        ("unexpected / wrong-host calls", f"{result['unexpected_calls']} / {result['wrong_host_calls']}"),
        ("fire lateness at the engines p50/p99/max", q(result.get("fire_lateness_ms"))),
        ("load average (1 min) start, at T, end", f"{load['start']} → {load['at_T']} → {load['end']}"),
        (
            "issue 28 bar (p99 ≤ 1 s per wave and owner, none lost or doubled)",
            "met" if result["bar_met"] else "not met: " + "; ".join(result["bar_failures"]),
        ),
        ("plot", result.get("plot", "-")),
    ]
    print_report("noisy neighbours", result, rows)


def parse_args(argv: Sequence[str] | None = None) -> NoisyArgs:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hanging", type=int, default=5, help="hanging hosts (owner A)")
    p.add_argument("--runs-per-hanging", type=int, default=1000, help="runs due at T on each hanging host")
    p.add_argument("--hang-s", type=float, default=20.0, help="how long a hanging host takes to answer")
    p.add_argument("--healthy", type=int, default=1, help="healthy hosts per owner of --healthy-owner")
    p.add_argument(
        "--healthy-owner",
        choices=("same", "other", "both"),
        default="both",
        help="the healthy hosts' owner: the hanging hosts' (A), another (B), or K hosts of each",
    )
    p.add_argument("--waves", type=int, default=2, help="waves of runs on each healthy host")
    p.add_argument("--wave-gap-s", type=float, default=5.0, help="seconds between the waves' due instants")
    p.add_argument("--wave-runs", type=int, default=500, help="runs per wave on each healthy host")
    p.add_argument("--processes", type=int, default=1, help="node processes (as DUETIME_PROCESSES)")
    p.add_argument("--set", action="append", default=[], metavar="DUETIME_X=V", help="a node setting")
    p.add_argument(
        "--lead", type=float, default=None, help="seconds from the start to T (default: lookahead + 10)"
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=300.0,
        help="a run not called this long after the last wave's due instant is lost",
    )
    p.add_argument("--attempts", type=int, default=1, help="the jobs' max_attempts")
    p.add_argument("--webhook-timeout-s", type=int, default=30, help="the jobs' target timeout_s")
    p.add_argument("--label", default="", help="a tag for the output (and the plot's file name)")
    p.add_argument("--no-plot", action="store_true")
    a = p.parse_args(argv)
    if a.hanging < 0 or a.healthy < 1 or a.waves < 1 or a.wave_runs < 1 or a.processes < 1:
        p.error("--hanging must be at least 0; --healthy, --waves, --wave-runs and --processes at least 1")
    return NoisyArgs(
        hanging=a.hanging,
        runs_per_hanging=a.runs_per_hanging,
        hang_s=a.hang_s,
        healthy=a.healthy,
        healthy_owner=a.healthy_owner,
        waves=a.waves,
        wave_gap_s=a.wave_gap_s,
        wave_runs=a.wave_runs,
        processes=a.processes,
        settings_env=dict(kv.split("=", 1) for kv in a.set),
        lead_s=a.lead,
        timeout_s=a.timeout_s,
        attempts=a.attempts,
        webhook_timeout_s=a.webhook_timeout_s,
        label=a.label,
        plot=not a.no_plot,
    )


def main(argv: Sequence[str] | None = None) -> None:
    a = parse_args(argv)
    result = uvloop.run(run_noisy(a))
    report(result)
    OUT_DIR.mkdir(exist_ok=True)
    with (OUT_DIR / "noisy-results.jsonl").open("a") as f:
        f.write(json.dumps({"at": datetime.now(UTC).isoformat(), **result}, default=str) + "\n")


if __name__ == "__main__":
    main()
