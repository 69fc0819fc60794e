"""Retention at work: how fast the maintenance service deletes, and what it costs a burst.

    python -m loadtest.retention_bench --days 7 --keep-days 2

Fills ``runs`` with COPY as an every-second cron would over ``--days`` days (86,400 rows a day,
one job), plus ``--finished`` finished jobs older than the retention with ``--runs-per-job``
history rows each. Then:

* table and index size of ``runs`` after the fill;
* the writer alone: ``--burst`` history rows written as completions write them (multi-row
  INSERT … unnest, 500 per statement, ``--writers`` concurrent writers), rows/s;
* the same burst while ``RetentionService`` deletes everything older than ``--keep-days`` days
  (batch ``--batch``, no pause): the burst's rows/s beside it, and the service's rows/s;
* sizes again after the deletes, and after ``VACUUM (ANALYZE) runs`` (what autovacuum would do).

The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import uvloop

from duetime.core.ids import new_job_id, shard_of
from duetime.engine.retention import RetentionConfig, RetentionService
from duetime.storage.bulk import RUN_COLUMNS
from duetime.storage.migrate import migrate
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.common import ADMIN_DSN, print_report

SPEC = json.dumps(
    {"target": {"type": "queue", "broker": "nats", "topic": "t"}, "schedule": {"cron": "* * * * * *"}}
)


def _history(job_id: uuid.UUID, start: datetime, seconds: int) -> Iterator[tuple[Any, ...]]:
    shard = shard_of(job_id)
    for i in range(seconds):
        at = start + timedelta(seconds=i)
        yield (job_id, shard, at, 1, at, at + timedelta(milliseconds=40), "succeeded", 3)


async def _sizes(conn: asyncpg.Connection) -> dict[str, int]:
    row = await conn.fetchrow(
        "SELECT pg_relation_size('runs') AS heap, pg_indexes_size('runs') AS indexes, count(*) AS rows"
        " FROM runs"
    )
    return {"rows": row["rows"], "heap_mb": row["heap"] // 2**20, "indexes_mb": row["indexes"] // 2**20}


async def _burst(dsn: str, job_id: uuid.UUID, rows: int, writers: int) -> float:
    """``rows`` young history rows in 500-row statements from ``writers`` connections; rows/s."""
    now = datetime.now(UTC)
    per = rows // writers
    conns = [await asyncpg.connect(dsn) for _ in range(writers)]
    sql = (
        "INSERT INTO runs (job_id, shard, scheduled_for, attempt, started_at, finished_at, outcome)"
        " SELECT * FROM unnest($1::uuid[], $2::smallint[], $3::timestamptz[], $4::int[],"
        " $5::timestamptz[], $6::timestamptz[], $7::text[])"
    )

    async def one(conn: asyncpg.Connection) -> None:
        for start in range(0, per, 500):
            n = min(500, per - start)
            await conn.execute(
                sql,
                [job_id] * n,
                [shard_of(job_id)] * n,
                [now] * n,
                [1] * n,
                [now] * n,
                [now] * n,
                ["succeeded"] * n,
            )

    try:
        started = time.perf_counter()
        await asyncio.gather(*(one(c) for c in conns))
        return per * writers / (time.perf_counter() - started)
    finally:
        for c in conns:
            await c.close()


async def bench(args: argparse.Namespace) -> None:
    name = f"duetime_retention_{int(time.time())}"
    admin = await asyncpg.connect(ADMIN_DSN)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    dsn = f"{ADMIN_DSN.rpartition('/')[0]}/{name}"
    result: dict[str, Any] = {}
    try:
        await migrate(dsn)
        conn = await asyncpg.connect(dsn)
        now = datetime.now(UTC)
        cron = new_job_id()
        await conn.execute(
            "INSERT INTO jobs (job_id, shard, owner, spec, state)"
            " VALUES ($1, $2, 'bench', $3::jsonb, 'scheduled')",
            cron,
            shard_of(cron),
            SPEC,
        )
        started = time.perf_counter()
        seconds = args.days * 86_400
        await conn.copy_records_to_table(
            "runs", records=_history(cron, now - timedelta(seconds=seconds), seconds), columns=RUN_COLUMNS
        )
        old = now - timedelta(days=args.keep_days + 1)
        for _ in range(args.finished):
            job = new_job_id()
            await conn.execute(
                "INSERT INTO jobs (job_id, shard, owner, spec, state, updated_at)"
                " VALUES ($1, $2, 'bench', $3::jsonb, 'completed', $4)",
                job,
                shard_of(job),
                SPEC,
                old,
            )
            await conn.copy_records_to_table(
                "runs",
                records=_history(job, old - timedelta(hours=1), args.runs_per_job),
                columns=RUN_COLUMNS,
            )
        await conn.execute("ANALYZE runs")
        result["fill_s"] = round(time.perf_counter() - started, 1)
        result["after_fill"] = await _sizes(conn)
        result["burst_alone_rows_per_s"] = round(await _burst(dsn, cron, args.burst, args.writers))

        store = await PostgresStore.open(ShardMap.single(dsn), pool_size=4)
        service = RetentionService(
            store,
            RetentionConfig(
                run_retention_s=args.keep_days * 86_400,
                finished_job_retention_s=args.keep_days * 86_400,
                batch=args.batch,
                pause_s=0.0,
            ),
        )
        try:
            started = time.perf_counter()
            sweep = asyncio.create_task(service.run_round())
            beside = await _burst(dsn, cron, args.burst, args.writers)
            report = await sweep
            spent = time.perf_counter() - started
        finally:
            await store.close()
        result["burst_beside_retention_rows_per_s"] = round(beside)
        result["retention"] = {
            "runs_deleted": report.runs,
            "jobs_deleted": report.jobs,
            "seconds": round(spent, 1),
            "rows_per_s": round(report.runs / spent),
            "batch": args.batch,
        }
        result["after_delete"] = await _sizes(conn)
        await conn.execute("VACUUM (ANALYZE) runs")
        result["after_vacuum"] = await _sizes(conn)
        await conn.close()
    finally:
        admin = await asyncpg.connect(ADMIN_DSN)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    r = result
    rows = [
        (
            "history after the fill",
            f"{r['after_fill']['rows']:,} rows, heap {r['after_fill']['heap_mb']} MB, "
            f"indexes {r['after_fill']['indexes_mb']} MB",
        ),
        (
            "retention",
            f"{r['retention']['runs_deleted']:,} rows and {r['retention']['jobs_deleted']} jobs in "
            f"{r['retention']['seconds']} s = {r['retention']['rows_per_s']:,} rows/s (batch {args.batch})",
        ),
        ("history writes alone", f"{r['burst_alone_rows_per_s']:,} rows/s"),
        ("history writes beside retention", f"{r['burst_beside_retention_rows_per_s']:,} rows/s"),
        ("after the deletes", f"{r['after_delete']['rows']:,} rows, heap {r['after_delete']['heap_mb']} MB"),
        (
            "after VACUUM",
            f"heap {r['after_vacuum']['heap_mb']} MB, indexes {r['after_vacuum']['indexes_mb']} MB",
        ),
    ]
    print_report("retention_bench", result, rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--days", type=int, default=7, help="days of an every-second cron's history")
    p.add_argument("--keep-days", type=int, default=2, help="the retention, in days")
    p.add_argument("--finished", type=int, default=200, help="finished jobs older than the retention")
    p.add_argument("--runs-per-job", type=int, default=50)
    p.add_argument("--burst", type=int, default=100_000, help="history rows written as a burst would")
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--batch", type=int, default=1000)
    uvloop.run(bench(p.parse_args()))


if __name__ == "__main__":
    main()
