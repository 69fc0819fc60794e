"""Claims the docs make about the code's shape, checked against the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_IMPORTS_ASYNCPG = re.compile(r"^\s*(import asyncpg|from asyncpg\b)", re.M)


def test_only_storage_imports_asyncpg() -> None:
    """docs/architecture.md: "only `storage/` imports asyncpg" (the composition root builds a
    PostgresStore; everything else talks to the storage ports)."""
    assert "only `storage/` imports asyncpg" in (ROOT / "docs" / "architecture.md").read_text(
        encoding="utf-8"
    )
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("api", "core", "engine", "workers", "duetime")
        for path in (ROOT / folder).rglob("*.py")
        if not path.is_symlink()
        and not any(p.is_symlink() for p in path.relative_to(ROOT).parents if p != Path("."))
        and _IMPORTS_ASYNCPG.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
