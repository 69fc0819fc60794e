"""The owners' part installs without the server: ``duetime.client``, ``duetime.receiver`` and
``duetime jobs`` run in a Python that cannot import any server library, against a real node.

``pip install duetime`` (no extra) is meant to bring exactly this, so the child process refuses
every import of the ``server`` extra's libraries (and aiohttp, which only the async client needs)
with a meta-path finder, then drives a job's lifecycle with the blocking client, checks a
signature with the receiver helpers, and asks for a server command, which must fail with one line
naming the install command.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from duetime._version import __version__
from duetime.app import Node
from tests.support.node import fast_settings

REPO = Path(__file__).resolve().parents[2]

# The server extra's import names, and aiohttp (the async client's only dependency).
BLOCKED = ("aiohttp", "asyncpg", "hiredis", "msgpack", "nats", "prometheus_client", "redis", "uvloop", "yarl")

CHILD = r'''
import importlib.abc
import io
import json
import os
import sys
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime

BLOCKED = frozenset(sys.argv[1].split(","))


class Refuse(importlib.abc.MetaPathFinder):
    """Makes the server's libraries look uninstalled: every import of them fails."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (refused by the test)", name=name)
        return None


sys.meta_path.insert(0, Refuse())

from duetime.client import DuetimeClient, NotFoundError
from duetime.receiver import DeliveryHeaders, verify_webhook
from duetime.core.signing import sign
from duetime import cli

url, key, secret, hook = sys.argv[2:6]
client = DuetimeClient(url, key, timeout_s=10)
spec = {
    "name": "client-alone",
    "target": {"type": "webhook", "url": hook},
    "schedule": {"cron": "0 0 1 1 *", "timezone": "Europe/Berlin"},
}
job = client.create_job(spec, idempotency_key="client-alone-" + sys.argv[6])
again = client.create_job(spec, idempotency_key="client-alone-" + sys.argv[6])
paused = client.pause_job(job.id)
listed = [j.id for j in client.iter_jobs(state="paused", page_size=100)]
client.resume_job(job.id)
client.cancel_job(job.id)
cancelled = client.get_job(job.id)
try:
    client.get_job("00000000-0000-7000-8000-000000000000")
    missing = "found"
except NotFoundError as exc:
    missing = exc.code

body = b'{"a":1}'
ts = int(datetime.now(UTC).timestamp())
msg = f"{job.id}:2026-01-01T00:00:00Z"
headers = {
    "Idempotency-Key": msg,
    "Duetime-Job-Id": job.id,
    "Duetime-Scheduled-For": "2026-01-01T00:00:00Z",
    "Duetime-Attempt": "2",
    "Duetime-Fencing-Token": "7",
    "webhook-id": msg,
    "webhook-timestamp": str(ts),
    "webhook-signature": sign(secret, msg, ts, body),
}

out, err = io.StringIO(), io.StringIO()
with redirect_stdout(out), redirect_stderr(err):
    try:
        cli.main(["--version"])
        version_exit = None
    except SystemExit as exc:
        version_exit = exc.code
    run_exit = cli.main(["run"])
    os.environ["DUETIME_API_KEY"] = key  # not --api-key: a key in argv is warned about (ps)
    jobs_exit = cli.main(["jobs", "--url", url, "get", job.id])

print(json.dumps({
    "same_job": again.id == job.id,
    "paused": paused.state,
    "listed": job.id in listed,
    "cancelled": cancelled.state,
    "missing": missing,
    "signature_ok": verify_webhook(secret, headers, body),
    "signature_forged": verify_webhook(secret, headers, body + b" "),
    "headers": DeliveryHeaders.parse(headers).fencing_token,
    "version_exit": version_exit,
    "run_exit": run_exit,
    "jobs_exit": jobs_exit,
    "stdout": out.getvalue(),
    "stderr": err.getvalue(),
    "loaded": sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED),
}))
'''


@dataclass
class Served:
    url: str
    key: str
    secret: str


@pytest.fixture(scope="module")
async def served(pg_dsn: str) -> AsyncIterator[Served]:
    node = Node(fast_settings(pg_dsn))
    await node.start()
    assert node.store is not None and node.url is not None
    key, secret = await node.store.create_api_key(f"alone-{uuid.uuid4().hex[:8]}")
    try:
        yield Served(node.url, key, secret)
    finally:
        await node.stop()


async def test_client_and_receiver_work_without_the_server_libraries(served: Served) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        ",".join(BLOCKED),
        served.url,
        served.key,
        served.secret,
        "http://127.0.0.1:9/hook",
        uuid.uuid4().hex,
        env=environ,
        cwd=str(REPO),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    seen = json.loads(out)
    assert seen["loaded"] == [], "a server library was imported after all"
    assert seen["same_job"] and seen["listed"]
    assert (seen["paused"], seen["cancelled"], seen["missing"]) == ("paused", "cancelled", "not_found")
    assert seen["signature_ok"] is True and seen["signature_forged"] is False
    assert seen["headers"] == 7
    assert seen["version_exit"] == 0 and f"duetime {__version__}" in seen["stdout"]
    assert seen["jobs_exit"] == 0 and '"state": "cancelled"' in seen["stdout"]
    # A server command names what is missing and the command that installs it, on one line.
    assert seen["run_exit"] == 2
    [line] = seen["stderr"].strip().splitlines()
    assert line.startswith("duetime: 'run' needs the server's libraries (")
    assert line.endswith("pip install 'duetime[server]'")


async def test_every_process_reports_its_release_on_metrics(served: Served) -> None:
    async with aiohttp.ClientSession() as http, http.get(served.url + "/metrics") as resp:
        text = await resp.text()
    assert f'duetime_build_info{{version="{__version__}"}} 1.0' in text.splitlines()
