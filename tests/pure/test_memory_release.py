"""The allocator's free memory goes back once per drained burst (duetime.memory), never while
runs are held and never for a trickle: the step costs a walk of the C heap."""

from __future__ import annotations

from duetime.memory import DrainWatch, release_free_memory


def test_released_once_when_a_burst_has_drained() -> None:
    calls: list[int] = []

    def release() -> bool:
        calls.append(1)
        return True

    watch = DrainWatch(min_burst=10_000, release=release)
    for held in (0, 0, 3_000, 0, 9_999, 0):  # below a burst: nothing to give back worth a walk
        assert not watch.observe(held)
    for held in (20_000, 500_000, 120_000, 7):  # a burst, still draining
        assert not watch.observe(held)
    assert watch.observe(0)
    for held in (0, 0, 0):  # once per burst
        assert not watch.observe(held)
    assert not watch.observe(15_000)
    assert watch.observe(0)
    assert len(calls) == watch.releases == 2


def test_release_is_harmless_where_it_runs() -> None:
    assert release_free_memory() in (True, False)  # glibc: trimmed or not; elsewhere: False
    assert bytearray(1 << 20)  # the heap still allocates afterwards
