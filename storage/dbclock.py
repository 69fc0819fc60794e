"""One clock for the whole cluster: the database's.

Every process of a cluster used its own wall clock: a node whose clock ran 20 s ahead fired every
run 20 s before it was due, recorded a lateness of a few ms for it, and its retries and windows
moved with it. The rows' due instants are the database's (``next_run_at`` is compared with
``now()`` by every claim), so the database's clock is the one that decides.

``DatabaseClock`` is this process's reading of it: the local wall clock plus an offset measured on
round trips to the home database, NTP-style (the sample with the shortest round trip of the last
few wins, its uncertainty half that round trip). Readings are *conservative*: ``now_ms`` is the
database's time minus the uncertainty, so a run fired at its due instant by this clock is never
early by the database's, beyond nothing. A sample whose round trip is too long to be of use is
dropped; until one is had, the clock is *unknown* and an engine does not fire (see
``Engine.start``).

One per process (``DB_CLOCK``), measured by ``ClockSync`` (started by the composition root), and
read by the engine's wheel, the workers' attempt times, and the store's own "now" (retry times,
overlap windows, owner actions).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from prometheus_client import Gauge

log = logging.getLogger("duetime.clock")

CLOCK_OFFSET = Gauge(
    "duetime_clock_offset_seconds",
    "The database's clock minus this process's wall clock, as last measured (positive: this "
    "process's clock is behind)",
    ["process"],
)
CLOCK_UNCERTAINTY = Gauge(
    "duetime_clock_uncertainty_seconds",
    "Half the round trip of the clock sample in use: how far off the measured offset can be",
    ["process"],
)


@dataclass(frozen=True, slots=True)
class ClockSample:
    """One round trip: the local wall clock when it was sent and answered, the database's reading."""

    sent_ns: int
    received_ns: int
    db_ns: int

    @property
    def offset_ns(self) -> int:
        return self.db_ns - (self.sent_ns + self.received_ns) // 2

    @property
    def uncertainty_ns(self) -> int:
        return (self.received_ns - self.sent_ns) // 2


class DatabaseClock:
    """The database's time as this process reads it (see the module's docstring)."""

    def __init__(self, *, keep: int = 8) -> None:
        self._samples: deque[ClockSample] = deque(maxlen=keep)
        self._offset_ns = 0
        self._uncertainty_ns: int | None = None

    @property
    def known(self) -> bool:
        return self._uncertainty_ns is not None

    @property
    def offset_s(self) -> float:
        return self._offset_ns / 1e9

    @property
    def uncertainty_s(self) -> float | None:
        return None if self._uncertainty_ns is None else self._uncertainty_ns / 1e9

    def observe(self, sample: ClockSample) -> None:
        self._samples.append(sample)
        best = min(self._samples, key=lambda s: s.uncertainty_ns)
        self._offset_ns = best.offset_ns
        self._uncertainty_ns = best.uncertainty_ns

    def forget(self) -> None:
        """Back to unknown (tests; a process that must measure anew)."""
        self._samples.clear()
        self._offset_ns = 0
        self._uncertainty_ns = None

    # -- readings (the engine's Clock protocol: now_ms and monotonic)

    def now_ns(self) -> int:
        """The database's time now, minus the uncertainty: never ahead of it."""
        return time.time_ns() + self._offset_ns - (self._uncertainty_ns or 0)

    def now_ms(self) -> int:
        return self.now_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=self.now_ns() // 1000)


DB_CLOCK = DatabaseClock()


class ClockSync:
    """Measures ``clock``'s offset every ``interval_s`` with ``read_db_time`` (one round trip to the
    home database). Samples with a round trip longer than twice ``max_uncertainty_s`` are of no use
    and dropped; an offset past ``warn_offset_s`` is logged (and alerted on, from the gauge)."""

    def __init__(
        self,
        read_db_time: Callable[[], Awaitable[datetime]],
        *,
        process: str,
        clock: DatabaseClock = DB_CLOCK,
        interval_s: float = 5.0,
        max_uncertainty_s: float = 2.0,
        warn_offset_s: float = 1.0,
    ) -> None:
        self._read = read_db_time
        self._process = process
        self._clock = clock
        self._interval = interval_s
        self._max_uncertainty_ns = int(max_uncertainty_s * 1e9)
        self._warn_ns = int(warn_offset_s * 1e9)
        self._warned = False

    async def measure(self) -> bool:
        """One sample; True when it was usable."""
        sent = time.time_ns()
        db = await self._read()
        received = time.time_ns()
        sample = ClockSample(sent, received, _ns(db))
        if sample.uncertainty_ns > self._max_uncertainty_ns:
            log.warning(
                "a clock sample's round trip took %.1f s: too long to measure the offset by; dropped",
                (received - sent) / 1e9,
            )
            return False
        self._clock.observe(sample)
        CLOCK_OFFSET.labels(self._process).set(self._clock.offset_s)
        CLOCK_UNCERTAINTY.labels(self._process).set(self._clock.uncertainty_s or 0.0)
        off = abs(self._clock.offset_s * 1e9)
        if off > self._warn_ns and not self._warned:
            log.warning(
                "this host's clock is %+.3f s off the database's; Duetime times everything by the "
                "database's clock, but check NTP on this host",
                -self._clock.offset_s,
            )
        self._warned = off > self._warn_ns
        return True

    async def until_known(self, within_s: float) -> None:
        """Measure until the clock is known, or raise after ``within_s``."""
        deadline = time.monotonic() + within_s
        while True:
            cause: Exception | None = None
            try:
                if await self.measure():
                    return
                why = "every round trip took too long"
            except Exception as exc:
                why, cause = str(exc), exc
            if time.monotonic() > deadline:
                raise RuntimeError(f"the database's clock could not be measured: {why}") from cause
            await asyncio.sleep(0.2)

    async def run(self) -> None:
        """The supervised loop: a sample every interval; a failed one leaves the last offset."""
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.measure()
            except Exception as exc:  # the database away: keep the offset we have
                log.debug("clock sample failed: %s", exc)


def _ns(t: datetime) -> int:
    delta = t - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
