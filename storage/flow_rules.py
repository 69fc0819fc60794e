"""The rules of flow control (``target.flow``) both stores keep: how big a key's token bucket is,
how many calls one ask is granted, and which asks a store accepts at all.

``MemoryStore`` applies them in Python; ``PostgresStore`` in the function ``duetime_take_flow``
(migration 0015), which is handed each ask's capacity from here so the bucket's size is decided
in one place. The contract suite (tests/contract/test_flow_contract.py) holds the two equal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from duetime.storage.ports import FlowAsk

# A key's bucket holds half a second of its rate, and at least one call: a key idle for a while
# may start that many calls at once. Workers ask every 0.1-0.15 s (workers/pool.py FLOW_TICK_S
# and a round trip); a bucket smaller than that interval's worth overflows between two asks and
# the key runs below its rate (a tenth of a second's worth held 20/s to 16/s across two workers,
# tests/faults/test_flow_control.py). Half a second's burst is 5 % of a 10 s window: the
# contract's "within 10 %". Below 2 calls a second the one token is the burst.
BURST_S = 0.5
# A bucket untouched this long is full whatever its rate (the slowest rate, 0.01/s, refills its
# one token in 100 s), so deleting it changes nothing: the next ask makes it again, full. The
# function's sweep (migration 0015) deletes after the same 600 s.
IDLE_BUCKET_S = 600.0


def bucket_capacity(rate_per_s: float) -> float:
    """The most tokens a key's bucket holds at ``rate_per_s``."""
    return max(1.0, rate_per_s * BURST_S)


def refilled(tokens: float, elapsed_s: float, rate_per_s: float) -> float:
    """A bucket's tokens after ``elapsed_s`` seconds at ``rate_per_s`` (a negative elapsed time, a
    clock read before the previous refill's, adds nothing)."""
    return min(bucket_capacity(rate_per_s), tokens + max(0.0, elapsed_s) * rate_per_s)


def grant(ask: FlowAsk, *, tokens: float, others_held: int) -> int:
    """Calls ``ask`` may start now: no more than it wants, than whole tokens, than the slots the
    other live holders and its own running calls leave of the parallelism; never negative."""
    return max(0, min(ask.want, math.floor(tokens), ask.parallelism - others_held - ask.running))


def check_asks(asks: Sequence[FlowAsk]) -> None:
    """Refuse asks no worker should send: a count below zero, limits outside what a spec can hold,
    or one (owner, key) twice in one call (its grants would be decided twice, each unaware of the
    other). Raises ``ValueError``: a caller's bug, not a user's input."""
    seen: set[tuple[str, str]] = set()
    for ask in asks:
        if ask.want < 0 or ask.running < 0:
            raise ValueError(f"flow ask for {ask.key!r}: want and running must not be negative, got {ask!r}")
        if not (ask.rate_per_s > 0 and math.isfinite(ask.rate_per_s)) or ask.parallelism < 1:
            raise ValueError(
                f"flow ask for {ask.key!r}: rate_per_s must be > 0 and parallelism >= 1, got {ask!r}"
            )
        ident = (ask.owner, ask.key)
        if ident in seen:
            raise ValueError(
                f"flow ask for owner {ask.owner!r} key {ask.key!r} appears twice in one call; "
                "send one ask per (owner, key) with the counts summed"
            )
        seen.add(ident)
