"""A target host's health as one worker sees it: how many calls it may have at once, and whether
it is given any at all (docs/targets.md, "Target health").

Pure: time is an argument (monotonic seconds), so the state machine is tested with a fake clock
(tests/pure/test_targethealth.py). The worker's per-host queues (workers/hostqueues.py) ask
``may_start`` before each call and tell ``ended`` after it.

The policy is TCP's AIMD, as a receiver's window: a call that times out or is refused (the host
cannot take more now) halves the host's limit, at most once a ``cut_every_s`` (a hundred calls
timing out together are one signal, not a hundred); answers grow it back by one per limit's worth
of them. A host whose calls fail ``backoff_after`` times in a row with no answer between is given
no call for ``backoff_s`` (doubled each time it fails again, up to ``backoff_max_s``), then one
call at a time (the probe) until one is answered: the host is healthy again, at its full limit.

What counts as "cannot take more" is what says so: a timeout, a connection refused, reset or not
made, a 429 answer. Any other answer, a 500, a 503 or a 404 included, is the host answering: it
says nothing certain about its load and does not cut the limit (the run still fails by its status,
and the job's retry policy applies, Retry-After included). A 503 was counted at first, and one
endpoint answering 503 forever then backed off every other path of its host
(tests/faults/test_poison.py: 617 good runs held behind it).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from duetime.core.model import Outcome, TargetState
from duetime.core.runpath import Verdict


class Signal(enum.Enum):
    """What one finished call says of its host."""

    ANSWERED = "answered"  # the host answered (any status but 429): it takes calls
    OVERLOADED = "overloaded"  # timed out, refused, reset, or answered 429


OVERLOAD_STATUSES = frozenset({429})


def signal_of(verdict: Verdict) -> Signal:
    if verdict.outcome is Outcome.TIMED_OUT:
        return Signal.OVERLOADED
    if verdict.outcome is Outcome.SUCCEEDED:
        return Signal.ANSWERED
    if verdict.status_code is None:
        # No answer at all: refused, reset, closed, unresolvable, not HTTP. A final refusal of our
        # own (an address the operator does not allow, a bad URL) is not the host's doing.
        return Signal.OVERLOADED if verdict.retryable else Signal.ANSWERED
    return Signal.OVERLOADED if verdict.status_code in OVERLOAD_STATUSES else Signal.ANSWERED


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    max_limit: int = 256  # DUETIME_TARGET_CONCURRENCY: a healthy host's calls at once
    cut_every_s: float = 1.0
    backoff_after: int = 10
    backoff_s: float = 5.0
    backoff_max_s: float = 120.0


class HostHealth:
    """One host's state machine (docs/state-machine.md lists the run's; this is the host's):

    ``healthy`` --overload--> ``degraded`` (limit halved) --answers--> ``healthy`` (limit regrown)
    ``healthy``/``degraded`` --``backoff_after`` overloads in a row--> ``backing_off``
    ``backing_off`` --``backoff_until`` passed--> probing (still ``backing_off``, limit 1)
    probing --answered--> ``healthy`` (full limit); --overloaded--> ``backing_off`` (twice as long)
    """

    __slots__ = (
        "_backoff_s",
        "_cut_at",
        "_grown",
        "_policy",
        "backoff_until",
        "failures_in_row",
        "limit",
        "state",
    )

    def __init__(self, policy: HealthPolicy) -> None:
        self._policy = policy
        self.state = TargetState.HEALTHY
        self.limit = policy.max_limit
        self.failures_in_row = 0
        self.backoff_until: float | None = None
        self._backoff_s = policy.backoff_s
        self._cut_at = float("-inf")
        self._grown = 0.0

    def allowed(self, now: float) -> int:
        """Calls this host may have in flight at ``now``: 0 while it backs off, 1 while probed."""
        if self.state is TargetState.BACKING_OFF:
            assert self.backoff_until is not None
            return 0 if now < self.backoff_until else 1
        return self.limit

    def wakes_at(self) -> float | None:
        """When a backing-off host may be probed (the queues' timer), else None."""
        return self.backoff_until if self.state is TargetState.BACKING_OFF else None

    def ended(self, signal: Signal, now: float) -> TargetState:
        """One call ended; returns the state after it."""
        p = self._policy
        if signal is Signal.ANSWERED:
            self.failures_in_row = 0
            if self.state is TargetState.BACKING_OFF:
                # The probe (or a call started before the back-off) was answered: healthy again.
                self.state = TargetState.HEALTHY
                self.limit = p.max_limit
                self.backoff_until = None
                self._backoff_s = p.backoff_s
                self._grown = 0.0
            elif self.limit < p.max_limit:
                self._grown += 1.0 / self.limit  # one more call at once per limit's worth answered
                if self._grown >= 1.0:
                    self._grown -= 1.0
                    self.limit += 1
                    if self.limit >= p.max_limit:
                        self.state = TargetState.HEALTHY
            return self.state
        self.failures_in_row += 1
        if self.state is TargetState.BACKING_OFF:
            assert self.backoff_until is not None
            if now >= self.backoff_until:
                # The probe failed: wait twice as long before the next.
                self._backoff_s = min(self._backoff_s * 2, p.backoff_max_s)
                self.backoff_until = now + self._backoff_s
            return self.state
        if self.failures_in_row >= p.backoff_after:
            self.state = TargetState.BACKING_OFF
            self.backoff_until = now + self._backoff_s
            self.limit = 1
            return self.state
        if now >= self._cut_at:
            self._cut_at = now + p.cut_every_s
            self.limit = max(1, self.limit // 2)
            self._grown = 0.0
            self.state = TargetState.DEGRADED
        return self.state


@dataclass(frozen=True, slots=True)
class CallCounts:
    calls: int
    timeouts: int
    errors: int


class CallWindow:
    """Calls, timeouts and errors over the last ``span_s`` seconds, in ``slots`` buckets: the
    ``last_5m`` figures of ``GET /v1/targets``, kept per (owner, host) at constant cost a call."""

    __slots__ = ("_buckets", "_slot_s", "_slots")

    def __init__(self, span_s: float = 300.0, slots: int = 30) -> None:
        self._slot_s = span_s / slots
        self._slots = slots
        # (slot number, calls, timeouts, errors), oldest first
        self._buckets: deque[list[int]] = deque()

    def add(self, verdict: Verdict, now: float) -> None:
        slot = int(now // self._slot_s)
        if not self._buckets or self._buckets[-1][0] != slot:
            self._buckets.append([slot, 0, 0, 0])
            self._trim(slot)
        bucket = self._buckets[-1]
        bucket[1] += 1
        if verdict.outcome is Outcome.TIMED_OUT:
            bucket[2] += 1
        elif verdict.outcome is not Outcome.SUCCEEDED:
            bucket[3] += 1

    def _trim(self, slot: int) -> None:
        while self._buckets and self._buckets[0][0] <= slot - self._slots:
            self._buckets.popleft()

    def counts(self, now: float) -> CallCounts:
        self._trim(int(now // self._slot_s))
        calls = timeouts = errors = 0
        for _, c, t, e in self._buckets:
            calls += c
            timeouts += t
            errors += e
        return CallCounts(calls, timeouts, errors)

    def empty(self, now: float) -> bool:
        self._trim(int(now // self._slot_s))
        return not self._buckets
