"""docs/architecture.md against the code: every file its map names exists, and its "Layers" list
names the same layers, in the same order, as the import-linter contract that CI runs.

The contract itself (pyproject.toml, ``[tool.importlinter]``) is checked by ``lint-imports`` in
.ci/run; this test keeps the prose a newcomer reads from drifting away from it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "duetime"
# Modules of the package that sit beside the layers on purpose (docs/architecture.md says why).
BESIDE_THE_LAYERS = {
    "duetime.__init__",
    "duetime.__main__",
    "duetime._version",
    "duetime.apply",
    "duetime.client",
    "duetime.receiver",
}


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _mapped_paths() -> list[str]:
    """The backquoted paths in the file column of "Where things are"."""
    paths: list[str] = []
    for line in _section(DOC.read_text(encoding="utf-8"), "Where things are").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[1] in ("file", "---"):
            continue
        for token in re.findall(r"`([^`]+)`", cells[1]):
            if "/" in token or re.search(r"\.(py|md|toml|sql)$", token):
                paths.append(token)
    return paths


def _documented_layers() -> list[set[str]]:
    text = DOC.read_text(encoding="utf-8")
    block = text[text.index("<!-- layers:") : text.index("<!-- end of layers -->")]
    layers = []
    for item in re.findall(r"^\d+\. (.+?) — ", block, re.M):
        layers.append(set(re.findall(r"`(duetime[.\w]*)`", item)))
    return layers


def _contract_layers() -> list[set[str]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    [contract] = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [{name.strip() for name in layer.split("|")} for layer in contract["layers"]]


def test_every_file_the_map_names_exists() -> None:
    paths = _mapped_paths()
    assert len(paths) > 30, "the file map was not found or not read"
    missing = [p for p in paths if not (any(REPO.glob(p)) if "*" in p else (REPO / p).exists())]
    assert missing == []


def test_the_layers_text_names_the_contracts_layers() -> None:
    documented = _documented_layers()
    assert len(documented) >= 5, "the layers list was not found or not read"
    assert documented == _contract_layers()


def test_every_part_of_the_package_is_in_a_layer() -> None:
    """A new top-level module or package would otherwise escape every layering rule."""
    layered = set().union(*_contract_layers())
    parts = {
        f"duetime.{p.stem}" for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert parts - BESIDE_THE_LAYERS == layered
