"""A fresh database per security test that runs an engine: an engine claims every due row in its
database, and must never fire another test's jobs (some name public addresses)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest

from tests.conftest import _create_db, _drop_db


@pytest.fixture
async def own_db(run_tag: str) -> AsyncIterator[str]:
    name = f"duetime_test_{run_tag}_s{secrets.token_hex(3)}"
    dsn = await _create_db(name)
    yield dsn
    await _drop_db(name)
