"""Real ``duetime`` processes for the tests that need them (and the cluster benchmark): one
launcher, ``DuetimeProcess``, that starts ``python -m duetime ARGS``, waits for its ready line,
signals, waits for and kills it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_STARTED: list[DuetimeProcess] = []


def started_count() -> int:
    """How many processes have been started so far (a mark for ``kill_leftovers``)."""
    return len(_STARTED)


def kill_leftovers(since: int) -> list[str]:
    """SIGKILL every process started after the mark ``since`` that is still alive; name them.

    A test that fails between ``start()`` and its own cleanup would otherwise leave an engine
    running into the next tests, claiming and firing their jobs (this happened in CI). Processes
    of module-scoped fixtures are started before the mark and live on."""
    names = []
    for proc in _STARTED[since:]:
        if proc.alive:
            names.append(proc.name)
        proc.kill()
    del _STARTED[since:]
    return names


class DuetimeProcess:
    """``python -m duetime ARGS`` with its output in a log file (a pipe nobody reads would block a
    chatty process); ``ready()`` waits for the line the CLI prints once the part serves."""

    def __init__(self, name: str, env: dict[str, str], args: Sequence[str], logdir: Path) -> None:
        self.name = name
        self.args = list(args)
        self.env = env
        self.log_path = logdir / f"{name}.log"
        self._log: Any = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DuetimeProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()/kill()
        self._offset = self.log_path.stat().st_size
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "duetime", *self.args],
            env={**os.environ, **self.env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        _STARTED.append(self)
        return self

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[self._offset :]

    async def ready(self, needle: str = "is running", within: float = 60.0) -> str:
        deadline = time.monotonic() + within
        while True:
            text = self.output()
            for line in text.splitlines():
                if needle in line or "serving" in line:
                    return line
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{text[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not become ready:\n{text[-3000:]}")
            await asyncio.sleep(0.1)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def wait(self, within: float = 60.0) -> int:
        assert self.proc is not None
        proc = self.proc
        try:
            return await asyncio.wait_for(asyncio.to_thread(proc.wait), timeout=within)
        finally:
            self._close_log()

    async def terminate(self, within: float = 60.0) -> int:
        self.signal(signal.SIGTERM)
        return await self.wait(within)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
