"""The loopback webhook receiver the tests share: records every call (path, headers, body, arrival)
and answers what the test tells it per path, after an optional delay."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiohttp import web


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
