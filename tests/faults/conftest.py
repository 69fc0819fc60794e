"""Fixtures of the fault scenarios: a fresh database per test (engines claim every due row in
their database, so scenarios must not see each other's jobs), the recording target, and the API
process the owner and the checker talk to."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import _create_db, _drop_db
from tests.faults.harness import NodeProc, node_env
from tests.faults.recorder import RecorderProcess


@pytest.fixture
async def fault_db(run_tag: str) -> AsyncIterator[str]:
    name = f"duetime_test_{run_tag}_f{secrets.token_hex(3)}"
    dsn = await _create_db(name)
    yield dsn
    await _drop_db(name)


@pytest.fixture
async def recorder(tmp_path: Path) -> AsyncIterator[RecorderProcess]:
    rec = RecorderProcess(tmp_path / "recording.jsonl")
    await rec.start()
    yield rec
    await rec.stop()


@pytest.fixture
async def api(fault_db: str, tmp_path: Path) -> AsyncIterator[NodeProc]:
    proc = NodeProc(node_env(fault_db), "api", tmp_path / "api.log")
    try:
        await proc.ready()
        yield proc
    finally:
        await proc.stop()
