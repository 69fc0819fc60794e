"""The run path's per-run codec work alone: a stored spec's decode and a time's spelling, old and new.

A burst's CPU per run moves by ±15 % from one run to the next on a shared 2-core machine, more
than either change below is worth, so each is also timed here, in one process, alternating the
two forms round by round, and the best round of each is kept (the machine's other work only ever
adds time):

* ``spec decode``: ``codec.spec_from_json(json.loads(text))`` (the reference) against
  ``spectext.spec_from_text(text)`` (msgspec), for the burst's spec (a Redis target, a one-off)
  and a webhook/cron spec with labels and a payload;
* ``format_time``: the spelling itself (``_format_utc.__wrapped__``: what every call cost before)
  against ``format_time`` as a run sees it: one ``scheduled_for`` shared by the burst, a
  ``started_at``/``finished_at`` shared by a batch of 500 (hits), and a time of its own (misses).

Usage: ``python -m loadtest.codec_bench [--n 20000] [--rounds 7]``. Prints one JSON line and a
table, µs per call.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from duetime.core import codec
from duetime.core.model import (
    Broker,
    CronSchedule,
    JobSpec,
    OneOffSchedule,
    QueueTarget,
    RetryPolicy,
    WebhookTarget,
)
from duetime.core.spectext import spec_from_text


def _best_us(fn: Callable[[], object], n: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - started)
    return best / n * 1e6


def _specs() -> dict[str, str]:
    burst = JobSpec(
        target=QueueTarget(Broker.REDIS, "bench"),
        schedule=OneOffSchedule(datetime(2026, 12, 2, tzinfo=UTC)),
        retry=RetryPolicy(max_attempts=1),
    )
    webhook = JobSpec(
        target=WebhookTarget(url="https://hooks.example.com/nightly", headers={"x-team": "billing"}),
        schedule=CronSchedule("0 0 * * *", timezone="Europe/Berlin"),
        name="billing/nightly-invoices",
        labels={"team": "billing", "tier": "gold"},
        payload={"report": "invoices", "days": 1, "notify": ["ops@example.com"]},
    )
    return {
        name: json.dumps(codec.spec_to_json(spec), separators=(",", ":"))
        for name, spec in (("burst (redis, one-off)", burst), ("webhook, cron, labels, payload", webhook))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per form; the best is kept")
    a = parser.parse_args()

    rows: list[dict[str, object]] = []
    for name, text in _specs().items():
        assert spec_from_text(text) == codec.spec_from_json(json.loads(text))
        before = _best_us(lambda t=text: codec.spec_from_json(json.loads(t)), a.n, a.rounds)  # type: ignore[misc]
        after = _best_us(lambda t=text: spec_from_text(t), a.n, a.rounds)  # type: ignore[misc]
        rows.append({"what": f"spec decode: {name}", "before_us": before, "after_us": after})

    spell = codec._format_utc.__wrapped__  # the spelling without the memo: every call before
    due = datetime(2026, 12, 2, tzinfo=UTC)
    started = due + timedelta(seconds=3, microseconds=141593)
    own = [due + timedelta(microseconds=7 * i + 1) for i in range(a.n)]
    it = iter(own * (a.rounds * 2 + 2))
    rows.append(
        {
            "what": "format_time: a time the batch shares (hit)",
            "before_us": _best_us(lambda: spell(started), a.n, a.rounds),
            "after_us": _best_us(lambda: codec.format_time(started), a.n, a.rounds),
        }
    )
    rows.append(
        {
            "what": "format_time: a time of its own (miss)",
            "before_us": _best_us(lambda: spell(next(it)), a.n, a.rounds),
            "after_us": _best_us(lambda: codec.format_time(next(it)), a.n, a.rounds),
        }
    )
    for row in rows:
        row["before_us"] = round(float(row["before_us"]), 2)  # type: ignore[arg-type]
        row["after_us"] = round(float(row["after_us"]), 2)  # type: ignore[arg-type]
    load = os.getloadavg()[0]
    print(json.dumps({"benchmark": "codec", "n": a.n, "rounds": a.rounds, "load_1m": load, "rows": rows}))
    print(f"\nrun path codec, µs per call (best of {a.rounds} rounds of {a.n}; load {load:.2f})")
    print(f"{'what':<52} {'before':>8} {'after':>8} {'ratio':>6}")
    for row in rows:
        b, f = float(row["before_us"]), float(row["after_us"])  # type: ignore[arg-type]
        print(f"{row['what']:<52} {b:>8.2f} {f:>8.2f} {b / f:>5.1f}x")


if __name__ == "__main__":
    main()
