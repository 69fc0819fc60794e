"""`duetime keys rotate-secret` end to end: the real CLI rotates the owner's secret on the node's
database; during the grace each webhook a real worker sends carries two signatures and the
receiver helper verifies it with either secret; after the grace only the new secret verifies."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import UTC, datetime

import pytest

from duetime.app import Node
from duetime.receiver import verify_webhook
from tests.support.node import Owner, at
from tests.support.receiver import Receiver

pytestmark = pytest.mark.processes  # runs the real `duetime keys rotate-secret`


async def _rotate(dsn: str, owner: str, grace: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "duetime",
        "keys",
        "rotate-secret",
        "--owner",
        owner,
        "--grace",
        grace,
        "--json",
        env={**env, "DUETIME_DATABASE_URL": dsn},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    body: dict[str, str] = json.loads(out)
    return body


async def _one_call(owner: Owner, receiver: Receiver, path: str) -> tuple[dict[str, str], bytes]:
    await owner.create(
        {"target": {"type": "webhook", "url": f"{receiver.url}{path}"}, "schedule": {"run_at": at(0)}}
    )
    (call,) = await receiver.wait_for(path, 1, within=20)
    return call.headers, call.body


async def test_a_rotated_secret_signs_beside_the_old_one_for_the_grace_only(
    pg_dsn: str, node: Node, owner: Owner, receiver: Receiver
) -> None:
    old = owner.secret
    grace_s = 6
    rotated = await _rotate(pg_dsn, owner.name, f"{grace_s}s")
    new = rotated["signing_secret"]
    until = datetime.fromisoformat(rotated["previous_valid_until"].replace("Z", "+00:00"))
    assert new != old and rotated["owner"] == owner.name

    headers, body = await _one_call(owner, receiver, "/during")
    assert datetime.now(UTC) < until, "the call came within the grace"
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert verify_webhook(new, headers, body)  # a receiver already moved to the new secret
    assert verify_webhook(old, headers, body)  # a receiver still on the old one

    # after the grace (the worker's cached keys are still fresh: the grace is checked per call)
    await asyncio.sleep(max(0.0, (until - datetime.now(UTC)).total_seconds()) + 0.5)
    started = time.monotonic()
    headers, body = await _one_call(owner, receiver, "/after")
    assert time.monotonic() - started < 30
    assert len(headers["webhook-signature"].split(" ")) == 1
    assert verify_webhook(new, headers, body)
    assert not verify_webhook(old, headers, body)
