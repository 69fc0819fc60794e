"""The stage split of ``loadtest.burst --stages`` (loadtest/stages.py) on synthetic py-spy output:
the table in docs/performance.md is only as good as the mapping from frames to stages."""

from __future__ import annotations

import os

import pytest

from loadtest.burst import parse_args
from loadtest.stages import STAGES, classify, parse_frame, proc_cpu_s, split_cpu, stage_of

ROOT = (
    "<module> (<string>:1);_node_main (loadtest/burst.py:300);run (uvloop/__init__.py:92);"
    "Runner.run (asyncio/runners.py:118)"
)
LOOP = "Loop__run (loop.c:20313);Handle__run (loop.c:70935);task_step (_asynciomodule.c:2990)"


def stack(*frames: str) -> list[tuple[str, str]]:
    return [parse_frame(f) for f in (*ROOT.split(";"), *LOOP.split(";"), *frames)]


def test_a_frame_as_py_spy_writes_it() -> None:
    assert parse_frame("Engine._admit (duetime/engine/service.py:512)") == (
        "Engine._admit",
        "duetime/engine/service.py",
    )
    assert parse_frame("epoll_pwait (libc.so.6)") == ("epoll_pwait", "libc.so.6")
    assert parse_frame("0x7f7814c4524a (libc.so.6)") == ("0x7f7814c4524a", "libc.so.6")


@pytest.mark.parametrize(
    ("frames", "stage"),
    [
        # the claim loop, and the store's claim with asyncpg under it
        (
            (
                "Engine._claim_loop (duetime/engine/service.py:300)",
                "RunPathPart.claim_due (duetime/storage/postgres/runpath.py:25)",
                "Pool.fetch (asyncpg/pool.py:1)",
            ),
            "claim",
        ),
        # the admission called by the claim loop is its own stage ...
        (
            (
                "Engine._claim_loop (duetime/engine/service.py:300)",
                "Engine._admit (duetime/engine/service.py:420)",
                "pack_entry (duetime/runqueue/wire.py:90)",
            ),
            "admit",
        ),
        # ... and the wheel's insert called by the admission is the wheel's
        (
            (
                "Engine._claim_loop (duetime/engine/service.py:300)",
                "Engine._admit (duetime/engine/service.py:420)",
                "WheelDriver.insert_many (duetime/engine/wheel.py:600)",
            ),
            "wheel",
        ),
        (
            ("Engine._on_fire (duetime/engine/service.py:470)", "entry_due_ms (duetime/runqueue/wire.py:1)"),
            "wheel",
        ),
        (
            (
                "Engine._fence_loop (duetime/engine/service.py:530)",
                "RunPathPart.fence_runs (duetime/storage/postgres/runpath.py:40)",
            ),
            "fence",
        ),
        (
            (
                "WorkerPool._work (duetime/workers/pool.py:230)",
                "WorkerPool.call_redis_many (duetime/workers/pool.py:260)",
                "Delivery.of (duetime/core/runpath.py:220)",
                "RunSpec.parsed (duetime/core/runpath.py:120)",
                "spec_from_json (duetime/core/codec.py:176)",
            ),
            "deliver",
        ),
        # the worker hands its reports to the completer: that is recording
        (
            (
                "WorkerPool._work (duetime/workers/pool.py:230)",
                "Completer.add (duetime/workers/pool.py:120)",
            ),
            "record",
        ),
        (
            (
                "Completer._run (duetime/workers/pool.py:150)",
                "CompletionPart.complete_runs (duetime/storage/postgres/completion.py:103)",
                "after_attempt (duetime/core/lifecycle.py:281)",
            ),
            "record",
        ),
        # the decisions of a completion, shared with the in-memory store
        (("CompletionBatch.finish (duetime/storage/completion_rules.py:325)",), "record"),
        # cross-cutting frames nearer the leaf win over the stage
        (
            (
                "Engine._on_fire (duetime/engine/service.py:470)",
                "Histogram.observe (prometheus_client/metrics.py:600)",
            ),
            "metrics",
        ),
        (
            (
                "Completer._run (duetime/workers/pool.py:150)",
                "BatchWriter.finish (duetime/storage/postgres/completion.py:279)",
                "gc_collect_main (libpython3.11.so.1.0)",
            ),
            "gc",
        ),
        (("LeaseKeeper.beat (duetime/runqueue/leases.py:60)",), "upkeep"),
        (("_node_main.<locals>.main (loadtest/burst.py:320)", "_rss_bytes (loadtest/burst.py:190)"), "bench"),
        # the benchmark's _node_main at every stack's root is not "bench": a stack with no named
        # frame is the loop's
        ((), "loop"),
        (("data_received (asyncpg/protocol/protocol.c:1)",), "loop"),
    ],
)
def test_the_deepest_named_frame_decides(frames: tuple[str, ...], stage: str) -> None:
    assert stage_of(stack(*frames)) == stage


def test_classify_counts_samples_and_leaves_out_the_blocked_ones() -> None:
    text = "\n".join(
        [
            f"{ROOT};Engine._fence_loop (duetime/engine/service.py:530) 30",
            f"{ROOT};WorkerPool._work (duetime/workers/pool.py:230);"
            "RunSpec.parsed (duetime/core/runpath.py:120) 50",
            f"{ROOT};{LOOP};Completer._run (duetime/workers/pool.py:150);Pool.fetch (asyncpg/pool.py:1) 20",
            f"{ROOT};Loop__run (loop.c:1);uv__io_poll (linux.c:1);epoll_pwait (libc.so.6) 400",
            "not a sample line",
        ]
    )
    s = classify(text)
    assert s.total == 100
    assert s.blocked == 400
    assert s.stages == {"fence": 30, "deliver": 50, "record": 20}
    assert s.parts[("deliver", "spec_parse")] == 50
    assert s.parts[("record", "asyncpg")] == 20
    # shares of the samples times the CPU /proc measured: 2 s over 10,000 runs = 200 µs a run
    us = split_cpu(s, cpu_s=2.0, runs=10_000)
    assert us["fence"] == pytest.approx(60.0)
    assert us["deliver"] == pytest.approx(100.0)
    assert us["record"] == pytest.approx(40.0)
    assert sum(us.values()) == pytest.approx(200.0)
    assert set(STAGES) <= set(us)


def test_proc_cpu_reads_this_process() -> None:
    before = proc_cpu_s(os.getpid())
    assert before is not None
    sum(i * i for i in range(2_000_000))  # some CPU, a few tens of ms
    after = proc_cpu_s(os.getpid())
    assert after is not None and after >= before
    assert proc_cpu_s(2**22 + 12345) is None  # no such process


def test_stages_option() -> None:
    assert parse_args([]).stages == "off"
    assert parse_args(["--stages"]).stages == "native"
    assert parse_args(["--stages", "cpu"]).stages == "cpu"
