"""Logs and request ids through real processes: DUETIME_LOG_FORMAT=json makes every record of
every process (children of DUETIME_PROCESSES=2 included) one JSON object per line; every answer
carries X-Request-Id; a 500 names it in its body and its log line carries it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.common import free_port
from tests.conftest import _create_db, _drop_db

# Starts `duetime api` / `duetime run` processes on a database of its own.
pytestmark = [pytest.mark.pg, pytest.mark.processes]


class LoggedProc:
    """A ``duetime`` process whose stderr (the log) goes to a file and stdout to a pipe."""

    def __init__(self, env: dict[str, str], log_path: Path, *args: str) -> None:
        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "duetime", *args],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )

    async def wait_line(self, needle: str, within: float = 40.0) -> str:
        def read() -> str:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if needle in line:
                    return line
            return ""

        line = await asyncio.wait_for(asyncio.to_thread(read), timeout=within)
        assert line, f"process exited before printing {needle!r}: {self.log_path.read_text()[-2000:]}"
        return line

    async def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout=60)
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._log.close()

    def text(self) -> str:
        return self.log_path.read_text()

    def records(self) -> list[dict[str, Any]]:
        """Every line of the log as JSON; fails on the first line that is not one object."""
        out = []
        for line in self.text().splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise AssertionError(f"not a JSON log line: {line!r}") from None
            assert isinstance(record, dict), line
            out.append(record)
        return out


def _check_record(record: dict[str, Any]) -> None:
    for key in ("ts", "level", "logger", "msg"):
        assert key in record, record
    assert record["ts"].endswith("Z"), record
    datetime.fromisoformat(record["ts"].replace("Z", "+00:00"))
    assert record["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@pytest.fixture
async def own_db(run_tag: str) -> AsyncIterator[str]:
    """A database of its own: the 500 test breaks a table on purpose."""
    name = f"duetime_test_{run_tag}_logs_{uuid.uuid4().hex[:6]}"
    dsn = await _create_db(name)
    yield dsn
    await _drop_db(name)


@pytest.fixture
def log_path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "stderr.log"


def _env(dsn: str, port: int, **extra: str) -> dict[str, str]:
    return {
        "DUETIME_DATABASE_URL": dsn,
        "DUETIME_HTTP_PORT": str(port),
        "DUETIME_LOG_FORMAT": "json",
        "DUETIME_POLL_INTERVAL_S": "0.5",
        "DUETIME_SHUTDOWN_GRACE_S": "3",
        **extra,
    }


async def test_api_process_json_logs_request_ids_and_a_500_that_names_its_id(
    own_db: str, log_path: Path
) -> None:
    port = free_port()
    proc = LoggedProc(_env(own_db, port, DUETIME_ACCESS_LOG="1"), log_path, "api")
    base = f"http://127.0.0.1:{port}"
    store = await PostgresStore.open(ShardMap.single(own_db), pool_size=2)
    try:
        await proc.wait_line("serving")
        key, _ = await store.create_api_key("logs_" + uuid.uuid4().hex[:6])
        auth = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession() as http:
            # the caller's id is kept when it is 1-128 printable ASCII
            async with http.get(f"{base}/healthz", headers={"X-Request-Id": "trace me-42"}) as r:
                assert r.status == 200 and r.headers["X-Request-Id"] == "trace me-42"
            # too long: a new one
            async with http.get(f"{base}/healthz", headers={"X-Request-Id": "x" * 129}) as r:
                made = r.headers["X-Request-Id"]
                assert re.fullmatch(r"[0-9a-f]{32}", made), made
            # none given: a new one, and a different one each time; error answers carry it too
            async with http.get(f"{base}/v1/jobs") as r:
                assert r.status == 401
                first = r.headers["X-Request-Id"]
            async with http.get(f"{base}/no/such/path") as r:
                assert r.status == 404
                assert r.headers["X-Request-Id"] not in (first, made)
            spec = {
                "target": {"type": "webhook", "url": "https://example.com/hook"},
                "schedule": {"cron": "0 3 * * *"},
            }
            async with http.post(f"{base}/v1/jobs", json=spec, headers=auth) as r:
                assert r.status == 201, await r.text()
                job_id = (await r.json())["id"]
            # break the run history table: listing runs is now an unexpected failure (500)
            conn = await asyncpg.connect(own_db)
            try:
                await conn.execute("ALTER TABLE runs RENAME TO runs_gone")
            finally:
                await conn.close()
            async with http.get(
                f"{base}/v1/jobs/{job_id}/runs", headers={**auth, "X-Request-Id": "find-this-500"}
            ) as r:
                assert r.status == 500
                body = await r.json()
                assert r.headers["X-Request-Id"] == "find-this-500"
            assert body["error"]["code"] == "internal_error"
            assert body["error"]["request_id"] == "find-this-500"
            assert "request_id" in body["error"]["message"]
    finally:
        await store.close()
        assert await proc.stop() == 0
    records = proc.records()
    assert records
    for record in records:
        _check_record(record)
    failure = [r for r in records if r.get("request_id") == "find-this-500" and r["level"] == "ERROR"]
    assert failure, records
    assert "runs" in failure[0]["exc"]  # the traceback names what broke
    access = [r for r in records if r["logger"] == "duetime.access"]
    by_id = {r.get("request_id"): r for r in access}
    assert by_id["trace me-42"]["status"] == 200
    assert by_id["find-this-500"]["status"] == 500
    assert by_id[first]["status"] == 401
    assert by_id[first]["route"] == "/v1/jobs"
    # no request id on records that belong to no request
    assert any("request_id" not in r for r in records)


async def test_children_of_a_multi_process_run_log_the_same_json(own_db: str, log_path: Path) -> None:
    port = free_port()
    proc = LoggedProc(_env(own_db, port, DUETIME_PROCESSES="2"), log_path, "run")
    try:
        await proc.wait_line("serving")
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as r:
            assert r.status == 200
            assert r.headers["X-Request-Id"]
    finally:
        assert await proc.stop() == 0
    records = proc.records()
    for record in records:
        _check_record(record)
    # each child logs its own shutdown; the parent does not: two such records = both children
    assert sum(1 for r in records if r["msg"] == "shutting down") == 2, records


async def test_text_format_keeps_timestamps_and_names_the_request(own_db: str, log_path: Path) -> None:
    port = free_port()
    proc = LoggedProc(_env(own_db, port, DUETIME_LOG_FORMAT="text", DUETIME_ACCESS_LOG="1"), log_path, "api")
    try:
        await proc.wait_line("serving")
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/healthz", headers={"X-Request-Id": "text-id-1"}) as r,
        ):
            assert r.status == 200
    finally:
        assert await proc.stop() == 0
    lines = [line for line in proc.text().splitlines() if "duetime.access" in line]
    assert len(lines) == 1, proc.text()
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO duetime.access: GET /healthz 200 ", lines[0])
    assert lines[0].endswith("request_id=text-id-1")
