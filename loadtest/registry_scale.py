"""Does a big registry slow the run path or the API? Claim rate and API latency at 100,000 jobs,
then at 10,000,000 (spread over a year), on the same database.

    python -m loadtest.registry_scale --large 10000000 --small 100000

Fills ``jobs`` with COPY (``storage.bulk``, in chunks, with progress) for 100 owners, one-off
jobs due uniformly over the next 365 days, each with four labels; their ``job_labels`` rows are
COPYed beside them with the label trigger off for that transaction and checked against the
trigger's on a sample of every chunk (``--trigger-fill``: the trigger writes them instead). Then
VACUUM (ANALYZE). At each size it measures:

* claim rate: ``--due`` extra jobs due within the lookahead, claimed by ``claim_due`` over the
  16 shards (batch 500) as an engine does, in claims/s;
* API latency: a real ``duetime api`` process, ``--clients`` concurrent clients, ``--requests``
  GET /v1/jobs/{id} of random existing jobs and as many POST /v1/jobs, p50/p99 in ms;
* list by label (issue 12): as many first pages (limit 100) of ``GET /v1/jobs?label=…`` for one
  owner, with selectors of four selectivities (every job carries ``team`` = one of 50, ``env`` =
  one of 3, ``tier`` = gold for 1 in 1,000, and ``all=1``), p50/p99 in ms;
* bulk pause: one ``POST /v1/jobs/bulk/pause`` of another owner's jobs by ``all=1`` (at most
  DUETIME_BULK_MAX, 10,000; at 1,000,000 jobs an owner has exactly 10,000), its time.

Prints the ratios large/small (claim rate) and small/large (latencies): 1.0 means the registry's
size costs nothing; the target is at least 0.8. Check ``df -h`` first: ten million rows are about
12 GB with their indexes, plus ``job_labels``, and the fill takes about 20 minutes of a 2-core
machine. The database is dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import uvloop

from duetime.core import codec
from duetime.core.ids import new_job_id, shard_of
from duetime.core.model import JobSpec, OneOffSchedule, WebhookTarget
from duetime.storage.bulk import (
    BulkJob,
    copy_jobs,
    copy_jobs_with_labels,
    label_rows_differ,
    seed_jobs,
    vacuum_analyze_registry,
)
from duetime.storage.migrate import migrate
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.burst import api_process
from loadtest.common import ADMIN_DSN, print_report, quantiles

OWNERS = [f"owner-{i:02d}" for i in range(100)]
TARGET = WebhookTarget(url="https://hooks.example.com/duetime")
ENVS = ("prod", "staging", "dev")


LabelRow = tuple[str, str, str, uuid.UUID]


def year_of_jobs(
    n: int, now: datetime, rng: random.Random
) -> Iterator[tuple[tuple[Any, ...], list[LabelRow]]]:
    """COPY records of ``n`` one-off jobs for 100 owners in turn, due uniformly over the next 365
    days (from two minutes ahead, so none is claimed during the measurement), each with its four
    ``job_labels`` rows (owner, key, value, job_id), the rows the label trigger makes.

    The rows ``storage.bulk.job_rows`` would make for these jobs, built from one JSON template
    instead of a ``JobSpec`` per row: ten million of those cost more time than the COPY.
    """
    labels = {"team": "@T@", "env": "@E@", "tier": "@R@", "all": "1"}
    template = json.dumps(
        codec.spec_to_json(JobSpec(target=TARGET, schedule=OneOffSchedule(now), labels=labels)),
        separators=(",", ":"),
    )
    marker = json.dumps(codec.format_time(now))
    span_s = 365 * 86400 - 120
    for i in range(n):
        at = (now + timedelta(seconds=120 + rng.random() * span_s)).replace(microsecond=0)
        job_id = new_job_id()
        owner = OWNERS[i % len(OWNERS)]
        team, env, tier = (
            f"team-{(i // 100) % 50}",
            ENVS[(i // 100) % 3],
            "gold" if i % 100_000 == 0 else "std",
        )
        spec = (
            template.replace(marker, json.dumps(codec.format_time(at)))
            .replace("@T@", team)
            .replace("@E@", env)
            .replace("@R@", tier)
        )
        row = (job_id, shard_of(job_id), owner, spec, "scheduled", at, at, 0, now, now)
        yield (
            row,
            [
                (owner, "team", team, job_id),
                (owner, "env", env, job_id),
                (owner, "tier", tier, job_id),
                (owner, "all", "1", job_id),
            ],
        )


def year_of_rows(n: int, now: datetime, rng: random.Random) -> Iterator[tuple[Any, ...]]:
    """The job rows of ``year_of_jobs`` alone (a load that lets the trigger write the labels)."""
    return (row for row, _ in year_of_jobs(n, now, rng))


async def fill(dsn: str, n: int, *, label: str, rng: random.Random, direct: bool = True) -> dict[str, Any]:
    """COPY ``n`` more jobs; returns rows per second and how the labels were written and checked.

    ``direct``: the jobs and their label rows in one COPY each per chunk, the label trigger off
    for that transaction (``storage.bulk.copy_jobs_with_labels``); each chunk's label rows of 100
    sampled jobs are then compared with what the trigger makes from their specs, and at the end
    the table's count with four per job. Otherwise the trigger writes them, as a create does.
    Then VACUUM (ANALYZE) of both tables, timed apart.
    """
    started = time.perf_counter()
    last = [started]

    def progress(done: int) -> None:
        now = time.perf_counter()
        if now - last[0] >= 10:
            last[0] = now
            rate = done / (now - started)
            eta = (n - done) / rate if rate else float("nan")
            print(
                f"  {label}: {done:,}/{n:,} rows, {rate:,.0f}/s, ~{eta:.0f} s left,"
                f" load {os.getloadavg()[0]:.1f}",
                file=sys.stderr,
                flush=True,
            )

    conn = await asyncpg.connect(dsn)
    checked = 0
    try:
        labels_before = await conn.fetchval("SELECT count(*) FROM job_labels")
        done = 0
        jobs = year_of_jobs(n, datetime.now(UTC), rng)
        while done < n:
            chunk = list(itertools.islice(jobs, 100_000))
            rows = [row for row, _ in chunk]
            if direct:
                done += await copy_jobs_with_labels(conn, rows, [lr for _, lrs in chunk for lr in lrs])
                sample = [row[0] for row in rng.sample(rows, min(100, len(rows)))]
                if differ := await label_rows_differ(conn, sample):
                    raise RuntimeError(
                        f"{differ} label rows differ from the trigger's in a sample of {len(sample)} jobs"
                    )
                checked += len(sample)
            else:
                done += await copy_jobs(conn, rows)
            progress(done)
        labels_after = await conn.fetchval("SELECT count(*) FROM job_labels")
        if labels_after - labels_before != 4 * n:
            raise RuntimeError(
                f"{labels_after - labels_before:,} label rows written for {n:,} jobs of four labels"
            )
    finally:
        await conn.close()
    copied = time.perf_counter()
    await vacuum_analyze_registry([dsn])
    finished = time.perf_counter()
    return {
        "rows_per_s": round(n / (copied - started)),
        "labels": "direct" if direct else "trigger",
        "label_rows": 4 * n,
        "label_rows_checked_jobs": checked,
        "vacuum_analyze_s": round(finished - copied, 1),
    }


async def claim_rate(dsn: str, due: int) -> float:
    """Jobs due now, claimed as an engine would: 16 shards, batches of 500."""
    await seed_jobs(
        [dsn] * 16,
        (
            BulkJob(
                OWNERS[i % len(OWNERS)], JobSpec(target=TARGET, schedule=OneOffSchedule(datetime.now(UTC)))
            )
            for i in range(due)
        ),
        datetime.now(UTC),
        return_ids=False,
    )
    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=16)
    try:
        started = time.perf_counter()

        async def shard_loop(shard: int) -> int:
            got = 0
            while True:
                rows = await store.claim_due(shard, "registry-scale", lookahead_s=60, lease_s=300, limit=500)
                got += len(rows)
                if len(rows) < 500:
                    return got

        claimed = sum(await asyncio.gather(*(shard_loop(s) for s in range(16))))
        spent = time.perf_counter() - started
    finally:
        await store.close()
    if claimed < due:
        raise RuntimeError(f"claimed {claimed} of {due} due jobs")
    return claimed / spent


async def api_latency(dsn: str, requests: int, clients: int) -> dict[str, dict[str, float]]:
    import aiohttp

    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=2)
    try:
        api_key, _ = await store.create_api_key(OWNERS[0])
    finally:
        await store.close()
    conn = await asyncpg.connect(dsn)
    try:
        # A random sample of this owner's jobs: GETs hit cold and warm pages alike.
        rows = await conn.fetch(
            "SELECT job_id FROM jobs WHERE owner = $1 ORDER BY random() LIMIT $2", OWNERS[0], requests
        )
    finally:
        await conn.close()
    ids = [str(r["job_id"]) for r in rows]
    if not ids:
        raise RuntimeError("no jobs sampled for the GETs")
    body = json.dumps(
        {"target": {"type": "webhook", "url": TARGET.url}, "schedule": {"run_at": "2030-01-01T00:00:00Z"}}
    ).encode()
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    env = {
        "DUETIME_DATABASE_URL": dsn,
        "DUETIME_API_OWNER_RATE": "0",
        "DUETIME_MAX_JOBS_PER_OWNER": "0",
        "DUETIME_MAX_JOB_BYTES_PER_OWNER": "0",
    }
    out: dict[str, dict[str, float]] = {}
    async with (
        api_process(env) as url,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as http,
    ):

        async def timed(method: str, path: str, data: bytes | None, expect: int) -> float:
            started = time.perf_counter()
            async with http.request(method, url + path, data=data, headers=headers) as resp:
                await resp.read()
                if resp.status != expect:
                    raise RuntimeError(f"{method} {path} answered {resp.status}")
            return (time.perf_counter() - started) * 1000

        for name, method, make in (
            ("GET /v1/jobs/{id}", "GET", lambda i: (f"/v1/jobs/{ids[i % len(ids)]}", None, 200)),
            ("POST /v1/jobs", "POST", lambda i: ("/v1/jobs", body, 201)),
            # List by label, first page of 100, selectors from common to rare; the plain list of
            # 100 first, as the baseline of what rendering a page costs.
            ("list (no filter)", "GET", lambda i: ("/v1/jobs", None, 200)),
            ("list label all=1", "GET", lambda i: ("/v1/jobs?label=all%3D1", None, 200)),
            ("list label env (1/3)", "GET", lambda i: (f"/v1/jobs?label=env%3D{ENVS[i % 3]}", None, 200)),
            ("list label team (1/50)", "GET", lambda i: (f"/v1/jobs?label=team%3Dteam-{i % 50}", None, 200)),
            (
                "list label team+env (1/150)",
                "GET",
                lambda i: (f"/v1/jobs?label=team%3Dteam-{i % 50}&label=env%3D{ENVS[i % 3]}", None, 200),
            ),
            ("list label tier=gold (1/1000)", "GET", lambda i: ("/v1/jobs?label=tier%3Dgold", None, 200)),
        ):
            for i in range(min(200, requests)):  # warm-up: connections, prepared statements
                await timed(method, *make(i))
            latencies = await _run_clients(timed, method, make, requests, clients)
            out[name] = {k: round(v, 2) for k, v in quantiles(latencies).items()}
    return out


SELECTORS: dict[str, dict[str, str]] = {
    "all=1": {"all": "1"},
    "env (1/3)": {"env": "prod"},
    "team (1/50)": {"team": "team-7"},
    "team+env (1/150)": {"team": "team-7", "env": "staging"},
    "tier=gold (1/1000)": {"tier": "gold"},
}


async def store_label_latency(dsn: str, requests: int) -> dict[str, dict[str, float]]:
    """The list by label in storage alone (query and decoding, no HTTP, one caller): the first
    page of 100 and a page deep in the listing (after a cursor in the middle), p50/p99 in ms."""
    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=2)
    out: dict[str, dict[str, float]] = {}
    try:
        for name, labels in SELECTORS.items():
            first = await store.list_jobs(OWNERS[0], state=None, limit=100, cursor=None, labels=labels)
            cursors: list[str | None] = [None, first.next_cursor]
            spent: list[float] = []
            for i in range(requests):
                started = time.perf_counter()
                await store.list_jobs(OWNERS[0], state=None, limit=100, cursor=cursors[i % 2], labels=labels)
                spent.append((time.perf_counter() - started) * 1000)
            out[name] = {k: round(v, 2) for k, v in quantiles(spent).items()}
    finally:
        await store.close()
    return out


async def bulk_pause(dsn: str, owner: str) -> dict[str, Any]:
    """One bulk pause of ``owner``'s jobs by ``all=1`` through a real API process, timed."""
    import aiohttp

    store = await PostgresStore.open(ShardMap.single(dsn), pool_size=2)
    try:
        api_key, _ = await store.create_api_key(owner)
    finally:
        await store.close()
    headers = {"Authorization": f"Bearer {api_key}"}
    env = {"DUETIME_DATABASE_URL": dsn, "DUETIME_API_OWNER_RATE": "0"}
    async with api_process(env) as url, aiohttp.ClientSession() as http:
        started = time.perf_counter()
        async with http.post(
            url + "/v1/jobs/bulk/pause", json={"labels": {"all": "1"}}, headers=headers
        ) as resp:
            answer = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"bulk pause answered {resp.status}: {answer}")
        spent = time.perf_counter() - started
    return {"seconds": round(spent, 2), **answer, "jobs_per_s": round(answer["changed"] / spent)}


async def _run_clients(timed: Any, method: str, make: Any, requests: int, clients: int) -> list[float]:
    """``requests`` calls shared by ``clients`` concurrent loops; each call's latency in ms."""
    latencies: list[float] = []
    nxt = [0]

    async def client() -> None:
        while nxt[0] < requests:
            i = nxt[0]
            nxt[0] += 1
            latencies.append(await timed(method, *make(i)))

    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies


async def measure(dsn: str, label: str, due: int, requests: int, clients: int) -> dict[str, Any]:
    load_before = os.getloadavg()
    rate = await claim_rate(dsn, due)
    api = await api_latency(dsn, requests, clients)
    bulk = await bulk_pause(dsn, OWNERS[1] if label == "small" else OWNERS[2])
    in_store = await store_label_latency(dsn, min(requests, 500))
    conn = await asyncpg.connect(dsn)
    try:
        count = await conn.fetchval("SELECT count(*) FROM jobs")
        size = await conn.fetchval("SELECT pg_total_relation_size('jobs')")
    finally:
        await conn.close()
    load = {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]}
    print(
        f"  {label}: {count:,} rows, claims {rate:,.0f}/s, api {api}, bulk {bulk}, load {load}",
        file=sys.stderr,
        flush=True,
    )
    return {
        "rows": count,
        "jobs_bytes": size,
        "claims_per_s": round(rate),
        "api_ms": api,
        "bulk_pause": bulk,
        "store_label_list_ms": in_store,
        "load_average": load,
    }


async def bench(
    small: int, large: int, *, due: int, requests: int, clients: int, keep: bool, direct: bool
) -> None:
    rng = random.Random(20261201)
    name = f"duetime_registry_{int(time.time())}"
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = f"{ADMIN_DSN.rpartition('/')[0]}/{name}"
    try:
        await migrate(dsn)
        fill_small = await fill(dsn, small, label="small fill", rng=rng, direct=direct)
        at_small = await measure(dsn, "small", due, requests, clients)
        fill_large = await fill(dsn, large - at_small["rows"], label="large fill", rng=rng, direct=direct)
        at_large = await measure(dsn, "large", due, requests, clients)
    finally:
        if not keep:
            admin = await asyncpg.connect(ADMIN_DSN)
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await admin.close()

    def ratio(a: float, b: float) -> float:
        return round(a / b, 3) if b else float("nan")

    ratios = {
        "claims": ratio(at_large["claims_per_s"], at_small["claims_per_s"]),
        **{
            f"{ep} {q}": ratio(at_small["api_ms"][ep][q], at_large["api_ms"][ep][q])
            for ep in at_small["api_ms"]
            for q in ("p50", "p99")
        },
    }
    result: dict[str, Any] = {
        "small": at_small,
        "large": at_large,
        "fill": {"small": fill_small, "large": fill_large},
        "ratios": ratios,
        "target_ratio": 0.8,
        "met": all(v >= 0.8 for v in ratios.values()),
        "database": name if keep else None,
    }
    rows = [
        ("rows", f"{at_small['rows']:,} → {at_large['rows']:,}"),
        (
            "jobs table + indexes",
            f"{at_small['jobs_bytes'] / 2**20:,.0f} MB → {at_large['jobs_bytes'] / 2**30:,.1f} GB",
        ),
        (
            "fill (COPY, labels " + fill_large["labels"] + ")",
            f"{fill_large['rows_per_s']:,} rows/s, then VACUUM (ANALYZE) {fill_large['vacuum_analyze_s']} s",
        ),
        (
            "claims/s",
            f"{at_small['claims_per_s']:,} → {at_large['claims_per_s']:,} (ratio {ratios['claims']})",
        ),
    ]
    for ep in at_small["api_ms"]:
        s, lg = at_small["api_ms"][ep], at_large["api_ms"][ep]
        rows.append(
            (
                f"{ep} p50 / p99",
                f"{s['p50']:.1f} / {s['p99']:.1f} ms → {lg['p50']:.1f} / {lg['p99']:.1f} ms "
                f"(ratios {ratios[ep + ' p50']} / {ratios[ep + ' p99']})",
            )
        )
    for sel in SELECTORS:
        s_, lg = at_small["store_label_list_ms"][sel], at_large["store_label_list_ms"][sel]
        rows.append(
            (
                f"store list label {sel} p50 / p99",
                f"{s_['p50']:.1f} / {s_['p99']:.1f} ms → {lg['p50']:.1f} / {lg['p99']:.1f} ms",
            )
        )
    for size in ("small", "large"):
        b = result[size]["bulk_pause"]
        rows.append((f"bulk pause at {result[size]['rows']:,}", f"{b['changed']:,} jobs in {b['seconds']} s"))
    for size in ("small", "large"):
        la = result[size]["load_average"]
        rows.append((f"load average (1/5/15 min) at {size}", f"{la['before']} → {la['after']}"))
    rows.append(("target: every ratio ≥ 0.8", "met" if result["met"] else "NOT met"))
    print_report("registry_scale", result, rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", type=int, default=100_000)
    p.add_argument("--large", type=int, default=10_000_000)
    p.add_argument("--due", type=int, default=20_000, help="jobs due now, claimed at each size")
    p.add_argument("--requests", type=int, default=2000, help="GETs and POSTs at each size")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--keep", action="store_true", help="keep the database (and say its name)")
    p.add_argument(
        "--trigger-fill",
        action="store_true",
        help="let the label trigger write job_labels during the fill (as creates do), not the loader",
    )
    a = p.parse_args()
    uvloop.run(
        bench(
            a.small,
            a.large,
            due=a.due,
            requests=a.requests,
            clients=a.clients,
            keep=a.keep,
            direct=not a.trigger_fill,
        )
    )


if __name__ == "__main__":
    main()
