"""Named SQL, read once from ``storage/sql/queries.sql`` (``-- name: x`` starts statement x)."""

from __future__ import annotations

from importlib import resources


def _load() -> dict[str, str]:
    text = resources.files("duetime.storage.sql").joinpath("queries.sql").read_text(encoding="utf-8")
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


Q: dict[str, str] = _load()
