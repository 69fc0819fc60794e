"""The misfire rule in the database is the one in Python: ``core.misfire.MISSED_SQL`` (which the
claim statements carry verbatim, see tests/unit/test_states.py) and ``core.misfire.missed`` agree
on every row of a grid around each of the rule's edges, at the database's own clock."""

from __future__ import annotations

import itertools
import json
import uuid
from datetime import timedelta

import asyncpg

from duetime.core import misfire


async def test_the_sql_and_the_python_rule_agree_row_by_row(pg_dsn: str) -> None:
    conn = await asyncpg.connect(pg_dsn)
    try:
        async with conn.transaction():  # one transaction: now() is one instant for every row
            now = await conn.fetchval("SELECT now()")
            rows = []
            for kind, attempt, parent, grace, late_s in itertools.product(
                ("scheduled", "manual"),
                (0, 1),
                (None, uuid.uuid4()),
                (0, 60),
                (-5.0, 0.0, 59.999, 60.0, 60.001, 3600.0),
            ):
                rows.append((kind, attempt, parent, now - timedelta(seconds=late_s), grace))
            got = await conn.fetch(
                f"""SELECT i, {misfire.MISSED_SQL} AS missed
                    FROM unnest($1::int[], $2::text[], $3::int[], $4::uuid[], $5::timestamptz[], $6::jsonb[])
                         AS j(i, run_kind, attempt, parent_id, next_run_at, spec)""",
                list(range(len(rows))),
                [r[0] for r in rows],
                [r[1] for r in rows],
                [r[2] for r in rows],
                [r[3] for r in rows],
                [json.dumps({"misfire_grace_s": r[4]}) for r in rows],
            )
    finally:
        await conn.close()
    in_sql = {r["i"]: r["missed"] for r in got}
    in_python = {
        i: misfire.missed(
            run_kind=kind, attempt=attempt, parent_id=parent, next_run_at=due, grace_s=grace, now=now
        )
        for i, (kind, attempt, parent, due, grace) in enumerate(rows)
    }
    assert in_sql == in_python
    assert sum(in_python.values()) == 4 + 2  # grace 0: four lateness values past it; grace 60: two
