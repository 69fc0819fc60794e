"""What the label triggers cost a create: 500-row ``insert_jobs`` batches (as the API's insert
batcher writes them) with the ``job_labels`` triggers on and off, for jobs without labels and with
four, on one fresh database.

    python -m loadtest.labels_bench --batches 40

Batches alternate between the two settings so that a machine whose load changes during the run
affects both alike; prints rows/s for each and the ratio. The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from typing import Any

import asyncpg
import uvloop

from duetime.core import codec
from duetime.core.ids import new_job_id, shard_of
from duetime.core.model import JobSpec, OneOffSchedule, WebhookTarget
from duetime.storage.migrate import migrate
from duetime.storage.queries import Q
from loadtest.common import ADMIN_DSN, print_report

TRIGGERS = ("jobs_labels_added", "jobs_labels_removed", "jobs_labels_changed")


def _batch(labels: dict[str, str], n: int = 500) -> list[list[Any]]:
    now = datetime.now(UTC)
    spec = codec.spec_to_json(
        JobSpec(target=WebhookTarget(url="https://x.example/h"), schedule=OneOffSchedule(now), labels=labels)
    )
    ids = [new_job_id() for _ in range(n)]
    return [
        ids,
        [shard_of(i) for i in ids],
        ["bench"] * n,
        [json.dumps(spec)] * n,
        ["scheduled"] * n,
        [now] * n,
        [now] * n,
        [0] * n,
        [now] * n,
        [None] * n,
        [None] * n,  # the change records' key ids, reasons and diffs (migration 0018)
        [None] * n,
        [json.dumps({"": {"from": None, "to": spec}})] * n,
    ]


async def bench(batches: int) -> None:
    name = f"duetime_labels_{int(time.time())}"
    admin = await asyncpg.connect(ADMIN_DSN)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    dsn = f"{ADMIN_DSN.rpartition('/')[0]}/{name}"
    spent: dict[str, float] = {}
    try:
        await migrate(dsn)
        conn = await asyncpg.connect(dsn)
        sql = Q["insert_jobs"]
        four = {"team": "t1", "env": "prod", "tier": "std", "all": "1"}
        for i in range(batches * 4):
            labels = {} if i % 2 == 0 else four
            on = (i // 2) % 2 == 0
            key = f"{'4 labels' if labels else 'no labels'}, triggers {'on' if on else 'off'}"
            for trigger in TRIGGERS:
                await conn.execute(f"ALTER TABLE jobs {'ENABLE' if on else 'DISABLE'} TRIGGER {trigger}")
            args = _batch(labels)
            started = time.perf_counter()
            await conn.execute(sql, *args)
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - started
        await conn.close()
    finally:
        admin = await asyncpg.connect(ADMIN_DSN)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    rows_each = batches * 500
    rates = {k: round(rows_each / v) for k, v in spent.items()}
    result: dict[str, Any] = {"rows_per_s": rates, "rows_each": rows_each}
    rows = [(k, f"{v:,} rows/s") for k, v in sorted(rates.items())]
    for kind in ("no labels", "4 labels"):
        with_triggers, without = rates[f"{kind}, triggers on"], rates[f"{kind}, triggers off"]
        rows.append((f"{kind}: on / off", f"{with_triggers / without:.2f}"))
    print_report("labels_bench", result, rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=40, help="500-row batches per setting")
    uvloop.run(bench(p.parse_args().batches))


if __name__ == "__main__":
    main()
