"""Named SQL, read once from the ``.sql`` files of ``storage/sql/`` (``-- name: x`` starts
statement x). One namespace: a name defined in two files is refused at import."""

from __future__ import annotations

from importlib import resources


def _parse(text: str, out: dict[str, str], source: str) -> None:
    name: str | None = None
    lines: list[str] = []

    def done() -> None:
        if name is None:
            return
        if name in out:
            raise RuntimeError(f"SQL statement {name!r} is defined twice (again in {source})")
        out[name] = "\n".join(lines).strip().rstrip(";")

    for line in text.splitlines():
        if line.startswith("-- name:"):
            done()
            name, lines = line.split(":", 1)[1].strip(), []
        elif name is not None and not line.lstrip().startswith("--"):
            lines.append(line)
    done()


def _load() -> dict[str, str]:
    out: dict[str, str] = {}
    files = sorted(
        (f for f in resources.files("duetime.storage.sql").iterdir() if f.name.endswith(".sql")),
        key=lambda f: f.name,
    )
    for f in files:
        _parse(f.read_text(encoding="utf-8"), out, f.name)
    return out


Q: dict[str, str] = _load()
