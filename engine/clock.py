"""Injected time for the engine.

Due instants are wall instants (a job is due at 12:00:00 UTC, not "n seconds after boot"), so the
wheel is driven by wall-clock epoch milliseconds. Elapsed-time measurements (lease half-life,
back-off) want a clock that never steps, hence the second reading. Tests swap in ``FakeClock`` and
move time by hand instead of sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "FakeClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """What the engine asks of time: a wall reading for due instants, a steady one for durations."""

    def now_ms(self) -> int:
        """Wall-clock milliseconds since the Unix epoch (UTC); may step forward or backward."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backward; only differences are meaningful."""
        ...


class SystemClock:
    """The real clocks; ``time_ns`` avoids the float rounding of ``time.time()`` at ms precision."""

    __slots__ = ()

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when a test says so.

    ``advance`` models time passing (wall and monotonic move together); ``set`` models an NTP step
    or an operator changing the wall clock, which moves the wall reading only, in either direction,
    exactly as a real monotonic clock would ignore it.
    """

    __slots__ = ("_mono", "_now_ms")

    def __init__(self, start_ms: int = 0, *, monotonic_start: float = 0.0) -> None:
        self._now_ms = int(start_ms)
        self._mono = float(monotonic_start)

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, ms: int) -> None:
        """Let ``ms`` milliseconds pass; negative values are refused because time does not rewind."""
        if ms < 0:
            raise ValueError(f"advance({ms}): time passing cannot be negative; use set() to step back")
        self._now_ms += int(ms)
        self._mono += ms / 1000.0

    def set(self, ms: int) -> None:
        """Step the wall clock to ``ms`` (forward or backward) without touching the monotonic one."""
        self._now_ms = int(ms)
