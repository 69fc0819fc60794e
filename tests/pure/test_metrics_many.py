"""``observe_many`` leaves a histogram exactly as one ``observe`` per amount would: the run path
uses it for its per-run histograms, and it reads the client library's bucket internals, so this
is what catches a prometheus-client release that changes them."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram

from duetime.runqueue.metrics import observe_many

BUCKETS = (0.0005, 0.001, 0.005, 0.1, 1, 2.5, 30)


def _samples(h: Histogram) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample but ``_created`` (the two histograms were made a few µs apart)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in h.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def _pair() -> tuple[Histogram, Histogram]:
    a = Histogram("one_by_one", "d", buckets=BUCKETS, registry=CollectorRegistry())
    b = Histogram("one_by_one", "d", buckets=BUCKETS, registry=CollectorRegistry())
    return a, b


def test_many_equals_one_by_one_on_bounds_and_between() -> None:
    rng = random.Random(7)
    # Every bound exactly (an amount equal to a bound is in that bound's bucket), just above and
    # below each, zero, negatives, above the largest bound, and random values.
    amounts = [0.0, -1.0, 1e9]
    for b in BUCKETS:
        amounts += [b, b * 0.999, b * 1.001]
    amounts += [rng.uniform(0, 40) for _ in range(500)]
    one, many = _pair()
    for a in amounts:
        one.observe(a)
    observe_many(many, amounts)
    got, want = _samples(many), _samples(one)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) < 1e-6, key


def test_nothing_observed_leaves_the_histogram_as_it_was() -> None:
    one, many = _pair()
    observe_many(many, [])
    assert _samples(many) == _samples(one)


def test_a_histogram_without_the_internals_gets_the_plain_loop() -> None:
    class Plain:
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, amount: float) -> None:
            self.seen.append(amount)

    plain = Plain()
    observe_many(plain, [0.1, 0.2])  # type: ignore[arg-type]
    assert plain.seen == [0.1, 0.2]
