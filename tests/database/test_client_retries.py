"""The client against a real node: 429 (DUETIME_API_OWNER_RATE) retried after Retry-After for calls
safe to repeat and never for the others; 503 likewise (from a server scripted to answer it); the
sync client keeps one connection for many calls; both read DUETIME_URL and DUETIME_API_KEY."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from aiohttp import web

from duetime.app import Node
from duetime.client import (
    AsyncDuetimeClient,
    AuthenticationError,
    DuetimeClient,
    RateLimitedError,
    ServiceUnavailableError,
)
from tests.support.node import fast_settings

SPEC = {
    "target": {"type": "webhook", "url": "https://example.com/hook"},
    "schedule": {"cron": "0 0 1 1 *"},
}


@dataclass
class Limited:
    url: str
    key: str


@pytest.fixture(scope="module")
async def limited(pg_dsn: str) -> AsyncIterator[Limited]:
    """A node whose API allows each owner 1 request a second (bursts of 2)."""
    node = Node(fast_settings(pg_dsn, api_owner_rate=1.0), engine=False, workers=False)
    await node.start()
    assert node.store is not None and node.url is not None
    key, _ = await node.store.create_api_key(f"rate-{uuid.uuid4().hex[:8]}")
    try:
        yield Limited(node.url, key)
    finally:
        await node.stop()


def _drain(client: DuetimeClient) -> None:
    """Use up the owner's burst so the next call is answered 429."""
    for _ in range(5):
        try:
            client.list_jobs(limit=1)
        except RateLimitedError:
            return
    raise AssertionError("the rate limit never answered 429")


async def test_a_429_is_waited_out_for_a_read_and_raised_for_a_trigger(limited: Limited) -> None:
    def run() -> None:
        waiting = DuetimeClient(limited.url, limited.key, retries=3)
        no_retry = DuetimeClient(limited.url, limited.key, retries=0)
        job = waiting.create_job(SPEC, idempotency_key=uuid.uuid4().hex)
        _drain(no_retry)
        started = time.monotonic()
        assert waiting.get_job(job.id).id == job.id  # 429, Retry-After: 1, then 200
        assert time.monotonic() - started >= 0.9, "it waited for Retry-After"
        _drain(no_retry)
        with pytest.raises(RateLimitedError) as refused:
            waiting.trigger_job(job.id)  # not safe to repeat: the 429 is the caller's
        assert refused.value.retry_after_s == 1
        _drain(no_retry)
        impatient = DuetimeClient(limited.url, limited.key, retries=3, retry_after_max_s=0.5)
        started = time.monotonic()
        with pytest.raises(RateLimitedError):
            impatient.get_job(job.id)  # asked to wait 1 s, longer than it will: raised at once
        assert time.monotonic() - started < 0.5
        time.sleep(2.1)
        waiting.cancel_job(job.id)

    await asyncio.to_thread(run)


async def test_the_async_client_waits_out_a_429_for_a_keyed_create(limited: Limited) -> None:
    async with AsyncDuetimeClient(limited.url, limited.key, retries=3) as client:
        await asyncio.sleep(2.1)  # a full bucket
        created = []
        started = time.monotonic()
        for _ in range(4):  # burst 2, then 1/s: the 3rd and 4th wait
            created.append(await client.create_job(SPEC, idempotency_key=uuid.uuid4().hex))
        assert time.monotonic() - started >= 1.5
        with pytest.raises(RateLimitedError):
            await client.create_job(SPEC)  # no key: not resent
        await asyncio.sleep(2.1)
        for job in created:
            await client.cancel_job(job.id)


@dataclass
class Scripted:
    """An HTTP server that answers 503 with a Retry-After ``fails`` times, then 200."""

    fails: int
    retry_after: str
    seen: list[float] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def _handle(self, request: web.Request) -> web.Response:
        self.seen.append(time.monotonic())
        if len(self.seen) <= self.fails:
            return web.json_response(
                {"error": {"code": "storage_unavailable", "message": "failing over"}},
                status=503,
                headers={"Retry-After": self.retry_after},
            )
        return web.json_response({"items": [], "next_cursor": None})


async def test_a_503_with_an_http_date_retry_after_is_retried_for_a_read() -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=1), usegmt=True)
    server = Scripted(fails=1, retry_after=when)
    await server.start()
    try:
        async with AsyncDuetimeClient(server.url, "dt_x", retries=2) as client:
            page = await client.list_jobs()
        assert page.items == [] and len(server.seen) == 2
        assert server.seen[1] - server.seen[0] >= 0.5
        server.seen.clear()
        server.fails = 5
        with pytest.raises(ServiceUnavailableError):
            await asyncio.to_thread(
                DuetimeClient(server.url, "dt_x", retries=1, retry_after_max_s=5).pause_job, "j"
            )
        assert len(server.seen) == 1  # a pause is not resent
    finally:
        assert server._runner is not None
        await server._runner.cleanup()


@dataclass
class CountingProxy:
    """A TCP proxy in front of the node that counts the connections clients open."""

    upstream: tuple[str, int]
    connections: int = 0
    url: str = ""
    _server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_connect, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_the_sync_client_reuses_one_connection(pg_dsn: str) -> None:
    node = Node(fast_settings(pg_dsn), engine=False, workers=False)
    await node.start()
    assert node.store is not None and node.url is not None
    key, _ = await node.store.create_api_key(f"keep-{uuid.uuid4().hex[:8]}")
    host, port = node.url.removeprefix("http://").split(":")
    proxy = CountingProxy((host, int(port)))
    await proxy.start()
    try:

        def calls() -> None:
            with DuetimeClient(proxy.url, key) as client:
                job = client.create_job(SPEC)
                for _ in range(20):
                    client.get_job(job.id)
                client.list_jobs(limit=5)
                client.cancel_job(job.id)

        await asyncio.to_thread(calls)
        assert proxy.connections == 1
    finally:
        await proxy.stop()
        await node.stop()


async def test_both_clients_read_the_url_and_key_from_the_environment(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(fast_settings(pg_dsn), engine=False, workers=False)
    await node.start()
    assert node.store is not None and node.url is not None
    key, _ = await node.store.create_api_key(f"env-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("DUETIME_URL", node.url)
    monkeypatch.setenv("DUETIME_API_KEY", key)
    try:
        assert (await asyncio.to_thread(DuetimeClient().list_jobs)).items == []
        async with AsyncDuetimeClient() as client:
            assert (await client.list_jobs()).items == []
        # given ones win over the environment
        with pytest.raises(AuthenticationError):
            await asyncio.to_thread(DuetimeClient(key="dt_wrong").list_jobs)
    finally:
        await node.stop()
