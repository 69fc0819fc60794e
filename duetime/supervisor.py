"""Every long-running task of a process runs under one supervisor: a task that fails is restarted
with backoff, not left dead behind a process that still answers /readyz.

Why: a loop that ends on an error nobody expected stops its part of the run path for good and,
mostly, silently (one deadlock on a history insert once ended a completion writer: every run due
afterwards was called and then stayed ``running`` with its lease kept alive). Crash-only is the
rule for the parts: a loop keeps what it must not lose in its owner's state, so starting its body
again is always safe; the supervisor does that, says so in one log line with the cause, counts it
in ``duetime_task_restarts_total{task}``, and reports a task that has been down longer than the
caller allows (one lease) so /readyz turns red.

Backoff doubles from ``min_backoff_s`` to ``max_backoff_s`` with full jitter (so tasks that failed
together do not restart together) and starts over once a body has run for ``healthy_after_s``.

One supervisor per process (``SUPERVISOR``), as there is one event loop and one metrics registry
per process. ``Backoff`` is also what the writers use to retry a database error that is not
theirs (``duetime_storage_retries_total``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

log = logging.getLogger("duetime.supervisor")

TASK_RESTARTS = Counter(
    "duetime_task_restarts_total",
    "Long-running tasks restarted by the supervisor after they failed, by task",
    ["task"],
)
TASKS_DOWN = Gauge(
    "duetime_tasks_down",
    "Supervised tasks that failed and wait for their restart now",
)
STORAGE_RETRIES = Counter(
    "duetime_storage_retries_total",
    "Database work written again after an error that was not the work's fault (a deadlock, a "
    "serialization failure, a lock or statement timeout, a lost connection, a failover), by task "
    "and error",
    ["task", "error"],
)


def task_kind(name: str) -> str:
    """The metric label of a task: its name without the number of its copy
    (``duetime-completer-1`` and ``duetime-claim-7`` count as ``duetime-completer`` and
    ``duetime-claim``), so the series stay few however many copies run."""
    return re.sub(r"-\d+$", "", name)


def error_kind(exc: BaseException) -> str:
    """What failed, for a metric label: the database's own error class where the store translated
    one (``DeadlockDetectedError`` behind a ``Contended``), else the exception's type."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return type(cause).__name__


class Backoff:
    """Exponential backoff with full jitter: each ``next()`` waits up to twice the last bound."""

    def __init__(self, min_s: float = 0.1, max_s: float = 10.0) -> None:
        self._min = min_s
        self._max = max_s
        self._bound = min_s

    def next(self) -> float:
        delay = random.uniform(self._bound / 2, self._bound)
        self._bound = min(self._bound * 2, self._max)
        return delay

    def reset(self) -> None:
        self._bound = self._min


@dataclass(slots=True)
class _Down:
    since: float
    cause: str


class Supervisor:
    """Runs task bodies, restarting a body that raised; knows which tasks are down and since when."""

    def __init__(
        self,
        *,
        min_backoff_s: float = 0.1,
        max_backoff_s: float = 10.0,
        healthy_after_s: float = 30.0,
        up_after_s: float = 5.0,
    ) -> None:
        self._min = min_backoff_s
        self._max = max_backoff_s
        self._healthy_after = healthy_after_s
        self._up_after = up_after_s
        self._down: dict[asyncio.Task[None], _Down] = {}

    def spawn(
        self,
        name: str,
        body: Callable[[], Awaitable[None]],
        *,
        keep_going: Callable[[], bool] = lambda: True,
    ) -> asyncio.Task[None]:
        """Run ``body()`` as the task ``name``: restarted with backoff whenever it raises, until it
        returns, is cancelled, or ``keep_going()`` is false when it would be restarted."""
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(
            self._keep(name, body, keep_going), name=name
        )
        return task

    async def _keep(
        self, name: str, body: Callable[[], Awaitable[None]], keep_going: Callable[[], bool]
    ) -> None:
        """A task is down from its first failure until a restarted body has run ``up_after_s``
        without failing (or returned): a body that fails at every restart stays down however
        short each of its lives is."""
        backoff = Backoff(self._min, self._max)
        me = asyncio.current_task()
        assert me is not None
        loop = asyncio.get_running_loop()
        clear: asyncio.TimerHandle | None = None
        try:
            while True:
                started = time.monotonic()
                try:
                    await body()
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if clear is not None:
                        clear.cancel()
                    if not keep_going():
                        log.warning("%s failed while stopping (%s: %s)", name, type(exc).__name__, exc)
                        return
                    if time.monotonic() - started >= self._healthy_after:
                        backoff.reset()
                    delay = backoff.next()
                    # One line with the cause; the traceback at debug level, for whoever needs it.
                    log.error(
                        "task %s failed (%s: %s); restarting in %.1f s", name, type(exc).__name__, exc, delay
                    )
                    log.debug("task %s failed", name, exc_info=exc)
                    TASK_RESTARTS.labels(task_kind(name)).inc()
                    if me not in self._down:
                        self._down[me] = _Down(time.monotonic(), f"{type(exc).__name__}: {exc}")
                        TASKS_DOWN.set(len(self._down))
                await asyncio.sleep(delay)
                clear = loop.call_later(self._up_after, self._up, me)
        finally:
            if clear is not None:
                clear.cancel()
            self._up(me)

    def _up(self, task: asyncio.Task[None]) -> None:
        if self._down.pop(task, None) is not None:
            TASKS_DOWN.set(len(self._down))

    def down(self) -> dict[str, float]:
        """Tasks waiting for a restart now, and for how many seconds they have been down."""
        now = time.monotonic()
        return {task.get_name(): now - d.since for task, d in self._down.items()}

    def not_ready(self, longer_than_s: float) -> str | None:
        """Why this process is not ready, if a task has been down for longer than ``longer_than_s``
        (a body that fails at every restart); None otherwise."""
        now = time.monotonic()
        long_down = sorted(
            (task.get_name(), d) for task, d in self._down.items() if now - d.since > longer_than_s
        )
        if not long_down:
            return None
        name, d = long_down[0]
        more = f" (and {len(long_down) - 1} more)" if len(long_down) > 1 else ""
        return f"task {name} has been failing for {now - d.since:.0f} s: {d.cause}{more}"[:500]


SUPERVISOR = Supervisor()
