"""An in-process Duetime (API + engine + workers) on the test database, a loopback webhook
receiver that records every call, and a client that talks HTTP to the API like an owner would."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from aiohttp import web

from duetime.settings import Settings


@dataclass
class Call:
    path: str
    headers: dict[str, str]
    body: bytes
    arrived: datetime
    status: int


@dataclass
class Receiver:
    """Records each request; answers what ``behaviour[path]`` says (default 200)."""

    calls: list[Call] = field(default_factory=list)
    behaviour: dict[str, Callable[[int], int]] = field(default_factory=dict)
    delay: dict[str, float] = field(default_factory=dict)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)  # sent with each answer
    url: str = ""
    _runner: web.AppRunner | None = None
    _event: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        arrived = datetime.now(UTC)
        body = await request.read()
        path = request.path
        n = sum(1 for c in self.calls if c.path == path) + 1
        status = self.behaviour.get(path, lambda _n: 200)(n)
        self.calls.append(Call(path, dict(request.headers), body, arrived, status))
        self._event.set()
        if path in self.delay:
            await asyncio.sleep(self.delay[path])
        return web.Response(status=status, text="ok", headers=self.headers.get(path))

    def on(self, path: str) -> list[Call]:
        return [c for c in self.calls if c.path == path]

    async def wait_for(self, path: str, count: int, within: float = 20.0) -> list[Call]:
        deadline = time.monotonic() + within
        while len(self.on(path)) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{path}: expected {count} calls, got {len(self.on(path))}")
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), timeout=min(remaining, 0.5))
            except TimeoutError:
                pass
        return self.on(path)


def fast_settings(dsn: str, **overrides: Any) -> Settings:
    base = Settings.from_env(
        {
            "DUETIME_DATABASE_URL": dsn,
            "DUETIME_HTTP_PORT": "0",
            "DUETIME_WEBHOOK_ALLOW_PRIVATE": "1",
            "DUETIME_POLL_INTERVAL_S": "0.5",
            "DUETIME_JANITOR_INTERVAL_S": "0.5",
            "DUETIME_LEASE_S": "4",
            "DUETIME_HEARTBEAT_S": "1",
            "DUETIME_SHUTDOWN_GRACE_S": "5",
            "DUETIME_WORKER_CONCURRENCY": "64",
            "DUETIME_DB_POOL_SIZE": "6",
            "DUETIME_REDIS_URL": "redis://127.0.0.1:6379/0",
            "DUETIME_NATS_URL": "nats://127.0.0.1:4222",
            "DUETIME_ENGINE_ID": "e2e-" + uuid.uuid4().hex[:8],
        }
    )
    return dataclasses.replace(base, **overrides)


@dataclass
class Owner:
    name: str
    key: str
    secret: str
    http: aiohttp.ClientSession
    base: str

    async def call(self, method: str, path: str, body: Any = None, **headers: str) -> tuple[int, Any]:
        h = {"Authorization": f"Bearer {self.key}", **headers}
        async with self.http.request(method, self.base + path, json=body, headers=h) as resp:
            data = await resp.json(content_type=None)
            return resp.status, data

    async def create(self, spec: dict[str, Any]) -> dict[str, Any]:
        status, body = await self.call("POST", "/v1/jobs", spec)
        assert status == 201, body
        return body  # type: ignore[no-any-return]

    async def runs(self, job_id: str) -> list[dict[str, Any]]:
        """The job's whole run history, newest first."""
        items: list[dict[str, Any]] = []
        cursor = None
        while True:
            path = f"/v1/jobs/{job_id}/runs?limit=1000" + (f"&cursor={cursor}" if cursor else "")
            status, page = await self.call("GET", path)
            assert status == 200, page
            items.extend(page["items"])
            cursor = page["next_cursor"]
            if not cursor:
                return items

    async def cancel_all(self) -> None:
        cursor = None
        while True:
            q = "/v1/jobs?limit=1000" + (f"&cursor={cursor}" if cursor else "")
            _, page = await self.call("GET", q)
            for job in page["items"]:
                await self.call("DELETE", f"/v1/jobs/{job['id']}")
            cursor = page["next_cursor"]
            if not cursor:
                return


def at(seconds: float) -> str:
    """An RFC 3339 instant ``seconds`` from now, on a whole second (so the key is stable)."""
    t = datetime.now(UTC) + timedelta(seconds=seconds)
    return t.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
