"""A recording webhook target in its own process: it writes every call to an append-only file
and fsyncs it BEFORE it answers, so the record survives whatever happens to the answer (a
killed caller, a reset connection, a crash of the recorder itself after it answered).

Run it as ``python -m tests.faults.recorder --log FILE``; it prints one line
``recording on http://127.0.0.1:PORT`` once it listens. ``RecorderProcess`` does that for tests and
benchmarks and reads the file back as ``Record``s for ``tests.faults.checker``.

How a call is answered is chosen by its path, so a job's URL says how its target behaves:

=====================  ==========================================================================
``/ok/...``            200
``/status/<code>/...`` that status, always (a poison job: ``/status/400``; an outage: ``503``)
``/slow/<s>/...``      200 after ``s`` seconds (set ``s`` above the job's timeout for "2xx too late")
``/hang/...``          never answers
``/reset/...``         recorded, then the connection is reset (RST) without an answer
``/armed/...``         200, and after the answer has been handed to the kernel the recorder sends
                       the armed signal to the armed pid (``POST /__arm``): "the target answered
                       2xx, then the caller died before it recorded the outcome"
=====================  ==========================================================================

Records are fsynced in groups: every call waiting for the disk shares one ``fsync``, so the
target keeps up with thousands of calls a second and still never answers an unrecorded call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BODY_KEPT = 200  # characters of each body kept in the record (payload markers, not payloads)


@dataclass(frozen=True, slots=True)
class Record:
    """One call as the target saw it, read back from the recording."""

    key: str  # Idempotency-Key: "<job id>:<scheduled_for>"
    job_id: str
    scheduled_for: datetime
    attempt: int
    token: int  # Duetime-Fencing-Token
    arrived: datetime
    path: str
    status: int | None  # what the target answered (or was about to); None: it never answers
    body: str


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def record_from_json(line: str) -> Record:
    raw = json.loads(line)
    key = str(raw["key"])
    job_id, _, scheduled_for = key.partition(":")
    return Record(
        key=key,
        job_id=job_id,
        scheduled_for=parse_time(scheduled_for),
        attempt=int(raw["attempt"]),
        token=int(raw["token"]),
        arrived=datetime.fromtimestamp(raw["arrived_ns"] / 1e9, UTC),
        path=str(raw["path"]),
        status=raw["status"],
        body=str(raw["body"]),
    )


def read_records(path: Path) -> list[Record]:
    """Every complete line of the recording; a torn last line (a crash mid-write) is ignored."""
    out: list[Record] = []
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            out.append(record_from_json(line))
        except (ValueError, KeyError):
            continue
    return out


# ------------------------------------------------------------------ the server (child process)


class _GroupLog:
    """Append + fsync, shared: callers wait until their line is on disk."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._pending: list[tuple[bytes, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._flush_loop())
        self.count = 0

    async def append(self, line: bytes) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((line, future))
        self._wake.set()
        await future

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            if not batch:
                continue
            await asyncio.to_thread(self._write, b"".join(line for line, _ in batch))
            self.count += len(batch)
            for _, future in batch:
                if not future.done():
                    future.set_result(None)


def _status_for(parts: Sequence[str]) -> int | None:
    kind = parts[0] if parts else "ok"
    if kind == "status" and len(parts) > 1 and parts[1].isdigit():
        return int(parts[1])
    if kind in ("hang", "reset"):
        return None
    return 200


async def _serve(log_path: Path, host: str, port: int) -> None:
    from aiohttp import web

    group = _GroupLog(log_path)
    armed: dict[str, int] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        arrived_ns = time.time_ns()
        if request.path == "/__arm":
            armed.update({k: int(v) for k, v in (await request.json()).items()})
            return web.json_response({"armed": armed})
        if request.path == "/__count":
            return web.json_response({"count": group.count})
        body = await request.read()
        h = request.headers
        parts = [p for p in request.path.split("/") if p]
        status = _status_for(parts)
        record = {
            "key": h.get("Idempotency-Key", ""),
            "attempt": h.get("Duetime-Attempt", "0"),
            "token": h.get("Duetime-Fencing-Token", "0"),
            "arrived_ns": arrived_ns,
            "path": request.path,
            "status": status,
            "body": body.decode("utf-8", "replace")[:BODY_KEPT],
        }
        await group.append((json.dumps(record, separators=(",", ":")) + "\n").encode())
        kind = parts[0] if parts else "ok"
        if kind == "hang":
            await asyncio.sleep(3600)
        if kind == "reset":
            transport = request.transport
            if transport is not None:
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                transport.abort()
            raise asyncio.CancelledError  # nothing more to say on a connection that is gone
        if kind == "slow" and len(parts) > 1:
            await asyncio.sleep(float(parts[1]))
        response = web.StreamResponse(status=status or 200)
        response.content_length = 2
        await response.prepare(request)
        await response.write(b"ok")
        await response.write_eof()
        if kind == "armed" and armed.get("pid"):
            pid, sig = armed.pop("pid"), armed.pop("signal", signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"recording on http://{host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a webhook target that records every call durably")
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.run(_serve(args.log, args.host, args.port))
    except ImportError:  # pragma: no cover - uvloop is a dependency
        asyncio.run(_serve(args.log, args.host, args.port))


# ------------------------------------------------------------------ the handle (test side)


class RecorderProcess:
    """Starts the recorder as ``python -m tests.faults.recorder`` and reads its recording."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.url = ""
        self._proc: subprocess.Popen[str] | None = None

    def _spawn(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.faults.recorder", "--log", str(self.log_path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    async def start(self) -> None:
        self._proc = proc = await asyncio.to_thread(self._spawn)

        def first_line() -> str:
            assert proc.stdout is not None
            return proc.stdout.readline()

        line = await asyncio.wait_for(asyncio.to_thread(first_line), timeout=30)
        if not line.startswith("recording on "):
            raise RuntimeError(f"the recorder did not start: {line!r}")
        self.url = line.split()[-1]

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.to_thread(proc.wait), timeout=15)
        except TimeoutError:
            proc.kill()
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()

    async def _control(self, method: str, path: str, body: Any = None) -> Any:
        import aiohttp

        async with aiohttp.ClientSession() as http, http.request(method, self.url + path, json=body) as resp:
            return await resp.json()

    async def arm(self, pid: int, sig: int = signal.SIGKILL) -> None:
        """The next ``/armed`` call is answered 200, and then ``pid`` gets ``sig``."""
        await self._control("POST", "/__arm", {"pid": pid, "signal": int(sig)})

    async def count(self) -> int:
        return int((await self._control("GET", "/__count"))["count"])

    def records(self) -> list[Record]:
        return read_records(self.log_path)

    async def wait_for(self, count: int, within: float, prefix: str = "") -> list[Record]:
        """Until at least ``count`` records (on paths starting with ``prefix``) are on disk."""
        deadline = time.monotonic() + within
        while True:
            got = [r for r in self.records() if r.path.startswith(prefix)]
            if len(got) >= count:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"expected {count} calls on {prefix or '/'}, got {len(got)}")
            await asyncio.sleep(0.1)


if __name__ == "__main__":
    main()
