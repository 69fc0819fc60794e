"""The target health state machine (core/targethealth.py) with a fake clock."""

from __future__ import annotations

from duetime.core.model import Outcome, TargetState
from duetime.core.runpath import Verdict
from duetime.core.targethealth import CallWindow, HealthPolicy, HostHealth, Signal, signal_of

POLICY = HealthPolicy(max_limit=64, cut_every_s=1.0, backoff_after=5, backoff_s=5.0, backoff_max_s=20.0)
OK = Signal.ANSWERED
BAD = Signal.OVERLOADED


def test_what_a_call_says_of_its_host() -> None:
    assert signal_of(Verdict(Outcome.TIMED_OUT, True, None, "no answer")) is BAD
    assert signal_of(Verdict(Outcome.FAILED, True, None, "connection refused")) is BAD
    assert signal_of(Verdict(Outcome.FAILED, True, 429, "HTTP 429")) is BAD
    # the host answered: a status says nothing certain about its load (one path answering 503
    # forever must not back off the host's other paths)
    assert signal_of(Verdict(Outcome.FAILED, True, 503, "HTTP 503")) is OK
    assert signal_of(Verdict(Outcome.FAILED, True, 500, "HTTP 500")) is OK
    assert signal_of(Verdict(Outcome.FAILED, False, 404, "HTTP 404")) is OK
    assert signal_of(Verdict(Outcome.SUCCEEDED, False, 200, None)) is OK
    # our own final refusal (an address not allowed) is not the host's doing
    assert signal_of(Verdict(Outcome.FAILED, False, None, "target_not_allowed: private")) is OK


def test_an_overload_halves_the_limit_once_per_interval() -> None:
    h = HostHealth(POLICY)
    assert (h.state, h.allowed(0.0)) == (TargetState.HEALTHY, 64)
    assert h.ended(BAD, 0.0) is TargetState.DEGRADED
    assert h.limit == 32
    h.ended(OK, 0.1)  # an answer between: the failures in a row start again
    h.ended(BAD, 0.5)  # within the interval: one signal, not another cut
    assert h.limit == 32
    h.ended(BAD, 1.0)
    assert h.limit == 16


def test_answers_grow_the_limit_back_one_per_limits_worth() -> None:
    h = HostHealth(POLICY)
    h.ended(BAD, 0.0)
    assert h.limit == 32
    for _ in range(32):
        h.ended(OK, 1.0)
    assert (h.limit, h.state) == (33, TargetState.DEGRADED)
    for _ in range(10_000):
        h.ended(OK, 2.0)
    assert (h.limit, h.state) == (64, TargetState.HEALTHY)


def test_failures_in_a_row_back_off_then_one_probe_at_a_time() -> None:
    h = HostHealth(POLICY)
    for i in range(5):
        h.ended(BAD, 10.0 + i * 0.01)
    assert h.state is TargetState.BACKING_OFF
    assert h.backoff_until == 10.04 + 5.0
    assert h.allowed(12.0) == 0  # none while it backs off
    assert h.wakes_at() == h.backoff_until
    assert h.allowed(15.1) == 1  # then one call: the probe
    # the probe fails: twice as long
    h.ended(BAD, 15.2)
    assert h.state is TargetState.BACKING_OFF and h.backoff_until == 15.2 + 10.0
    h.ended(BAD, 25.3)
    assert h.backoff_until == 25.3 + 20.0
    h.ended(BAD, 45.4)
    assert h.backoff_until == 45.4 + 20.0  # at most backoff_max_s
    # a failure of a call started before the back-off does not push it further
    h.ended(BAD, 50.0)
    assert h.backoff_until == 45.4 + 20.0
    # the probe is answered: healthy at the full limit, and the next back-off starts short again
    assert h.ended(OK, 66.0) is TargetState.HEALTHY
    assert h.allowed(66.0) == 64
    assert h.wakes_at() is None
    for i in range(5):
        h.ended(BAD, 70.0 + i)
    assert h.backoff_until == 74.0 + 5.0


def test_the_window_counts_the_last_five_minutes() -> None:
    w = CallWindow(span_s=300.0, slots=30)
    w.add(Verdict(Outcome.SUCCEEDED, False, 200), 0.0)
    w.add(Verdict(Outcome.TIMED_OUT, True, None), 5.0)
    w.add(Verdict(Outcome.FAILED, True, 500), 150.0)
    c = w.counts(160.0)
    assert (c.calls, c.timeouts, c.errors) == (3, 1, 1)
    c = w.counts(305.0)  # the first ten seconds are out
    assert (c.calls, c.timeouts, c.errors) == (1, 0, 1)
    assert not w.empty(305.0)
    assert w.empty(460.0)
