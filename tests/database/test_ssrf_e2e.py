"""The SSRF guard end to end, against live canary listeners that must see 0 connections.

* Registration: the HTTP API (private targets not allowed) refuses every payload on POST and on
  PATCH of the target — at least 40 spellings of loopback, private, link-local, CGNAT, multicast,
  metadata and IPv4-mapped addresses, many of them aimed at the canaries' ports.
* Call time: the same URLs registered while an operator allowed private targets, then fired by a
  node whose workers do not allow them: every call is refused before a connection is made, the
  history says why, and the refusal is final (no retries).
* A redirect from an allowed target to a canary is not followed.
* DNS that changes its answer (a custom resolver in place of the system's): a name that passed at
  registration but now resolves to loopback is refused at call time, and a name whose answer
  changes right after the call-time check is connected to the address that was checked.

The unit catalogue (tests/pure/test_ssrf.py) judges more spellings without the network.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from ipaddress import IPv4Network
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from duetime.api.app import create_app
from duetime.app import Node
from duetime.core.ssrf import AddressPolicy
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.support.node import fast_settings

STRICT = AddressPolicy()
OPEN = AddressPolicy(allow_private=True)


@dataclass
class Canary:
    """A TCP listener that only counts connections."""

    host: str
    port: int = 0
    connections: int = 0
    server: asyncio.Server | None = None

    async def start(self, port: int = 0) -> Canary:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        self.server = await asyncio.start_server(on_connect, self.host, port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def canaries() -> AsyncIterator[dict[str, Canary]]:
    """127.0.0.1 and ::1 on one port, 127.0.0.2 and 127.1.2.3 on theirs (all of 127/8 is loopback)."""
    v4 = await Canary("127.0.0.1").start()
    out = {"v4": v4}
    try:
        out["v6"] = await Canary("::1").start(v4.port)
    except OSError:
        pass
    out["v4b"] = await Canary("127.0.0.2").start(v4.port)
    out["v4c"] = await Canary("127.1.2.3").start(v4.port)
    yield out
    for canary in out.values():
        await canary.stop()


def payloads(port: int) -> list[str]:
    """Hosts that must never be reached; the loopback ones are aimed at the canaries' port."""
    aimed = [
        "127.0.0.1",
        "127.1",
        "127.0.1",
        "127.000.000.001",
        "0x7f.1",
        "0x7F.0.0.1",
        "0x7f000001",
        "2130706433",
        "017700000001",
        "0177.0.0.1",
        "0177.1",
        "127.0.0.1.",
        "127.0.0.2",
        "127.1.2.3",
        "2130706434",
        "０x7f.1",
        "１２７。０。０。１",
        "localhost",
        "LOCALHOST",
        "localhost.",
        "foo.localhost",
        "localhost.localdomain",
        "ip6-localhost",
        "[::1]",
        "[0:0:0:0:0:0:0:1]",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[::127.0.0.1]",
        "[64:ff9b::7f00:1]",
        "[2002:7f00:1::]",
        "[::ffff:0:127.0.0.1]",
        "[::ffff:0:7f00:1]",
        "[2001:0:4136:e378:8000:63bf:80ff:fffe]",
        "[64:ff9b:1::7f00:1]",
        "0.0.0.0",
        "0",
        "[::]",
    ]
    elsewhere = [
        "169.254.169.254",
        "0xa9fea9fe",
        "2852039166",
        "[fd00:ec2::254]",
        "[::ffff:169.254.169.254]",
        "metadata.google.internal",
        "100.100.100.200",
        "10.0.0.1",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "169.254.0.1",
        "224.0.0.1",
        "239.255.255.250",
        "255.255.255.255",
        "[fe80::1]",
        "[fc00::1]",
        "[ff02::1]",
        "[::ffff:10.0.0.1]",
        "[::ffff:0:169.254.169.254]",
        "[::ffff:0:10.0.0.1]",
        "[1::]",
        "[4000::1]",
        "db.internal",
        "redis",
    ]
    return [f"http://{host}:{port}/hook" for host in aimed + elsewhere]


def _spec(url: str) -> dict[str, Any]:
    return {
        "target": {"type": "webhook", "url": url, "timeout_s": 2},
        "schedule": {"run_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
        "retry": {"max_attempts": 3, "backoff_initial_s": 0.1},
    }


def _silent(canaries: dict[str, Canary]) -> dict[str, int]:
    return {name: c.connections for name, c in canaries.items() if c.connections}


@pytest.fixture
async def store(own_db: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.open(ShardMap.single(own_db), pool_size=4)
    yield s
    await s.close()


async def test_registration_refuses_every_payload_and_nothing_is_reached(
    store: PostgresStore, canaries: dict[str, Canary]
) -> None:
    urls = payloads(canaries["v4"].port)
    assert len(urls) >= 40
    key, _ = await store.create_api_key(f"ssrf-{uuid.uuid4().hex[:6]}")
    headers = {"Authorization": f"Bearer {key}"}
    codes: dict[str, str] = {}
    async with TestClient(TestServer(create_app(store, policy=STRICT), host="127.0.0.1")) as client:
        good = await client.post("/v1/jobs", json=_spec("https://1.1.1.1/hook"), headers=headers)
        assert good.status == 201
        job_id = (await good.json())["id"]
        for url in urls:
            resp = await client.post("/v1/jobs", json=_spec(url), headers=headers)
            body = await resp.json()
            assert resp.status == 422, (url, body)
            codes[url] = body["error"]["code"]
            assert body["error"]["field"] == "target.url", body
            patch = await client.patch(
                f"/v1/jobs/{job_id}", json={"target": {"type": "webhook", "url": url}}, headers=headers
            )
            assert patch.status == 422, url
        listed = await (await client.get("/v1/jobs", headers=headers)).json()
    await asyncio.sleep(0.1)
    assert [j["id"] for j in listed["items"]] == [job_id], "nothing else was registered"
    refused = [u for u, c in codes.items() if c == "target_not_allowed"]
    assert len(refused) >= 40, {u: c for u, c in codes.items() if c != "target_not_allowed"}
    assert set(codes.values()) <= {"target_not_allowed", "invalid_url"}
    assert _silent(canaries) == {}


async def _wait_final(store: PostgresStore, owner: str, ids: Iterable[str], within: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    pending = set(ids)
    while pending:
        for job_id in list(pending):
            job = await store.get_job(owner, uuid.UUID(job_id))
            if job.state.value != "scheduled":
                pending.discard(job_id)
        assert asyncio.get_running_loop().time() < deadline, f"{len(pending)} jobs never finished"
        await asyncio.sleep(0.2)


async def _register_openly(store: PostgresStore, owner_key: str, specs: list[dict[str, Any]]) -> list[str]:
    """As an operator with DUETIME_WEBHOOK_ALLOW_PRIVATE=1 would have accepted them."""
    ids = []
    headers = {"Authorization": f"Bearer {owner_key}"}
    async with TestClient(TestServer(create_app(store, policy=OPEN), host="127.0.0.1")) as client:
        for spec in specs:
            resp = await client.post("/v1/jobs", json=spec, headers=headers)
            if resp.status == 201:
                ids.append((await resp.json())["id"])
    return ids


@dataclass
class HttpTarget:
    """An allowed target: answers 200, or 302 towards ``location`` when one is given."""

    location: str | None = None
    calls: int = 0
    runner: web.AppRunner | None = None
    port: int = 0

    async def start(self, host: str, port: int = 0) -> None:
        async def handle(_: web.Request) -> web.Response:
            self.calls += 1
            if self.location is not None:
                raise web.HTTPFound(self.location)
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def test_call_time_refuses_what_registration_let_through_and_follows_no_redirect(
    own_db: str, store: PostgresStore, canaries: dict[str, Canary]
) -> None:
    owner = f"ssrf-call-{uuid.uuid4().hex[:6]}"
    key, _ = await store.create_api_key(owner)
    ids = await _register_openly(store, key, [_spec(u) for u in payloads(canaries["v4"].port)])
    assert len(ids) >= 40, "registered while allowed"
    # An allowed target (its network is opened by CIDR) that redirects to the canary.
    redirector = HttpTarget(location=f"http://127.0.0.1:{canaries['v4'].port}/hook")
    await redirector.start("127.0.0.5")
    redirect_id = (await _register_openly(store, key, [_spec(f"http://127.0.0.5:{redirector.port}/r")]))[0]
    node = Node(
        fast_settings(own_db, webhook_allow_private=False, webhook_allow_cidrs=(IPv4Network("127.0.0.5/32"),))
    )
    await node.start()
    try:
        await _wait_final(store, owner, [*ids, redirect_id])
    finally:
        await node.stop()
        await redirector.stop()
    await asyncio.sleep(0.1)
    assert _silent(canaries) == {}
    refused = 0
    for job_id in ids:
        runs = (await store.list_runs(owner, uuid.UUID(job_id), limit=10, cursor=None)).items
        assert (await store.get_job(owner, uuid.UUID(job_id))).state.value == "dead"
        assert {r.outcome.value for r in runs} == {"failed"}
        errors = {(r.error or "").split(":")[0].split(" for ")[0] for r in runs}
        if errors == {"target_not_allowed"}:
            assert len(runs) == 1, "a refusal is final: no retry"
            refused += 1
        else:
            # Internal-only names (db.internal, redis) are resolved once an allow-list exists;
            # here they resolve to nothing, which is retried like any DNS failure.
            assert errors == {"name resolution failed"}, (job_id, runs)
    assert refused >= 40
    [run] = (await store.list_runs(owner, uuid.UUID(redirect_id), limit=10, cursor=None)).items
    assert (run.outcome.value, run.status_code, run.error) == ("failed", 302, "redirect refused (HTTP 302)")
    assert redirector.calls == 1


@dataclass
class ChangingResolver:
    """Answers for some names from a script, one answer per lookup (the last one repeats)."""

    script: dict[str, list[str]]
    asked: dict[str, int] = field(default_factory=dict)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        loop = asyncio.get_running_loop()
        real: Callable[..., Any] = loop.getaddrinfo

        async def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            name = host.decode() if isinstance(host, bytes) else str(host)
            if name not in self.script:
                return await real(host, port, *args, **kwargs)
            n = self.asked.get(name, 0)
            self.asked[name] = n + 1
            answers = self.script[name]
            address = answers[min(n, len(answers) - 1)]
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, int(port or 0)))]

        monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)


async def test_dns_answers_that_change_are_checked_at_call_time_and_connect_where_checked(
    own_db: str, store: PostgresStore, canaries: dict[str, Canary], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = canaries["v4"].port
    # An allowed receiver on 127.0.0.6 (opened by CIDR), on the canary's port: the two names
    # below differ only in what DNS answers, so which listener sees the call tells what happened.
    receiver = HttpTarget()
    await receiver.start("127.0.0.6", port)
    resolver = ChangingResolver(
        {
            # passes at registration; rebound to loopback before the call
            "rebound.example.com": ["127.0.0.6", "127.0.0.1"],
            # passes at registration and at the call-time check; rebound right after that check
            "flips.example.com": ["127.0.0.6", "127.0.0.6", "127.0.0.1"],
        }
    )
    resolver.install(monkeypatch)
    policy = AddressPolicy(allow_cidrs=(IPv4Network("127.0.0.6/32"),))
    owner = f"ssrf-dns-{uuid.uuid4().hex[:6]}"
    key, _ = await store.create_api_key(owner)
    headers = {"Authorization": f"Bearer {key}"}
    ids = {}
    async with TestClient(TestServer(create_app(store, policy=policy), host="127.0.0.1")) as client:
        for name in ("rebound.example.com", "flips.example.com"):
            resp = await client.post("/v1/jobs", json=_spec(f"http://{name}:{port}/hook"), headers=headers)
            assert resp.status == 201, await resp.text()
            ids[name] = (await resp.json())["id"]
    assert resolver.asked == {"rebound.example.com": 1, "flips.example.com": 1}
    node = Node(fast_settings(own_db, webhook_allow_private=False, webhook_allow_cidrs=policy.allow_cidrs))
    await node.start()
    try:
        await _wait_final(store, owner, ids.values())
    finally:
        await node.stop()
        await receiver.stop()
    rebound = (
        await store.list_runs(owner, uuid.UUID(ids["rebound.example.com"]), limit=5, cursor=None)
    ).items
    assert rebound[0].error is not None and rebound[0].error.startswith("target_not_allowed"), rebound
    assert "127.0.0.1" in rebound[0].error
    assert _silent(canaries) == {}, "no connection reached loopback"
    # flips.example.com was called at the checked 127.0.0.6 and never resolved again to connect.
    flips = (await store.list_runs(owner, uuid.UUID(ids["flips.example.com"]), limit=5, cursor=None)).items
    assert [(r.attempt, r.outcome.value) for r in flips] == [(1, "succeeded")], flips
    assert receiver.calls == 1
    assert resolver.asked["flips.example.com"] == 2, "one lookup at registration, one at the call"
