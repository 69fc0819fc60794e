"""The `server` extra of pyproject.toml and the libraries the CLI checks before a server command
are the same list, so a new server dependency cannot slip past the one-line install hint."""

from __future__ import annotations

import tomllib
from pathlib import Path

from duetime.cli import SERVER_MODULES

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# Distributions whose import name is not their name with '-' spelt '_'.
IMPORT_NAMES = {"nats-py": "nats"}


def _name(requirement: str) -> str:
    for stop in "<>=!~[; ":
        requirement = requirement.split(stop, 1)[0]
    return requirement.strip()


def test_server_modules_are_the_server_extra() -> None:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    extra = [_name(r) for r in project["optional-dependencies"]["server"]]
    assert sorted(IMPORT_NAMES.get(d, d.replace("-", "_")) for d in extra) == sorted(SERVER_MODULES)


def test_a_plain_install_needs_nothing_beyond_the_standard_library() -> None:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    assert project["dependencies"] == []
    assert [_name(r) for r in project["optional-dependencies"]["async"]] == ["aiohttp"]
