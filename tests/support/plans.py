"""Query plans as they ran, for the tests that hold a statement's plan shape (EXPLAIN ANALYZE)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, the root first."""
    yield node
    for child in node.get("Plans", ()):
        yield from plan_nodes(child)


async def analyzed(conn: asyncpg.Connection, sql: str, *args: Any) -> list[list[dict[str, Any]]]:
    """The plan nodes of ``sql`` as it ran (EXPLAIN ANALYZE), its writes rolled back: planned for
    these values, and as the generic plan a prepared statement may switch to after five runs."""
    out = []
    for mode in ("force_custom_plan", "force_generic_plan"):
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
            [plan] = json.loads(await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, *args))
        finally:
            await tx.rollback()
        out.append(list(plan_nodes(plan["Plan"])))
    return out
