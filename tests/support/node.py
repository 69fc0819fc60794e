"""An in-process Duetime (API + engine + workers) on the test database, and an owner that talks
HTTP to its API like an owner would. The loopback webhook receiver is ``tests.support.receiver``."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from duetime.settings import Settings


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
