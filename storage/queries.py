"""Named SQL, read once from the files ``storage/sql/*.sql`` (``-- name: x`` starts statement x).

One file per concept of ``storage/postgres/`` (registry, run path, completion, ...). A statement
is looked up by its name alone, so names are unique across all the files: loading refuses a name
that two files define, rather than let one silently replace the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources


def parse(text: str) -> dict[str, str]:
    """The statements of one file by name; comment lines inside a statement are dropped."""
    out: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("-- name:"):
            if name:
                out[name] = "\n".join(lines).strip().rstrip(";")
            name, lines = line.split(":", 1)[1].strip(), []
        elif name is not None and not line.lstrip().startswith("--"):
            lines.append(line)
    if name:
        out[name] = "\n".join(lines).strip().rstrip(";")
    return out


def merge(files: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Statements of several (file name, text) pairs in one namespace; a name defined twice is an
    error that names both files."""
    out: dict[str, str] = {}
    where: dict[str, str] = {}
    for file, text in files:
        for name, sql in parse(text).items():
            if name in out:
                raise ValueError(
                    f"SQL statement {name!r} is defined in both {where[name]} and {file}; "
                    "statement names must be unique across storage/sql/*.sql, rename one"
                )
            out[name], where[name] = sql, file
    return out


def _load() -> dict[str, str]:
    folder = resources.files("duetime.storage.sql")
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return merge((f.name, f.read_text(encoding="utf-8")) for f in files)


Q: dict[str, str] = _load()
