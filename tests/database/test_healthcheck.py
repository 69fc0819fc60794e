"""``python -m duetime.healthcheck`` (the image's HEALTHCHECK) against a real node: 0 when /readyz
answers 2xx on DUETIME_HTTP_PORT, 1 when nothing answers, 2 for a port that is not one."""

from __future__ import annotations

import asyncio
import os
import sys
from urllib.parse import urlsplit

import pytest

from duetime.app import Node
from loadtest.common import free_port
from tests.support.node import fast_settings

pytestmark = pytest.mark.processes  # runs python -m duetime.healthcheck


async def _check(port: str, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "duetime.healthcheck",
        *args,
        env={**os.environ, "DUETIME_HTTP_PORT": port, "DUETIME_HTTP_HOST": "0.0.0.0"},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_the_healthcheck_follows_the_process_readiness(pg_dsn: str) -> None:
    node = Node(fast_settings(pg_dsn), engine=False, workers=False)
    await node.start()
    try:
        assert node.url is not None
        port = str(urlsplit(node.url).port)
        code, out = await _check(port)
        assert code == 0, out
        assert "/readyz: 200" in out
        code, out = await _check(port, "/healthz")
        assert code == 0 and "/healthz: 200" in out
        code, out = await _check(port, "/no-such-probe")
        assert code == 1 and "404" in out
    finally:
        await node.stop()
    code, out = await _check(str(free_port()))
    assert code == 1 and "ConnectionRefusedError" in out
    code, _ = await _check("http")
    assert code == 2
