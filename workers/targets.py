"""What a worker tells the cluster of its webhook hosts: per (owner, host), the host's state and
limit and that owner's calls over the last five minutes (``GET /v1/targets``, docs/targets.md).

Counted per owner because an owner sees only their own calls; the state is the host's, the same
for every owner whose jobs call it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from duetime.core.model import TargetState
from duetime.core.runpath import Verdict
from duetime.core.targethealth import CallWindow
from duetime.storage.ports import TargetHealthReport

HostStates = dict[str, tuple[TargetState, int, float | None]]


class CallTracker:
    """Calls per (owner, host) in five-minute windows; forgets a pair once its window is empty."""

    def __init__(self, span_s: float = 300.0) -> None:
        self._span_s = span_s
        self._windows: dict[tuple[str, str], CallWindow] = {}

    def add(self, owner: str, host: str, verdict: Verdict, now: float) -> None:
        window = self._windows.get((owner, host))
        if window is None:
            window = self._windows[(owner, host)] = CallWindow(self._span_s)
        window.add(verdict, now)

    def __len__(self) -> int:
        return len(self._windows)

    def reports(self, states: HostStates, now: float, wall: datetime) -> list[TargetHealthReport]:
        """One report per (owner, host) with calls in the window. ``now`` is monotonic (the
        queues' clock), ``wall`` the same moment by the database's clock, to date a back-off."""
        out = []
        empty = []
        for (owner, host), window in self._windows.items():
            if window.empty(now):
                empty.append((owner, host))
                continue
            state, limit, until = states.get(host, (TargetState.HEALTHY, 0, None))
            backoff_until = None
            if state is TargetState.BACKING_OFF and until is not None:
                backoff_until = wall + timedelta(seconds=max(0.0, until - now))
            c = window.counts(now)
            out.append(
                TargetHealthReport(
                    owner=owner,
                    host=host,
                    state=state,
                    concurrency_limit=limit,
                    backoff_until=backoff_until,
                    calls_5m=c.calls,
                    timeouts_5m=c.timeouts,
                    errors_5m=c.errors,
                )
            )
        for key in empty:
            del self._windows[key]
        return out
