"""Give the C allocator's free memory back to the system once a burst has drained.

After a million-run burst a node's glibc heap kept 16-20 MB free that no live block used: the
wheel's burst-sized containers (a 16 MB set table, 4 MB lists) are large enough to be mmap'd on
their own, and freeing them raises glibc's dynamic mmap threshold to their size and its trim
threshold to twice that (32 MB), so every later allocation below 16 MB came from the heap, and
the heap's free top is only given back once more than 32 MB of it is free. ``malloc_trim(0)`` gives
back the free top and every free page inside the heap, whatever those thresholds are.

It is an allocator step, taken once per drained burst (the node's held runs back to zero after at
least ``min_burst`` of them), on glibc only (elsewhere nothing happens). It frees nothing that is
used and changes no setting: the next burst allocates as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

log = logging.getLogger("duetime.memory")

_trim: Callable[[int], int] | None = None
_looked_up = False


def _malloc_trim() -> Callable[[int], int] | None:
    global _trim, _looked_up
    if not _looked_up:
        _looked_up = True
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            fn = libc.malloc_trim  # glibc only: musl and others have no malloc_trim
            fn.argtypes = [ctypes.c_size_t]
            fn.restype = ctypes.c_int
            _trim = fn
        except (OSError, AttributeError):
            _trim = None
    return _trim


def release_free_memory() -> bool:
    """``malloc_trim(0)``: True if glibc gave memory back, False if not (or not glibc)."""
    fn = _malloc_trim()
    return bool(fn(0)) if fn is not None else False


class DrainWatch:
    """Releases the allocator's free memory when the runs a node holds fall back to zero after a
    burst. ``observe`` is called with the count now, every few seconds."""

    def __init__(self, min_burst: int = 10_000, release: Callable[[], bool] = release_free_memory) -> None:
        self._min_burst = min_burst
        self._release = release
        self._peak = 0
        self.releases = 0

    def observe(self, held: int) -> bool:
        """True when this call released memory (the first zero after a burst)."""
        if held:
            self._peak = max(self._peak, held)
            return False
        if self._peak < self._min_burst:
            return False
        peak, self._peak = self._peak, 0
        started = time.perf_counter()
        released = self._release()
        self.releases += 1
        log.info(
            "burst of %d held runs drained; free allocator memory %s in %.1f ms",
            peak,
            "given back" if released else "had nothing to give back",
            (time.perf_counter() - started) * 1000,
        )
        return True
