"""The completion rules stand apart from the PostgreSQL driver: the in-memory store loads neither
asyncpg nor ``storage.postgres`` (it used to borrow the completion writer from there, and so
loaded the driver in every test of the engine, the workers and the API), and the typed row the
rules read is the one ``lock_for_completion`` selects, column for column."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from duetime.storage.completion_rules import LockedRow
from duetime.storage.queries import Q

REPO = Path(__file__).resolve().parents[2]


def test_the_memory_store_loads_no_driver() -> None:
    """In a fresh interpreter: what ``import duetime.storage.memory`` brings in, and nothing else."""
    probe = "import json, sys\nimport duetime.storage.memory\nprint(json.dumps(sorted(sys.modules)))\n"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    loaded = json.loads(done.stdout)
    assert "duetime.storage.memory" in loaded  # the probe imported what it says
    assert "asyncpg" not in loaded
    assert [
        m for m in loaded if m == "duetime.storage.postgres" or m.startswith("duetime.storage.postgres.")
    ] == []


def test_a_locked_row_is_what_lock_for_completion_selects() -> None:
    """``PostgresStore`` builds a ``LockedRow`` from a record by position (and checks the names of
    the first record's columns at run time); this holds the statement and the record in step
    before any database is asked."""
    select = re.search(r"SELECT(.*?)FROM jobs", Q["lock_for_completion"], re.S)
    assert select is not None
    columns = [c.strip().split(" AS ")[-1] for c in select.group(1).split(",")]
    assert tuple(columns) == LockedRow._fields
