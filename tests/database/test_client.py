"""The owners' client (sync and async), the ``duetime jobs`` command and the example receiver,
each against a real in-process node (API, engine and workers on the test database)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from duetime.app import Node
from duetime.client import (
    AsyncDuetimeClient,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    DuetimeApiError,
    DuetimeClient,
    DuetimeConnectionError,
    DuetimeTimeoutError,
    Job,
    NotFoundError,
    ValidationError,
)
from duetime.core.signing import sign
from duetime.receiver import Deduplicator, DeliveryHeaders, FencingGuard, MemoryIdempotencyStore
from tests.support.node import at, fast_settings
from tests.support.receiver import Receiver

REPO = Path(__file__).resolve().parents[2]
FAR_CRON = {"cron": "0 0 1 1 *", "timezone": "Europe/Berlin"}


@dataclass
class Served:
    node: Node
    url: str
    key: str
    secret: str
    receiver: Receiver


@pytest.fixture(scope="module")
async def served(pg_dsn: str) -> AsyncIterator[Served]:
    receiver = Receiver()
    await receiver.start()
    node = Node(fast_settings(pg_dsn))
    await node.start()
    assert node.store is not None and node.url is not None
    key, secret = await node.store.create_api_key(f"client-{uuid.uuid4().hex[:8]}")
    try:
        yield Served(node, node.url, key, secret, receiver)
    finally:
        async with AsyncDuetimeClient(node.url, key) as client:
            async for job in client.iter_jobs(state="scheduled", page_size=1000):
                await client.cancel_job(job.id)
        await node.stop()
        await receiver.stop()


def _webhook_spec(served: Served, path: str, **extra: Any) -> dict[str, Any]:
    return {"target": {"type": "webhook", "url": served.receiver.url + path}, "schedule": FAR_CRON, **extra}


def _wait(predicate: Callable[[], Any], within: float = 20.0) -> Any:
    """Poll from a worker thread (the node runs on the test's event loop)."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


# --- sync client ------------------------------------------------------------------------------------


def _sync_scenario(served: Served) -> None:
    client = DuetimeClient(served.url, served.key, timeout_s=10)
    spec = _webhook_spec(served, "/sync", name="sync", payload={"n": 1})
    job = client.create_job(spec, idempotency_key="sync-key-1")
    assert isinstance(job, Job) and job.state == "scheduled" and job.name == "sync"
    assert job.next_run_at is not None and job.next_run_at.tzinfo is not None
    assert job.schedule["timezone"] == "Europe/Berlin" and job.raw["id"] == job.id
    assert client.create_job(spec, idempotency_key="sync-key-1").id == job.id
    with pytest.raises(ValidationError) as reused:
        client.create_job({**spec, "name": "other"}, idempotency_key="sync-key-1")
    assert (reused.value.status, reused.value.code) == (422, "idempotency_key_reused")

    assert client.get_job(job.id) == job
    assert client.update_job(job.id, {"name": "renamed"}).name == "renamed"
    assert client.pause_job(job.id).state == "paused"
    assert client.resume_job(job.id).state == "scheduled"
    with pytest.raises(ConflictError) as conflict:
        client.replay_job(job.id)
    assert conflict.value.status == 409

    assert client.trigger_job(job.id).id == job.id
    runs = _wait(lambda: [r for r in client.list_runs(job.id).items if r.outcome == "succeeded"])
    assert runs[0].status_code == 200 and runs[0].attempt == 1
    assert [r.outcome for r in client.iter_runs(job.id, page_size=1)] == [
        r.outcome for r in client.list_runs(job.id).items
    ]

    backfill = client.backfill_job(job.id, "2020-01-01T00:00:00Z", datetime(2023, 1, 1, tzinfo=UTC))
    assert (backfill.job_id, backfill.queued) == (job.id, 3)
    assert backfill.first == datetime(2020, 12, 31, 23, 0, tzinfo=UTC)  # Berlin's New Year, in UTC
    assert backfill.last == datetime(2022, 12, 31, 23, 0, tzinfo=UTC)
    backfilled = _wait(
        lambda: [r for r in client.list_runs(job.id).items if r.scheduled_for.year < 2023] or None
    )
    assert len(backfilled) >= 1
    with pytest.raises(ValidationError) as empty_range:
        client.backfill_job(job.id, "2000-01-01T00:00:00Z", "2000-01-01T00:00:00Z")
    assert empty_range.value.field == "to"

    preview = client.preview_job(job.id, count=3)
    assert preview.job_id == job.id and len(preview.items) == 3 and preview.has_more
    assert all(i.due_at is not None for i in preview.items)
    berlin = client.preview_schedule(
        {"cron": "30 2 * * *", "timezone": "Europe/Berlin"}, count=2, start=datetime(2026, 3, 28, tzinfo=UTC)
    )
    assert [(i.local, i.dst, i.shifted_from) for i in berlin.items] == [
        ("2026-03-28T02:30:00", None, None),
        ("2026-03-29T03:00:00", "gap_shifted", "2026-03-29T02:30:00"),
    ]
    with pytest.raises(ValueError, match="naive"):
        client.preview_schedule({"cron": "* * * * *"}, start=datetime(2026, 1, 1))

    cancelled = client.cancel_job(job.id)
    assert cancelled.state == "cancelled"
    assert client.cancel_job(job.id).state == "cancelled"

    with pytest.raises(NotFoundError) as missing:
        client.get_job(str(uuid.uuid4()))
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    with pytest.raises(NotFoundError):
        client.get_job("../../v1/jobs")  # quoted into one path segment: never another route
    with pytest.raises(ValidationError) as invalid:
        client.create_job({**spec, "schedule": {"cron": "61 * * * *"}})
    assert invalid.value.field == "schedule.cron" and invalid.value.code == "invalid_cron"
    with pytest.raises(BadRequestError) as wrong:
        client.create_job({**spec, "jitter_s": "5"})
    assert (wrong.value.status, wrong.value.code, wrong.value.field) == (400, "wrong_type", "jitter_s")
    with pytest.raises(AuthenticationError):
        DuetimeClient(served.url, "dt_not-a-key").get_job(job.id)
    with pytest.raises(AuthenticationError):
        DuetimeClient(served.url).list_jobs()


async def test_sync_client_covers_every_call(served: Served) -> None:
    await asyncio.to_thread(_sync_scenario, served)


def _pagination_scenario(served: Served) -> None:
    client = DuetimeClient(served.url, served.key)
    made = {client.create_job(_webhook_spec(served, "/page", name=f"p{n}")).id for n in range(7)}
    for job_id in list(made)[:3]:
        client.pause_job(job_id)
    listed = [j.id for j in client.iter_jobs(page_size=2)]
    assert len(listed) == len(set(listed)), "a job listed twice"
    assert made <= set(listed)
    paused = {j.id for j in client.iter_jobs(state="paused", page_size=2)}
    assert paused >= set(list(made)[:3]) and not paused & set(list(made)[3:])
    page = client.list_jobs(limit=2)
    assert len(page.items) == 2 and page.next_cursor is not None
    with pytest.raises(ValidationError) as bad:
        client.list_jobs(limit=0)
    assert bad.value.field == "limit"
    for job_id in made:
        client.cancel_job(job_id)


async def test_sync_client_iterates_every_page(served: Served) -> None:
    await asyncio.to_thread(_pagination_scenario, served)


# --- async client -----------------------------------------------------------------------------------


async def test_async_client_covers_every_call(served: Served) -> None:
    async with AsyncDuetimeClient(served.url, served.key, timeout_s=10) as client:
        spec = _webhook_spec(served, "/async", name="async")
        job = await client.create_job(spec, idempotency_key=f"async-{uuid.uuid4()}")
        assert await client.get_job(job.id) == job
        assert (await client.update_job(job.id, {"jitter_s": 5})).jitter_s == 5
        assert (await client.pause_job(job.id)).state == "paused"
        assert (await client.resume_job(job.id)).state == "scheduled"
        await client.trigger_job(job.id)
        await served.receiver.wait_for("/async", 1)
        runs: list[Any] = []
        for _ in range(200):
            runs = [r async for r in client.iter_runs(job.id)]
            if runs:
                break
            await asyncio.sleep(0.05)
        assert runs and runs[0].outcome == "succeeded"
        assert job.id in [j.id async for j in client.iter_jobs(page_size=3)]
        page = await client.list_runs(job.id, limit=1)
        assert len(page.items) == 1
        backfill = await client.backfill_job(job.id, datetime(2024, 1, 1, tzinfo=UTC), "2026-01-01T00:00:00Z")
        assert backfill.queued == 2 and backfill.raw["job_id"] == job.id
        preview = await client.preview_job(job.id, count=2, start="2026-10-24T00:00:00Z")
        assert [i.at for i in preview.items] == [
            datetime(2026, 12, 31, 23, 0, tzinfo=UTC),
            datetime(2027, 12, 31, 23, 0, tzinfo=UTC),
        ]
        schedule_preview = await client.preview_schedule(
            {"cron": "30 1 * * *", "timezone": "America/New_York", "dst_overlap": "both"},
            count=2,
            start=datetime(2026, 11, 1, tzinfo=UTC),
        )
        assert [i.dst for i in schedule_preview.items] == ["overlap_first", "overlap_second"]
        with pytest.raises(ConflictError):
            await client.replay_job(job.id)
        assert (await client.cancel_job(job.id)).state == "cancelled"
        with pytest.raises(NotFoundError):
            await client.get_job(str(uuid.uuid4()))
        with pytest.raises(ValidationError) as invalid:
            await client.preview_schedule({"cron": "* * * * *", "timezone": "EST"})
        assert (invalid.value.code, invalid.value.field) == ("invalid_timezone", "schedule.timezone")
    async with AsyncDuetimeClient(served.url, "dt_wrong") as anonymous:
        with pytest.raises(AuthenticationError) as denied:
            await anonymous.list_jobs()
        assert denied.value.status == 401 and isinstance(denied.value, DuetimeApiError)


# --- retries and timeouts ---------------------------------------------------------------------------


@dataclass
class Misbehaving:
    """A TCP server that hangs up at once (``hang=False``) or never answers (``hang=True``)."""

    hang: bool
    connections: int = 0
    url: str = ""
    _server: asyncio.Server | None = None
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def __aenter__(self) -> Misbehaving:
        self._server = await asyncio.start_server(self._on_connect, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        for writer in self._writers:
            writer.close()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.hang:
            self._writers.append(writer)
            return
        await reader.read(1)
        writer.close()


async def test_connection_failures_are_retried_only_for_idempotent_calls() -> None:
    async with Misbehaving(hang=False) as server:
        sync = DuetimeClient(server.url, "dt_x", retries=2, retry_backoff_s=0.01)
        job_id = str(uuid.uuid4())
        cases: list[tuple[str, Callable[[], Any], int]] = [
            ("get", lambda: sync.get_job(job_id), 3),
            ("cancel", lambda: sync.cancel_job(job_id), 3),
            ("create with key", lambda: sync.create_job({"x": 1}, idempotency_key="k"), 3),
            ("create without key", lambda: sync.create_job({"x": 1}), 1),
            ("trigger", lambda: sync.trigger_job(job_id), 1),
            ("pause", lambda: sync.pause_job(job_id), 1),
        ]
        for name, call, expected in cases:
            before = server.connections
            with pytest.raises(DuetimeConnectionError):
                await asyncio.to_thread(call)
            assert server.connections - before == expected, name
        async with AsyncDuetimeClient(server.url, "dt_x", retries=1, retry_backoff_s=0.01) as client:
            before = server.connections
            with pytest.raises(DuetimeConnectionError):
                await client.preview_job(job_id)
            assert server.connections - before == 2
            before = server.connections
            with pytest.raises(DuetimeConnectionError):
                await client.replay_job(job_id)
            assert server.connections - before == 1


async def test_timeouts_raise_a_typed_error() -> None:
    async with Misbehaving(hang=True) as server:
        sync = DuetimeClient(server.url, "dt_x", timeout_s=0.3, retries=1, retry_backoff_s=0.01)
        with pytest.raises(DuetimeTimeoutError, match=r"within 0\.3 s"):
            await asyncio.to_thread(sync.list_jobs)
        assert server.connections == 2
        async with AsyncDuetimeClient(server.url, "dt_x", timeout_s=0.3, retries=1) as client:
            with pytest.raises(DuetimeTimeoutError):
                await client.trigger_job(str(uuid.uuid4()))
        assert server.connections == 3


async def test_a_closed_port_is_a_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(DuetimeConnectionError, match="cannot reach") as refused:
        await asyncio.to_thread(DuetimeClient(url, retries=0).get_job, "x")
    assert not isinstance(refused.value, DuetimeTimeoutError)
    async with AsyncDuetimeClient(url, retries=0) as client:
        with pytest.raises(DuetimeConnectionError):
            await client.get_job("x")


# --- the command line -------------------------------------------------------------------------------


async def duetime_jobs(
    served: Served | None, *args: str, stdin: bytes | None = None, **env: str
) -> tuple[int, Any, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    if served is not None:
        environ.update(DUETIME_URL=served.url, DUETIME_API_KEY=served.key)
    environ.update(env)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "duetime",
        "jobs",
        *args,
        env=environ,
        cwd=str(REPO),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, json.loads(out) if proc.returncode == 0 else out.decode(), err.decode()


def _one_error_line(code: int, out: Any, err: str, *, status: int) -> str:
    assert code == status, (code, out, err)
    assert out == "" and "Traceback" not in err
    [line] = err.strip().splitlines()
    assert line.startswith("duetime: ")
    return line


async def test_cli_jobs_lifecycle(served: Served) -> None:
    code, job, err = await duetime_jobs(
        served,
        "create",
        "--name",
        "from-flags",
        "--url",
        served.receiver.url + "/cli",
        "--cron",
        "0 0 1 1 *",
        "--tz",
        "Europe/Berlin",
        "--payload",
        '{"a": 1}',
    )
    assert code == 0, err
    assert (job["name"], job["payload"], job["schedule"]["timezone"]) == (
        "from-flags",
        {"a": 1},
        "Europe/Berlin",
    )
    assert job["target"]["url"] == served.receiver.url + "/cli"
    job_id = job["id"]

    spec = json.dumps(_webhook_spec(served, "/cli-stdin", name="from-stdin"))
    code, from_stdin, err = await duetime_jobs(
        served, "create", "-f", "-", "--name", "overridden", stdin=spec.encode()
    )
    assert code == 0, err
    assert from_stdin["name"] == "overridden" and from_stdin["target"]["url"].endswith("/cli-stdin")

    results = await asyncio.gather(
        duetime_jobs(served, "get", job_id),
        duetime_jobs(served, "list", "--all", "--limit", "2"),
        duetime_jobs(served, "preview", job_id, "--count", "3"),
        duetime_jobs(
            served,
            "preview",
            "--cron",
            "30 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--dst-gap",
            "skip",
            "--from",
            "2026-03-28T00:00:00Z",
            "--count",
            "2",
        ),
    )
    for code, _, err in results:
        assert code == 0, err
    (_, got, _), (_, listed, _), (_, preview, _), (_, schedule_preview, _) = results
    assert got["id"] == job_id
    ids = [j["id"] for j in listed["items"]]
    assert {job_id, from_stdin["id"]} <= set(ids) and len(ids) == len(set(ids))
    assert listed["next_cursor"] is None
    assert preview["job_id"] == job_id and len(preview["items"]) == 3
    assert [i["at"] for i in schedule_preview["items"]] == ["2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z"]
    assert schedule_preview["skipped"][0]["first_skipped"] == "2026-03-29T02:30:00"

    code, paused, err = await duetime_jobs(served, "pause", job_id)
    assert (code, paused["state"]) == (0, "paused"), err
    code, resumed, err = await duetime_jobs(served, "resume", job_id)
    assert (code, resumed["state"]) == (0, "scheduled"), err
    code, _, err = await duetime_jobs(served, "trigger", job_id)
    assert code == 0, err
    code, backfill, err = await duetime_jobs(
        served, "backfill", job_id, "--from", "2025-01-01T00:00:00Z", "--to", "2026-01-01T00:00:00Z"
    )
    assert (code, backfill["queued"], backfill["first"]) == (0, 1, "2025-12-31T23:00:00Z"), err
    await served.receiver.wait_for("/cli", 1)
    for _ in range(100):
        code, runs, err = await duetime_jobs(served, "runs", job_id)
        assert code == 0, err
        if runs["items"]:
            break
        await asyncio.sleep(0.2)
    assert runs["items"][0]["outcome"] == "succeeded"
    for target in (job_id, from_stdin["id"]):
        code, cancelled, err = await duetime_jobs(served, "cancel", target)
        assert (code, cancelled["state"]) == (0, "cancelled"), err


async def test_cli_every_and_exclude(served: Served) -> None:
    code, job, err = await duetime_jobs(
        served,
        "create",
        "--url",
        served.receiver.url + "/cli-every",
        "--every",
        "1h30m",
        "--start-at",
        "2030-01-01T00:00:00Z",
        "--tz",
        "Europe/Berlin",
        "--exclude",
        "2030-01-01",
        "--exclude",
        "2030-01-03..2030-01-04",
    )
    assert code == 0, err
    assert job["schedule"] == {
        "every": "1h30m",
        "start_at": "2030-01-01T00:00:00Z",
        "end_at": None,
        "timezone": "Europe/Berlin",
        "exclude": ["2030-01-01", {"from": "2030-01-03", "to": "2030-01-04"}],
    }
    # 1 January in Berlin runs to 23:00Z, so 22:30Z (23:30 local) is still excluded; the first
    # occurrence is 00:00Z on the 2nd (01:00 local)
    assert job["next_run_at"] == "2030-01-02T00:00:00Z"
    code, preview, err = await duetime_jobs(
        served,
        "preview",
        "--every",
        "7d",
        "--start-at",
        "2030-01-01T00:00:00Z",
        "--exclude",
        "2030-01-08",
        "--count",
        "2",
    )
    assert code == 0, err
    assert [i["at"] for i in preview["items"]] == ["2030-01-01T00:00:00Z", "2030-01-15T00:00:00Z"]
    assert [e["at"] for e in preview["excluded"]] == ["2030-01-08T00:00:00Z"]
    results = await asyncio.gather(
        duetime_jobs(served, "create", "--url", "https://example.com/x", "--every", "90"),
        duetime_jobs(
            served, "create", "--url", "https://example.com/x", "--start-at", "2030-01-01T00:00:00Z"
        ),
        duetime_jobs(
            served, "create", "--url", "https://example.com/x", "--every", "1h", "--cron", "* * * * *"
        ),
    )
    bad_every = _one_error_line(*results[0], status=1)
    lone_start, both = (_one_error_line(*r, status=2) for r in results[1:])
    assert "[invalid_every, field schedule.every; HTTP 422]" in bad_every
    assert "--start-at goes with --every" in lone_start
    assert "not --cron and --every" in both
    await duetime_jobs(served, "cancel", job["id"])


async def test_cli_errors_exit_1_with_the_apis_message_and_2_for_usage(served: Served) -> None:
    missing = str(uuid.uuid4())
    results = await asyncio.gather(
        duetime_jobs(served, "get", missing),
        duetime_jobs(served, "create", "--url", "https://example.com/x", "--cron", "61 * * * *"),
        duetime_jobs(served, "list", DUETIME_API_KEY=""),
        duetime_jobs(None, "--url", "http://127.0.0.1:9", "get", missing),
        duetime_jobs(served, "create"),
        duetime_jobs(served, "create", "--cron", "* * * * *", "--run-at", "2030-01-01T00:00:00Z"),
        duetime_jobs(served, "create", "-f", "/nonexistent/spec.json"),
        duetime_jobs(served, "preview"),
    )
    # the operation failed (the API said no, or could not be reached): 1; the command line: 2
    lines = [_one_error_line(*result, status=1) for result in results[:4]]
    lines += [_one_error_line(*result, status=2) for result in results[4:]]
    not_found, bad_cron, no_key, unreachable, empty, both, no_file, no_preview = lines
    assert not_found == f"duetime: no job {missing} [not_found; HTTP 404]"
    assert "[invalid_cron, field schedule.cron; HTTP 422]" in bad_cron
    assert "DUETIME_API_KEY" in no_key and "--api-key" in no_key and "HTTP 401" in no_key
    assert "cannot reach http://127.0.0.1:9" in unreachable
    assert "--file" in empty
    assert "not --cron and --run-at" in both
    assert "cannot read /nonexistent/spec.json" in no_file
    assert "job ID or a schedule" in no_preview


# --- the example receiver ---------------------------------------------------------------------------


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "receiver_aiohttp", REPO / "examples" / "receiver_aiohttp.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_example_receiver_verifies_fences_and_deduplicates(served: Served) -> None:
    example = _load_example()
    done: list[tuple[DeliveryHeaders, Any]] = []
    failures = {"left": 1}

    async def work(delivery: DeliveryHeaders, payload: Any) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("downstream hiccup")  # a 500: Duetime retries, the key is freed
        done.append((delivery, payload))

    app = example.make_app(served.secret, Deduplicator(MemoryIdempotencyStore()), FencingGuard(), work)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    try:
        async with AsyncDuetimeClient(served.url, served.key) as client:
            job = await client.create_job(
                {
                    "target": {"type": "webhook", "url": url},
                    "schedule": {"run_at": at(1)},
                    "payload": {"invoice": 7},
                    "retry": {"max_attempts": 3, "backoff_initial_s": 0.2, "backoff_max_s": 0.5},
                }
            )
            for _ in range(300):
                job = await client.get_job(job.id)
                if job.state != "scheduled":
                    break
                await asyncio.sleep(0.05)
            assert job.state == "completed", job
            runs = [r async for r in client.iter_runs(job.id)]
            assert [(r.attempt, r.outcome, r.status_code) for r in reversed(runs)] == [
                (1, "failed", 500),
                (2, "succeeded", 200),
            ]
        [(delivery, payload)] = done
        assert payload == {"invoice": 7} and delivery.job_id == job.id and delivery.attempt == 2

        async with aiohttp.ClientSession() as session:

            async def call(
                token: int, secret: str = served.secret, key: str = delivery.idempotency_key
            ) -> int:
                body = json.dumps({"invoice": 7}).encode()
                ts = int(datetime.now(UTC).timestamp())
                headers = {
                    "Content-Type": "application/json",
                    "Idempotency-Key": key,
                    "Duetime-Job-Id": delivery.job_id,
                    "Duetime-Scheduled-For": delivery.scheduled_for,
                    "Duetime-Attempt": "3",
                    "Duetime-Fencing-Token": str(token),
                    "webhook-id": key,
                    "webhook-timestamp": str(ts),
                    "webhook-signature": sign(secret, key, ts, body),
                }
                async with session.post(url, data=body, headers=headers) as resp:
                    return resp.status

            token = delivery.fencing_token
            assert await call(token) == 200  # a redelivery of done work: acknowledged, not redone
            assert await call(token - 1) == 409  # a stale lease holder
            assert await call(token, secret="whsec_" + "QUFB" * 8) == 401
            assert await call(token + 1, key=f"{job.id}:{at(3600)}") == 200  # a new occurrence
        assert len(done) == 2
    finally:
        await runner.cleanup()


async def test_cli_jobs_update_patches_only_what_it_is_given(served: Served) -> None:
    # --webhook-url names the job's target; the server comes from --server/--api-key, not the env
    code, job, err = await duetime_jobs(
        None,
        "--server",
        served.url,
        "--api-key",
        served.key,
        "create",
        "--webhook-url",
        served.receiver.url + "/upd",
        "--method",
        "PUT",
        "--cron",
        "0 0 1 1 *",
        "--name",
        "before",
    )
    assert code == 0, err
    code, changed, err = await duetime_jobs(
        served, "update", job["id"], "--name", "after", "--cron", "0 3 * * *", "--tz", "Europe/Berlin"
    )
    assert code == 0, err
    assert changed["name"] == "after"
    assert changed["schedule"]["cron"] == "0 3 * * *" and changed["schedule"]["timezone"] == "Europe/Berlin"
    assert changed["target"] == job["target"]  # untouched
    code, moved, err = await duetime_jobs(served, "update", job["id"], "--url", served.receiver.url + "/upd2")
    assert code == 0, err
    assert moved["target"]["url"].endswith("/upd2") and moved["target"]["method"] == "PUT"  # merged
    code, out, err = await duetime_jobs(served, "update", job["id"])
    assert "fields to change" in _one_error_line(code, out, err, status=2)
    code, out, err = await duetime_jobs(served, "update", str(uuid.uuid4()), "--name", "x")
    assert "HTTP 404" in _one_error_line(code, out, err, status=1)
    code, _, err = await duetime_jobs(served, "cancel", job["id"])
    assert code == 0, err


async def test_cli_reads_the_key_from_stdin_and_warns_when_it_is_a_visible_flag(served: Served) -> None:
    """A key in argv shows in `ps` to every user of the machine (issue 17, item 9)."""
    code, out, err = await duetime_jobs(
        None, "--url", served.url, "--api-key-file", "-", "list", stdin=(served.key + "\n").encode()
    )
    assert code == 0, (out, err)
    assert "items" in out and err == ""
    for flag in ("--api-key", "--key"):
        code, out, err = await duetime_jobs(None, "--url", served.url, flag, served.key, "list")
        assert code == 0, (flag, out, err)
        assert "visible to other users" in err and served.key not in err
    code, out, err = await duetime_jobs(served, "list")  # DUETIME_API_KEY: no warning
    assert code == 0 and err == "", err


async def test_cli_jobs_output_table_for_a_person(served: Served) -> None:
    """``-o table`` prints the same answer as rows a person reads; ``-o json`` stays the default."""
    code, job, err = await duetime_jobs(
        served,
        "create",
        "--webhook-url",
        served.receiver.url + "/tbl",
        "--cron",
        "0 0 1 1 *",
        "--name",
        "tbl",
    )
    assert code == 0, err
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    environ.update(DUETIME_URL=served.url, DUETIME_API_KEY=served.key)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "duetime",
        "jobs",
        "-o",
        "table",
        "get",
        job["id"],
        env=environ,
        cwd=str(REPO),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err_bytes = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err_bytes.decode()
    lines = out.decode().splitlines()
    assert lines[0].split() == ["FIELD", "VALUE"]
    assert any(line.split()[:2] == ["id", job["id"]] for line in lines)
    assert any(line.split()[:2] == ["name", "tbl"] for line in lines)
    code, _, err = await duetime_jobs(served, "cancel", job["id"])
    assert code == 0, err
