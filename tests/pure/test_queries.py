"""The named SQL: one namespace over every file of storage/sql/, each name defined once, every
name the store asks for defined, every defined statement used."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from duetime.storage.queries import Q, merge, parse

STORAGE = Path(__file__).resolve().parents[2] / "storage"
SQL_FILES = sorted((STORAGE / "sql").glob("*.sql"))


def test_every_statement_name_is_defined_in_one_file_only() -> None:
    where: dict[str, list[str]] = {}
    for path in SQL_FILES:
        # Counted from the raw lines, not the parser: a name repeated inside one file would
        # otherwise collapse into one dictionary key unnoticed.
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("-- name:"):
                where.setdefault(line.split(":", 1)[1].strip(), []).append(path.name)
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert not twice, f"statement names defined more than once: {twice}"
    assert set(where) == set(Q)


def test_a_name_two_files_define_is_refused_naming_both() -> None:
    a = "-- name: same\nSELECT 1;\n"
    b = "-- name: other\nSELECT 2;\n\n-- name: same\nSELECT 3;\n"
    with pytest.raises(ValueError, match=r"'same' is defined in both a\.sql and b\.sql"):
        merge([("a.sql", a), ("b.sql", b)])


def test_parse_drops_comment_lines_and_the_semicolon() -> None:
    text = "-- header\n\n-- name: x\n-- why\nSELECT 1\nFROM t;  \n\n-- name: y\nSELECT 2;\n"
    assert parse(text) == {"x": "SELECT 1\nFROM t", "y": "SELECT 2"}


def test_the_store_asks_only_for_defined_statements_and_uses_every_one() -> None:
    # The store's modules, and the bulk loader of the benchmarks (storage/bulk.py).
    files = [*sorted((STORAGE / "postgres").glob("*.py")), STORAGE / "bulk.py"]
    code = "\n".join(p.read_text(encoding="utf-8") for p in files)
    asked = set(re.findall(r'Q\["([a-z_]+)"\]', code))
    assert asked <= set(Q), f"asked for but not defined: {asked - set(Q)}"
    named = set(re.findall(r'"([a-z_]+)"', code))
    unused = {name for name in Q if name not in named}
    assert not unused, f"statements no code of storage/postgres/ names: {unused}"
