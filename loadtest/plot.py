"""PNG plots of a burst: starts and completions per second against time, and the start lateness
distribution. Drawn with matplotlib's Agg backend (no display), small enough to commit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def per_second(instants_s: Sequence[float], origin_s: float) -> dict[int, int]:
    """Counts per whole second relative to ``origin_s`` (second 0 is [origin, origin + 1))."""
    out: dict[int, int] = {}
    for t in instants_s:
        k = int((t - origin_s) // 1)
        out[k] = out.get(k, 0) + 1
    return out


def cumulative_to_rate(samples: Sequence[tuple[float, float]], origin_s: float) -> dict[int, float]:
    """A per-second rate from samples of a running total ``(instant, total)`` (summed over
    processes by the caller beforehand or after: rates add)."""
    out: dict[int, float] = {}
    prev_t: float | None = None
    prev_v = 0.0
    for t, v in sorted(samples):
        if prev_t is not None and v > prev_v:
            k = int((t - origin_s) // 1)
            out[k] = out.get(k, 0.0) + (v - prev_v)
        prev_t, prev_v = t, v
    return out


def write_burst_plot(
    path: Path,
    *,
    title: str,
    starts_per_s: Mapping[int, float],
    completions_per_s: Mapping[int, float],
    claims_per_s: Mapping[int, float] | None,
    lateness_ms: Sequence[float],
) -> Path:
    """Two panels: rates against seconds from T; the lateness histogram (log-scaled counts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rates, late) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=80)
    for label, series, style in (
        ("claims/s", claims_per_s or {}, ":"),
        ("starts/s", starts_per_s, "-"),
        ("completions/s", completions_per_s, "--"),
    ):
        if not series:
            continue
        xs = sorted(series)
        rates.plot(xs, [series[x] for x in xs], style, label=label, drawstyle="steps-post")
    rates.axvline(0, color="grey", linewidth=0.8)
    rates.set_xlabel("seconds from T (the due instant)")
    rates.set_ylabel("per second")
    rates.legend(fontsize=8)
    rates.set_title(title, fontsize=9)
    if lateness_ms:
        late.hist([x / 1000.0 for x in lateness_ms], bins=60, log=True)
    late.set_xlabel("start lateness (s)")
    late.set_ylabel("runs")
    late.set_title("start lateness at the target", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_memory_plot(
    path: Path,
    *,
    title: str,
    t_due_s: float,
    drained_s: float,
    nodes: Sequence[Sequence[Any]],
) -> Path:
    """Node memory against seconds from T, one colour per node: RSS (solid), the allocator's
    bytes in use (dashed) and tracemalloc's (dotted, when traced) on the left axis; the runs
    held by the lease keeper (fenced, not recorded) and waiting in the wheel on the right.
    ``nodes`` are ``loadtest.burst.MemorySample`` lists."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mb = 2**20
    fig, (mem, runs) = plt.subplots(2, 1, figsize=(10, 5.4), dpi=80, sharex=True)
    for i, samples in enumerate(nodes):
        if not samples:
            continue
        colour = f"C{i}"
        xs = [m.t - t_due_s for m in samples]
        mem.plot(xs, [m.rss / mb for m in samples], "-", color=colour, label=f"node-{i} RSS")
        if samples[0].in_use is not None:
            mem.plot(
                xs, [m.in_use / mb for m in samples], "--", color=colour, label=f"node-{i} malloc in use"
            )
        if samples[0].traced is not None:
            mem.plot(xs, [m.traced / mb for m in samples], ":", color=colour, label=f"node-{i} tracemalloc")
        runs.plot(xs, [m.held for m in samples], "-", color=colour, label=f"node-{i} fenced, not recorded")
        runs.plot(xs, [m.wheel for m in samples], ":", color=colour, label=f"node-{i} in the wheel")
    for ax in (mem, runs):
        ax.axvline(0, color="grey", linewidth=0.8)
        ax.axvline(drained_s, color="grey", linewidth=0.8, linestyle="--")
        ax.legend(fontsize=7, loc="upper right")
    mem.set_ylabel("MB")
    mem.set_title(title + " (T, and the last outcome: grey lines)", fontsize=9)
    runs.set_ylabel("runs")
    runs.set_xlabel("seconds from T (the due instant)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_noisy_plot(
    path: Path,
    *,
    title: str,
    lateness_s: Mapping[str, Sequence[float]],
    bar_s: float,
    inflight: Sequence[tuple[float, int]],
    healthy_arrivals_s: Mapping[str, Sequence[float]],
) -> Path:
    """Two panels for ``loadtest.noisy_neighbours``: the healthy hosts' start lateness per wave and
    owner (boxes: quartiles, whiskers: p1 and p99, log scale, the bar as a red line); and against
    seconds from T, the hanging hosts' calls in flight (left axis) with the healthy hosts' calls
    per second (right axis), which shows whether the healthy ones wait for the hanging ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (late, time_ax) = plt.subplots(1, 2, figsize=(11, 3.8), dpi=80)
    labels = [k for k, v in lateness_s.items() if v]
    if labels:
        late.boxplot(
            [[max(x, 0.001) for x in lateness_s[k]] for k in labels],
            whis=(1, 99),
            showfliers=True,
            flierprops={"markersize": 2},
        )
        late.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
        late.set_yscale("log")
    late.axhline(bar_s, color="red", linewidth=0.8)
    late.set_ylabel("start lateness (s)")
    late.set_title("healthy hosts: lateness per wave and owner", fontsize=9)
    shown = [(t, n) for t, n in inflight if t >= -2.0]
    if shown:
        time_ax.plot(
            [t for t, _ in shown], [n for _, n in shown], "-", color="grey", label="hanging in flight"
        )
    time_ax.set_xlabel("seconds from T (the first wave's due instant)")
    time_ax.set_ylabel("hanging hosts' calls in flight")
    time_ax.axvline(0, color="grey", linewidth=0.8)
    rates = time_ax.twinx()
    for i, (label, arrivals) in enumerate(healthy_arrivals_s.items()):
        series = per_second(arrivals, 0.0)
        if not series:
            continue
        xs = list(range(min(*series, 0), max(series) + 2))  # the quiet seconds too, as zeros
        rates.plot(
            xs,
            [series.get(x, 0) for x in xs],
            color=f"C{i}",
            linestyle=("-", "--", ":", "-.")[i % 4],
            drawstyle="steps-post",
            label=f"{label} calls/s",
        )
    rates.set_ylim(bottom=0)
    rates.set_ylabel("healthy calls per second")
    handles = time_ax.get_legend_handles_labels()[0] + rates.get_legend_handles_labels()[0]
    names = time_ax.get_legend_handles_labels()[1] + rates.get_legend_handles_labels()[1]
    time_ax.legend(handles, names, fontsize=7, loc="upper right")
    time_ax.set_title(title, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
