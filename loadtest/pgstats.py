"""Where the database's time goes in a burst, per named statement and per index (``--pg-statements``).

Reads ``pg_stat_statements`` (the server must load it: ``shared_preload_libraries =
'pg_stat_statements'``, ideally with ``track_io_timing = on``) for the scratch database only, and
maps each statement's text back to its name in ``storage/sql/*.sql`` (the text the store sends is
the named statement itself, so pg_stat_statements groups it under one query id). Per index of
``jobs`` and ``runs`` it also reads the index entries on the leaf pages before and after
(``pageinspect``; the net growth, a lower bound of the entries written: a btree's bottom-up
deletion removes dead ones on the way) and the index buffers touched (``pg_statio_user_indexes``).

The server at ``DUETIME_BENCH_PG`` must be one the benchmark may reset statistics on: a private
one (docs/performance.md says how to start it), never a shared production server.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

import asyncpg

from duetime.storage.queries import Q

_SPACE = re.compile(r"\s+")
# pg_stat_statements shows every constant as a parameter ($7): both texts are compared with
# parameters, string literals and numbers all made "?", and inline comments dropped.
_COMMENT = re.compile(r"--[^\n]*")
_CONSTANT = re.compile(r"\$\d+|'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b")


def _norm(sql: str) -> str:
    text = _CONSTANT.sub("?", _COMMENT.sub("", sql))
    return _SPACE.sub(" ", text).strip().rstrip(";").strip()


_BY_TEXT: dict[str, str] = {_norm(sql): name for name, sql in Q.items()}


def statement_name(query: str) -> str:
    """The name of a statement of storage/sql, or its first 60 characters when it has none."""
    text = _norm(query)
    name = _BY_TEXT.get(text)
    if name is not None:
        return name
    for known, n in _BY_TEXT.items():
        if text.startswith(known[:200]) and len(known) >= 40:
            return n
    return "? " + text[:60]


@dataclass
class IndexState:
    entries: dict[str, int]
    blks: dict[str, int]
    size: dict[str, int]


_INDEXES = """
SELECT c.relname AS index, t.relname AS tbl, pg_relation_size(c.oid) AS size,
       COALESCE(s.idx_blks_hit, 0) + COALESCE(s.idx_blks_read, 0) AS blks
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
LEFT JOIN pg_statio_user_indexes s ON s.indexrelid = i.indexrelid
WHERE t.relname IN ('jobs', 'runs')
"""

_ENTRIES = """
SELECT COALESCE(sum(st.live_items + st.dead_items), 0)::bigint
FROM generate_series(1, (pg_relation_size($1::regclass) / 8192)::int - 1) AS p,
     LATERAL bt_page_stats($1::text, p) AS st
WHERE st.type = 'l'
"""


async def index_state(dsn: str) -> IndexState:
    conn = await asyncpg.connect(dsn)
    try:
        with contextlib.suppress(asyncpg.PostgresError):
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        rows = await conn.fetch(_INDEXES)
        entries: dict[str, int] = {}
        for r in rows:
            with contextlib.suppress(asyncpg.PostgresError):
                entries[r["index"]] = await conn.fetchval(_ENTRIES, r["index"])
        return IndexState(
            entries=entries,
            blks={r["index"]: r["blks"] for r in rows},
            size={r["index"]: r["size"] for r in rows},
        )
    finally:
        await conn.close()


async def reset_statements(admin_dsn: str) -> bool:
    """Resets pg_stat_statements; False when the server does not load it."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.execute("SELECT pg_stat_statements_reset()")
        return True
    except asyncpg.PostgresError:
        return False
    finally:
        await conn.close()


_STATEMENTS = """
SELECT s.query, s.calls, s.total_exec_time, s.total_plan_time, s.plans, s.rows,
       s.shared_blks_hit, s.shared_blks_read, s.shared_blks_dirtied, s.wal_bytes, s.wal_records
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = $1
"""


async def statements(admin_dsn: str, database: str, runs: int) -> list[dict[str, Any]]:
    """Per statement name: calls, rows, time, buffers and WAL, the largest total time first."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        rows = await conn.fetch(_STATEMENTS, database)
    finally:
        await conn.close()
    by: dict[str, dict[str, float]] = {}
    keys = ("calls", "exec_ms", "plan_ms", "plans", "rows", "blks", "dirtied", "wal")
    for r in rows:
        name = statement_name(r["query"])
        acc = by.setdefault(name, dict.fromkeys(keys, 0.0))
        acc["calls"] += r["calls"]
        acc["exec_ms"] += r["total_exec_time"]
        acc["plan_ms"] += r["total_plan_time"]
        acc["plans"] += r["plans"]
        acc["rows"] += r["rows"]
        acc["blks"] += r["shared_blks_hit"] + r["shared_blks_read"]
        acc["dirtied"] += r["shared_blks_dirtied"]
        acc["wal"] += float(r["wal_bytes"])
    n = max(runs, 1)
    out: list[dict[str, Any]] = []
    for name, acc in by.items():
        calls = max(acc["calls"], 1)
        out.append(
            {
                "name": name,
                "calls": int(acc["calls"]),
                "rows": int(acc["rows"]),
                "exec_us_per_run": round(acc["exec_ms"] * 1000 / n, 1),
                "plan_us_per_run": round(acc["plan_ms"] * 1000 / n, 1),
                "mean_exec_ms": round(acc["exec_ms"] / calls, 2),
                "plans": int(acc["plans"]),
                "blks_per_run": round(acc["blks"] / n, 2),
                "dirtied_per_run": round(acc["dirtied"] / n, 3),
                "wal_bytes_per_run": round(acc["wal"] / n),
            }
        )
    out.sort(key=lambda s: -(s["exec_us_per_run"] + s["plan_us_per_run"]))
    return out


def index_growth(before: IndexState, after: IndexState, runs: int) -> list[dict[str, Any]]:
    n = max(runs, 1)
    out = []
    for index in sorted(after.size):
        out.append(
            {
                "index": index,
                "entries_per_run": round((after.entries.get(index, 0) - before.entries.get(index, 0)) / n, 2),
                "blks_per_run": round((after.blks.get(index, 0) - before.blks.get(index, 0)) / n, 2),
                "bytes_per_run": round((after.size[index] - before.size.get(index, 0)) / n),
            }
        )
    return out


def report_rows(stats: dict[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for s in stats.get("statements", [])[:14]:
        rows.append(
            (
                f"  sql {s['name'][:34]}",
                f"{s['exec_us_per_run']} µs/run exec + {s['plan_us_per_run']} plan, {s['calls']} calls, "
                f"{s['mean_exec_ms']} ms each, {s['rows']} rows, {s['blks_per_run']} blks/run, "
                f"WAL {s['wal_bytes_per_run']} B/run",
            )
        )
    growth = [g for g in stats.get("indexes", []) if g["entries_per_run"] or g["blks_per_run"]]
    for g in growth:
        rows.append(
            (
                f"  index {g['index']}",
                f"net {g['entries_per_run']:+} entries/run, {g['blks_per_run']} blks/run, "
                f"+{g['bytes_per_run']} B/run",
            )
        )
    return rows
