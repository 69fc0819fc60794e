"""The burst's per-statement report finds each named statement in pg_stat_statements' text."""

from __future__ import annotations

import re

from duetime.storage.queries import Q
from loadtest.pgstats import statement_name


def _as_pg_stat_statements_shows_it(sql: str) -> str:
    """pg_stat_statements replaces every constant with the next free parameter number."""
    n = max((int(m) for m in re.findall(r"\$(\d+)", sql)), default=0)

    def param(_: re.Match[str]) -> str:
        nonlocal n
        n += 1
        return f"${n}"

    return re.sub(r"'(?:[^']|'')*'", param, sql)


def test_every_named_statement_is_found_with_its_constants_made_parameters() -> None:
    for name in ("fence_runs", "claim_due", "apply_plans", "extend_leases", "lock_for_completion"):
        assert statement_name(_as_pg_stat_statements_shows_it(Q[name])) == name


def test_an_unnamed_statement_is_shown_by_its_text() -> None:
    assert statement_name("SELECT pid FROM pg_stat_activity WHERE datname = $1").startswith("? SELECT pid")
