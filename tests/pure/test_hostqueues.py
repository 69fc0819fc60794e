"""The worker's per-host queues (workers/hostqueues.py) with a fake clock: which waiting run is
called next, and what one host's trouble may not do to the others."""

from __future__ import annotations

from dataclasses import dataclass

from duetime.core.model import Flow, TargetState
from duetime.core.targethealth import HealthPolicy, Signal
from duetime.workers.hostqueues import FlowKey, HostQueues, Start

OK = Signal.ANSWERED
BAD = Signal.OVERLOADED


@dataclass
class Clock:
    t: float = 100.0

    def __call__(self) -> float:
        return self.t


def queues(
    total: int = 100, limit: int = 4, rate: float = 1e6, clock: Clock | None = None, batch: int = 1
) -> HostQueues[str]:
    return HostQueues(
        total=total,
        policy=HealthPolicy(max_limit=limit, backoff_after=3, backoff_s=5.0),
        rate_per_s=rate,
        burst=max(1.0, rate),
        clock=clock or Clock(),
        batch_of=lambda host: batch if host.startswith("broker:") else 1,
    )


def started(starts: list[Start[str]]) -> list[str]:
    return [item for s in starts for item in s.items]


def test_a_host_at_its_limit_holds_only_its_own_runs() -> None:
    q = queues(limit=2)
    for i in range(10):
        q.add(f"slow{i}", owner="a", host="slow:80", flow=None)
    first = q.pump()
    assert started(first) == ["slow0", "slow1"]  # its limit, and no more
    q.add("fast0", owner="a", host="fast:80", flow=None)  # same owner, queued after the slow ones
    assert started(q.pump()) == ["fast0"]
    assert q.waiting == 8 and q.in_flight == 3
    q.ended(first[0], OK)
    assert started(q.pump()) == ["slow2"]


def test_slow_hosts_never_take_the_whole_worker() -> None:
    """Five hosts whose calls hang fill the worker's share; a host that turns up gets its fair
    share at once, without waiting for any of their calls to end."""
    q = queues(total=10, limit=256)
    for h in range(5):
        for i in range(100):
            q.add(f"hang{h}-{i}", owner="a", host=f"hang{h}:80", flow=None)
    assert len(started(q.pump())) == 10  # the worker's share, spread over the five
    assert q.pump() == []
    for i in range(5):
        q.add(f"ok{i}", owner="a", host="ok:80", flow=None)
    # the same owner's new host: a fair share is 10 // 6 hosts = 1 at a time while it is full
    assert started(q.pump()) == ["ok0"]
    assert q.pump() == []
    assert q.in_flight == 11


def test_one_owners_slow_calls_leave_another_owner_its_share_of_the_worker() -> None:
    q = queues(total=10, limit=256)
    for h in range(5):
        for i in range(100):
            q.add(f"hang{h}-{i}", owner="a", host=f"hang{h}:80", flow=None)
    assert len(started(q.pump())) == 10
    for i in range(8):
        q.add(f"b{i}", owner="b", host="ok:80", flow=None)
    # owner b's share of the worker is 10 // 2 owners = 5, at once
    assert started(q.pump()) == [f"b{i}" for i in range(5)]
    assert q.pump() == []


def test_one_owners_slow_calls_leave_another_owner_its_share_of_a_host() -> None:
    """Owner a holds every call its host allows (slow calls); owner b's run to the same host
    starts at once, past the host's limit, as b is below its share of it."""
    q = queues(limit=4)
    for i in range(10):
        q.add(f"a{i}", owner="a", host="h:80", flow=None)
    assert len(started(q.pump())) == 4
    q.add("b0", owner="b", host="h:80", flow=None)
    q.add("b1", owner="b", host="h:80", flow=None)
    assert started(q.pump()) == ["b0", "b1"]  # b's share: 4 // 2 owners
    assert q.pump() == []  # a is over its share; the host stays within twice its limit


def test_owners_take_turns_on_one_host() -> None:
    q = queues(limit=1)
    for i in range(3):
        q.add(f"a{i}", owner="a", host="h:80", flow=None)
    q.add("b0", owner="b", host="h:80", flow=None)
    order = []
    for _ in range(4):
        [s] = q.pump()
        order += s.items
        q.ended(s, OK)
    assert order == ["a0", "b0", "a1", "a2"]


def test_the_hosts_rate_spaces_the_starts_and_says_when_to_look_again() -> None:
    clock = Clock()
    q = queues(rate=2.0, clock=clock, limit=100)  # a burst of 2
    for i in range(5):
        q.add(f"r{i}", owner="a", host="h:80", flow=None)
    assert started(q.pump()) == ["r0", "r1"]
    assert q.pump() == []
    wake = q.next_wake()
    assert wake is not None and abs(wake - (clock.t + 0.5)) < 1e-9
    clock.t = wake
    assert started(q.pump()) == ["r2"]


def test_a_host_that_backs_off_holds_its_runs_and_is_probed_one_call_at_a_time() -> None:
    clock = Clock()
    q = queues(limit=4, clock=clock)
    for i in range(20):
        q.add(f"d{i}", owner="a", host="down:80", flow=None)
    first = q.pump()
    assert len(first) == 4
    for s in first[:3]:
        q.ended(s, BAD)  # three in a row: it backs off
    assert q.host_states()["down:80"][0] is TargetState.BACKING_OFF
    q.ended(first[3], BAD)
    assert q.pump() == []  # held, not started (and not failed: they just wait)
    assert q.waiting == 16
    q.add("other", owner="a", host="up:80", flow=None)
    assert started(q.pump()) == ["other"]  # nothing the down host does delays another
    wake = q.next_wake()
    assert wake is not None
    clock.t = wake
    probe = q.pump()
    assert len(probe) == 1  # one call at a time
    assert q.pump() == []
    q.ended(probe[0], OK)
    assert q.host_states()["down:80"][0] is TargetState.HEALTHY
    assert len(q.pump()) == 4


def test_a_flow_key_starts_only_what_the_cluster_granted() -> None:
    q = queues()
    flow = Flow("reports", rate_per_s=5.0, parallelism=2)
    for i in range(5):
        q.add(f"f{i}", owner="a", host="h:80", flow=flow)
    q.add("g0", owner="b", host="h:80", flow=flow)  # another owner's key of the same name
    q.add("plain", owner="a", host="h:80", flow=None)
    assert started(q.pump()) == ["plain"]  # no grant yet: only the run without a flow key
    needs = {n.key: n for n in q.flow_needs()}
    assert needs[FlowKey("a", "reports")].want == 5
    assert needs[FlowKey("b", "reports")].want == 1
    q.grant(FlowKey("a", "reports"), 2)
    got = q.pump()
    assert started(got) == ["f0", "f1"]
    needs = {n.key: n for n in q.flow_needs()}
    assert (needs[FlowKey("a", "reports")].want, needs[FlowKey("a", "reports")].running) == (3, 2)
    q.ended(got[0], OK)
    assert {n.key: n.running for n in q.flow_needs()}[FlowKey("a", "reports")] == 1


def test_a_flow_key_with_nothing_left_is_reported_once_empty_then_forgotten() -> None:
    q = queues()
    flow = Flow("k", rate_per_s=1.0, parallelism=1)
    q.add("x", owner="a", host="h:80", flow=flow)
    q.grant(FlowKey("a", "k"), 1)
    [s] = q.pump()
    q.ended(s, OK)
    needs = q.flow_needs()
    assert [(n.want, n.running) for n in needs] == [(0, 0)]  # gives its slot back
    assert q.flow_needs() == []


def test_the_strictest_limits_of_a_keys_runs_are_asked_for() -> None:
    q = queues()
    q.add("x", owner="a", host="h:80", flow=Flow("k", rate_per_s=10.0, parallelism=5))
    q.add("y", owner="a", host="h:80", flow=Flow("k", rate_per_s=3.0, parallelism=8))
    [need] = q.flow_needs()
    assert (need.flow.rate_per_s, need.flow.parallelism) == (3.0, 5)


def test_a_broker_takes_a_pipeline_of_runs_in_one_call() -> None:
    q = queues(batch=500, limit=256, total=1024)
    for i in range(1200):
        q.add(f"r{i}", owner="a", host="broker:redis", flow=None)
    sizes = [len(s.items) for s in q.pump()]
    assert sizes == [500, 500, 24]  # the worker's share is counted in runs


def test_hosts_seen_once_are_forgotten() -> None:
    clock = Clock()
    q = queues(limit=1, clock=clock)
    for i in range(3000):
        clock.t += 0.01  # their buckets refill: forgetting them hands them nothing unearned
        q.add(f"r{i}", owner="a", host=f"h{i}:80", flow=None)
        for s in q.pump():
            q.ended(s, OK)
    assert q.hosts() <= 2048


def test_credits_no_run_needs_go_back_with_the_key() -> None:
    q = queues()
    flow = Flow("k", rate_per_s=1.0, parallelism=5)
    q.add("x", owner="a", host="h:80", flow=flow)
    q.grant(FlowKey("a", "k"), 3)  # more than it waits for (a run went elsewhere meanwhile)
    [s] = q.pump()
    [need] = q.flow_needs()
    assert (need.want, need.running) == (0, 1)  # the call in flight; the spare credits dropped
    q.ended(s, OK)
    assert [(n.want, n.running) for n in q.flow_needs()] == [(0, 0)]
    assert q.flow_needs() == []
