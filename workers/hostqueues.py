"""A queue per target host in each worker: what decides which waiting run is called next.

Why: a worker used to give each run a worker coroutine of its own, which then waited for its
host's slot. Five hosts that answer after 20 s took every coroutine of the worker, and a healthy
host's runs, queued behind theirs, waited minutes (issue 28). Here a run waiting for its host holds
nothing but its place in its host's queue; a call is started only when its host (and its flow key)
has room, so nothing one host does delays the calls to another.

The rules, in the order they are checked for the run at the head of a lane:

* **Lanes.** Runs wait in one lane per host (``host:port``, or ``broker:redis``) or, when their
  target has ``flow``, one lane per (owner, flow key). Inside a lane, owners take turns (FIFO per
  owner), as in the run queue; lanes take turns too, one start each per round.
* **The host's limit**: its calls in flight stay under what its health allows
  (core/targethealth.py: the full limit, a cut limit, none while it backs off, one while probed).
* **The host's rate**: a token bucket per host (``DUETIME_TARGET_RATE``).
* **The worker's share**: runs in flight stay under ``total`` (``DUETIME_WORKER_CONCURRENCY``),
  except that a host with fewer than its fair share (``total`` / hosts with work) in flight may
  always start one more. Slow hosts can hold the worker's calls, but never all of them: a host
  that turns up with work gets its share at once.
* **The flow key's grants** (the pool's flow loop asks the cluster for them): one credit a call.

Pure: the clock is an argument, and nothing here awaits. ``WorkerPool`` (workers/pool.py) feeds it
runs, calls ``pump`` for what to start, and reports each call's end; tests drive it with a fake
clock (tests/pure/test_hostqueues.py).
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from duetime.core.model import Flow, TargetState
from duetime.core.targethealth import HealthPolicy, HostHealth, Signal

T = TypeVar("T")

_SWEEP_FLOOR = 1024


@dataclass(frozen=True, slots=True)
class FlowKey:
    """A flow key is the owner's: two owners' keys never mix."""

    owner: str
    key: str


@dataclass(frozen=True, slots=True)
class Start(Generic[T]):
    """Runs to call now, together (a batch to one broker holds one slot), all to ``host``."""

    host: str
    items: list[T]
    flow: FlowKey | None
    owners: list[str]  # each item's owner, in order


class _Bucket:
    """``rate`` tokens a second, at most ``burst`` held (a host's politeness rate)."""

    __slots__ = ("_burst", "_last", "_rate", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self._rate = rate
        self._burst = burst
        self.tokens = burst
        self._last = now

    def refill(self, now: float) -> float:
        if now > self._last:
            self.tokens = min(self._burst, self.tokens + (now - self._last) * self._rate)
            self._last = now
        return self.tokens

    def ready_at(self, now: float) -> float:
        """When one whole token will be there."""
        return now + max(0.0, 1.0 - self.tokens) / self._rate

    def full(self, now: float) -> bool:
        return self.refill(now) >= self._burst


class _LaneState(enum.Enum):
    IDLE = 0  # no runs
    READY = 1  # in the ring
    BLOCKED = 2  # waiting for its host, the clock, the worker's share or a flow grant


class _Lane(Generic[T]):
    """Runs of one host (or one flow key), owners in turn."""

    __slots__ = ("flow", "host", "key", "owners", "ring", "size", "state")

    def __init__(self, key: object, host: _Host[T] | None, flow: _Flow[T] | None) -> None:
        self.key = key
        self.host = host  # None for a flow lane: the head's host applies
        self.flow = flow
        self.owners: dict[str, deque[tuple[T, _Host[T]]]] = {}
        self.ring: deque[str] = deque()
        self.size = 0
        self.state = _LaneState.IDLE

    def push(self, owner: str, item: T, host: _Host[T]) -> None:
        q = self.owners.get(owner)
        if q is None:
            q = self.owners[owner] = deque()
            self.ring.append(owner)
        q.append((item, host))
        self.size += 1

    def head(self) -> tuple[T, _Host[T]]:
        return self.owners[self.ring[0]][0]

    def head_owner(self) -> str:
        return self.ring[0]

    def pop(self) -> tuple[str, T]:
        owner = self.ring.popleft()
        q = self.owners[owner]
        item, _ = q.popleft()
        if q:
            self.ring.append(owner)
        else:
            del self.owners[owner]
        self.size -= 1
        return owner, item

    def first_owner(self, wanted: Callable[[str], bool]) -> bool:
        """Bring the first owner (in turn order) that is ``wanted`` to the head; False if none."""
        for i, owner in enumerate(self.ring):
            if wanted(owner):
                self.ring.rotate(-i)
                return True
        return False

    def items(self) -> Iterator[T]:
        for q in self.owners.values():
            for item, _ in q:
                yield item


class _Host(Generic[T]):
    __slots__ = ("blocked", "bucket", "by_owner", "calls", "health", "key", "owner_calls", "runs", "waiting")

    def __init__(self, key: str, health: HostHealth, bucket: _Bucket) -> None:
        self.key = key
        self.health = health
        self.bucket = bucket
        self.calls = 0  # calls in flight (a batch is one)
        self.runs = 0  # runs in flight
        self.waiting = 0  # runs waiting for it, in any lane
        self.blocked: deque[_Lane[T]] = deque()  # lanes waiting for this host
        self.by_owner: dict[str, int] = {}  # runs waiting or in flight, per owner with any
        self.owner_calls: dict[str, int] = {}  # calls in flight, per owner

    def owner_share(self, allowed: int) -> int:
        """An owner's share of the host's calls at once: its limit over the owners with work."""
        return max(1, allowed // max(1, len(self.by_owner)))

    def under_share(self, owner: str, allowed: int) -> bool:
        return self.owner_calls.get(owner, 0) < self.owner_share(allowed)


class _Flow(Generic[T]):
    __slots__ = ("credits", "flow", "key", "lane", "running")

    def __init__(self, key: FlowKey, flow: Flow) -> None:
        self.key = key
        self.flow = flow  # the strictest limits of the runs that asked
        self.credits = 0  # calls granted by the cluster and not started yet
        self.running = 0  # its calls in flight here
        self.lane: _Lane[T] | None = None


@dataclass(frozen=True, slots=True)
class FlowNeed:
    """What one flow key of this worker needs from the cluster (the pool's flow loop asks for it)."""

    key: FlowKey
    flow: Flow
    want: int  # runs waiting that no credit covers
    running: int  # calls in flight plus credits not used yet: the slots this worker holds


@dataclass(slots=True)
class HostQueues(Generic[T]):
    """The lanes, the hosts and the worker's share; see the module docstring.

    ``batch_of(host)`` is how many runs one call to a host may carry (a Redis pipeline: 500;
    a webhook: 1).
    """

    total: int
    policy: HealthPolicy
    rate_per_s: float
    burst: float
    clock: Callable[[], float]
    batch_of: Callable[[str], int] = lambda host: 1
    on_state: Callable[[str, TargetState, TargetState], None] | None = None

    _hosts: dict[str, _Host[T]] = field(default_factory=dict)
    _lanes: dict[object, _Lane[T]] = field(default_factory=dict)
    _flows: dict[FlowKey, _Flow[T]] = field(default_factory=dict)
    _ring: deque[_Lane[T]] = field(default_factory=deque)
    _over_share: deque[_Lane[T]] = field(default_factory=deque)  # blocked by the worker's share
    _timers: list[tuple[float, int, str]] = field(default_factory=list)
    _timer_seq: int = 0
    _active_hosts: int = 0  # hosts with runs waiting or in flight
    _owner_load: dict[str, int] = field(default_factory=dict)  # runs waiting or in flight, per owner
    _owner_flight: dict[str, int] = field(default_factory=dict)  # runs in flight, per owner
    in_flight: int = 0  # runs
    waiting: int = 0  # runs
    _sweep_at: int = _SWEEP_FLOOR

    # ------------------------------------------------------------------ feeding

    def add(self, item: T, *, owner: str, host: str, flow: Flow | None) -> None:
        h = self._host(host)
        if h.runs == 0 and h.waiting == 0:
            self._active_hosts += 1
        h.waiting += 1
        self.waiting += 1
        new_owner = owner not in h.by_owner
        h.by_owner[owner] = h.by_owner.get(owner, 0) + 1
        self._owner_load[owner] = self._owner_load.get(owner, 0) + 1
        if flow is None:
            lane = self._lanes.get(host)
            if lane is None:
                lane = self._lanes[host] = _Lane(host, h, None)
        else:
            fk = FlowKey(owner, flow.key)
            f = self._flows.get(fk)
            if f is None:
                f = self._flows[fk] = _Flow(fk, flow)
            else:
                f.flow = _strictest(f.flow, flow)
            lane = f.lane
            if lane is None:
                lane = f.lane = self._lanes[fk] = _Lane(fk, None, f)
        lane.push(owner, item, h)
        if lane.state is _LaneState.IDLE or (new_owner and lane.state is _LaneState.BLOCKED):
            # A lane blocked on its full host is tried again when an owner new to the host
            # arrives: that owner may have a share of the host's calls the others hold.
            lane.state = _LaneState.READY
            self._ring.append(lane)

    def _host(self, key: str) -> _Host[T]:
        h = self._hosts.get(key)
        if h is None:
            if len(self._hosts) >= self._sweep_at:
                self.sweep()
                self._sweep_at = max(_SWEEP_FLOOR, 2 * len(self._hosts))
            now = self.clock()
            bucket = _Bucket(self.rate_per_s, self.burst, now)
            h = self._hosts[key] = _Host(key, HostHealth(self.policy), bucket)
        return h

    def sweep(self) -> int:
        """Forget hosts with nothing waiting or in flight, healthy, whose bucket is full again:
        a million hosts seen once must not stay a million entries (forgetting a cut limit or a
        half-empty bucket would hand the host what it has not earned, so those stay)."""
        now = self.clock()
        idle = [
            k
            for k, h in self._hosts.items()
            if h.calls == 0
            and h.waiting == 0
            and h.health.state is TargetState.HEALTHY
            and h.bucket.full(now)
        ]
        for k in idle:
            del self._hosts[k]
            lane = self._lanes.get(k)
            if lane is not None and lane.size == 0:
                del self._lanes[k]
        return len(idle)

    # ------------------------------------------------------------------ starting

    def pump(self) -> list[Start[T]]:
        """The calls to start now, lanes in turn, one start per lane per round."""
        now = self.clock()
        self._fire_timers(now)
        starts: list[Start[T]] = []
        ring = self._ring
        while ring:
            lane = ring.popleft()
            if lane.state is not _LaneState.READY:
                continue  # a stale entry: the lane went idle or blocked since
            start = self._start_one(lane, now)
            if start is None:
                continue  # it is blocked now, somewhere it will be woken from
            starts.append(start)
            if lane.size:
                ring.append(lane)
            else:
                lane.state = _LaneState.IDLE
        return starts

    def _start_one(self, lane: _Lane[T], now: float) -> Start[T] | None:
        _, host = lane.head()
        health = host.health
        allowed = health.allowed(now)
        host_full = host.calls >= allowed
        worker_full = self.in_flight >= self.total and host.runs >= self._fair_share()
        if (host_full or worker_full) and not self._owner_may_pass(
            lane, host, allowed, host_full, worker_full
        ):
            if not host_full:
                return self._block(lane, self._over_share)
            wake = health.wakes_at()
            if wake is not None and host.calls == 0:
                self._timer(wake, host.key)
            return self._block(lane, host.blocked)
        flow = lane.flow
        if flow is not None and flow.credits <= 0:
            lane.state = _LaneState.BLOCKED  # woken by grant()
            return None
        bucket = host.bucket
        if bucket.refill(now) < 1.0:
            self._timer(bucket.ready_at(now), host.key)
            return self._block(lane, host.blocked)
        n = 1
        if lane.host is not None and host.calls < allowed:
            n = max(1, min(self.batch_of(host.key), lane.size, int(bucket.tokens)))
            if self.in_flight < self.total:
                n = max(1, min(n, self.total - self.in_flight))
        owners: list[str] = []
        items: list[T] = []
        for _ in range(n):
            owner, item = lane.pop()
            owners.append(owner)
            items.append(item)
            host.owner_calls[owner] = host.owner_calls.get(owner, 0) + 1
            self._owner_flight[owner] = self._owner_flight.get(owner, 0) + 1
        if flow is not None:
            flow.credits -= n
            flow.running += n
        bucket.tokens -= n
        host.calls += 1
        host.runs += n
        host.waiting -= n
        self.waiting -= n
        self.in_flight += n
        return Start(host.key, items, flow.key if flow is not None else None, owners)

    def _owner_may_pass(
        self, lane: _Lane[T], host: _Host[T], allowed: int, host_full: bool, worker_full: bool
    ) -> bool:
        """Owners' shares: a full host still takes a call of an owner below its share of the
        host's limit (the limit over the owners with work for the host), up to twice the limit;
        a full worker still starts a call of an owner below its share of the worker's (the
        total over the owners with work), up to twice the total. One owner's slow or numerous
        calls then cannot hold every slot against the others. Not while the host backs off or is
        probed (``allowed`` ≤ 1). Brings that owner's run to the lane's head."""
        if host_full and (allowed <= 1 or host.calls >= 2 * allowed or len(host.by_owner) < 2):
            return False
        if worker_full and (self.in_flight >= 2 * self.total or len(self._owner_load) < 2):
            return False
        worker_share = max(1, self.total // max(1, len(self._owner_load)))

        def may(owner: str) -> bool:
            if host_full and not host.under_share(owner, allowed):
                return False
            return not worker_full or self._owner_flight.get(owner, 0) < worker_share

        if lane.host is None:  # a flow lane is one owner's
            return may(lane.head_owner())
        return lane.first_owner(may)

    @staticmethod
    def _block(lane: _Lane[T], on: deque[_Lane[T]]) -> Start[T] | None:
        """Park ``lane`` where it will be woken from; None, for ``_start_one`` to return."""
        lane.state = _LaneState.BLOCKED
        on.append(lane)
        return None

    def _fair_share(self) -> int:
        return max(1, self.total // max(1, self._active_hosts))

    def _timer(self, at: float, host: str) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (at, self._timer_seq, host))

    def _fire_timers(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, key = heapq.heappop(timers)
            h = self._hosts.get(key)
            if h is not None:
                self._wake(h.blocked)

    def _wake(self, lanes: deque[_Lane[T]], limit: int | None = None) -> None:
        n = 0
        while lanes and (limit is None or n < limit):
            lane = lanes.popleft()
            if lane.state is _LaneState.BLOCKED and lane.size:
                lane.state = _LaneState.READY
                self._ring.append(lane)
                n += 1

    def next_wake(self) -> float | None:
        """The earliest moment a timer (a host's rate, a back-off's end) may let a run start."""
        return self._timers[0][0] if self._timers else None

    # ------------------------------------------------------------------ ending

    def ended(self, start: Start[T], signal: Signal) -> None:
        """A call of ``start`` ended; ``signal`` is what it said of its host."""
        now = self.clock()
        host = self._hosts[start.host]
        n = len(start.items)
        host.calls -= 1
        host.runs -= n
        self.in_flight -= n
        for owner in start.owners:
            left = host.owner_calls[owner] - 1
            if left:
                host.owner_calls[owner] = left
            else:
                del host.owner_calls[owner]
            load = host.by_owner[owner] - 1
            if load:
                host.by_owner[owner] = load
            else:
                del host.by_owner[owner]
            _decrement(self._owner_flight, owner)
            _decrement(self._owner_load, owner)
        if host.runs == 0 and host.waiting == 0:
            self._active_hosts -= 1
        before = host.health.state
        after = host.health.ended(signal, now)
        if after is not before and self.on_state is not None:
            self.on_state(host.key, before, after)
        if after is TargetState.BACKING_OFF:
            wake = host.health.wakes_at()
            if wake is not None and host.calls == 0:
                self._timer(wake, host.key)
        if start.flow is not None:
            f = self._flows.get(start.flow)
            if f is not None:
                f.running -= n
        self._wake(host.blocked)
        # Room in the worker's share: as many lanes as runs ended may try again (they go round).
        self._wake(self._over_share, limit=n)

    def grant(self, key: FlowKey, granted: int) -> None:
        """The cluster granted ``granted`` calls of a flow key (the pool's flow loop)."""
        f = self._flows.get(key)
        if f is None:
            return
        f.credits += granted
        lane = f.lane
        if granted and lane is not None and lane.state is _LaneState.BLOCKED and lane.size:
            lane.state = _LaneState.READY
            self._ring.append(lane)

    # ------------------------------------------------------------------ reading

    def flow_needs(self) -> list[FlowNeed]:
        """Every flow key with runs waiting or calls in flight; a key with neither is reported
        once more with nothing (its slots, credits not used included, go back to the cluster at
        once), then forgotten. Credits beyond the runs waiting are dropped: they would hold slots
        no run needs."""
        needs = []
        done = []
        for key, f in self._flows.items():
            waiting = f.lane.size if f.lane is not None else 0
            if waiting == 0 and f.running == 0:
                needs.append(FlowNeed(key, f.flow, 0, 0))
                done.append(key)
                continue
            f.credits = min(f.credits, waiting)
            needs.append(FlowNeed(key, f.flow, waiting - f.credits, f.running + f.credits))
        for key in done:
            f = self._flows.pop(key)
            if f.lane is not None and self._lanes.get(key) is f.lane:
                del self._lanes[key]
        return needs

    def host_states(self) -> dict[str, tuple[TargetState, int, float | None]]:
        """Each known host's state, its limit, and when a back-off ends (monotonic)."""
        return {k: (h.health.state, h.health.limit, h.health.backoff_until) for k, h in self._hosts.items()}

    def waiting_by_reason(self) -> dict[str, int]:
        """Runs waiting, by what they wait for (the metrics' ``reason`` label)."""
        now = self.clock()
        out = {"host": 0, "backing_off": 0, "flow": 0}
        for h in self._hosts.values():
            if h.health.state is TargetState.BACKING_OFF and h.health.allowed(now) == 0:
                out["backing_off"] += h.waiting
            else:
                out["host"] += h.waiting
        for f in self._flows.values():
            if f.lane is not None and f.credits <= 0:
                out["flow"] += f.lane.size
                out["host"] -= f.lane.size
        out["host"] = max(0, out["host"])
        return out

    def drain(self) -> list[T]:
        """Every run waiting, removed (the worker's shutdown)."""
        out: list[T] = []
        for lane in self._lanes.values():
            out.extend(lane.items())
            lane.owners.clear()
            lane.ring.clear()
            lane.size = 0
            lane.state = _LaneState.IDLE
        for h in self._hosts.values():
            h.waiting = 0
            h.blocked.clear()
            h.by_owner = dict(h.owner_calls)
        self._owner_load = dict(self._owner_flight)
        self._ring.clear()
        self._over_share.clear()
        self.waiting = 0
        self._active_hosts = sum(1 for h in self._hosts.values() if h.runs)
        return out

    def hosts(self) -> int:
        return len(self._hosts)


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


def _strictest(a: Flow, b: Flow) -> Flow:
    if a == b:
        return a
    return Flow(a.key, min(a.rate_per_s, b.rate_per_s), min(a.parallelism, b.parallelism))


def default_burst(rate_per_s: float) -> float:
    """One second's worth, as the per-host limiter had: a host at its steady rate never waits."""
    return float(max(1, math.ceil(rate_per_s)))
