"""Flow control's contract (``FlowControl.take_flow``), for every store: grants within a key's
parallelism across workers, a worker's running calls counted, slots given back at once or when
they lapse, a rate kept within 10 % over a measured span, two owners' keys apart, and one answer
per ask in the asks' order.

Time is real on both stores (the memory store's clock is the system's), so the rate case measures
a short span of wall-clock time and the lapse case waits for a hold of a fraction of a second.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from duetime.storage.flow_rules import bucket_capacity
from duetime.storage.ports import FlowAsk, FlowGrant
from tests.contract.conftest import Store, new_owner
from tests.support.wait import until

FAST = 10000.0  # 1000 tokens a bucket: the rate is never what limits these cases
HOLD_S = 30.0


def ask(
    owner: str,
    want: int,
    running: int = 0,
    *,
    key: str = "api",
    rate: float = FAST,
    parallelism: int = 3,
) -> FlowAsk:
    return FlowAsk(owner=owner, key=key, rate_per_s=rate, parallelism=parallelism, want=want, running=running)


async def take(store: Store, worker: str, one: FlowAsk, *, hold_s: float = HOLD_S) -> int:
    [got] = await store.take_flow(worker, [one], hold_s=hold_s)
    assert (got.owner, got.key) == (one.owner, one.key)
    return got.granted


async def test_grants_stay_within_the_parallelism_across_workers(store: Store) -> None:
    o = new_owner()
    assert await take(store, "w1", ask(o, want=2)) == 2
    assert await take(store, "w2", ask(o, want=5)) == 1  # 3 - the 2 w1 holds
    assert await take(store, "w2", ask(o, want=5, running=1)) == 0  # w2 runs its 1: full
    assert await take(store, "w1", ask(o, want=5, running=2)) == 0
    # w1 finished one of its two calls and says so: its slot is free for anyone
    assert await take(store, "w1", ask(o, want=0, running=1)) == 0
    assert await take(store, "w2", ask(o, want=5, running=1)) == 1
    assert await take(store, "w3", ask(o, want=1)) == 0


async def test_a_workers_running_calls_count(store: Store) -> None:
    """Calls a worker reports running hold slots even when this store never granted them (a
    worker that restarted its flow loop, or a grant it took before the key's holder lapsed)."""
    o = new_owner()
    assert await take(store, "w1", ask(o, want=5, running=2)) == 1
    assert await take(store, "w2", ask(o, want=5)) == 0
    # over the limit already (the limit went down): nothing more, and no negative grant
    assert await take(store, "w1", ask(o, want=5, running=3, parallelism=2)) == 0
    assert await take(store, "w2", ask(o, want=5, parallelism=2)) == 0


async def test_want_and_running_zero_give_the_slots_back_at_once(store: Store) -> None:
    o = new_owner()
    assert await take(store, "w1", ask(o, want=3)) == 3
    assert await take(store, "w2", ask(o, want=3)) == 0
    assert await take(store, "w1", ask(o, want=0, running=0)) == 0
    assert await take(store, "w2", ask(o, want=3)) == 3


async def test_a_lapsed_holder_gives_its_slots_back(store: Store) -> None:
    """A worker that died stops asking; its slots count until its hold runs out, then no more."""
    o = new_owner()
    assert await take(store, "dead", ask(o, want=3), hold_s=0.4) == 3
    assert await take(store, "w2", ask(o, want=3)) == 0
    granted: list[int] = []

    async def w2_gets_them() -> bool:
        granted.append(await take(store, "w2", ask(o, want=3)))
        return granted[-1] > 0

    await until(w2_gets_them, within=10.0, what="the dead worker's slots to lapse")
    assert granted[-1] == 3


async def test_asking_again_renews_the_hold(store: Store) -> None:
    o = new_owner()
    assert await take(store, "w1", ask(o, want=3), hold_s=0.3) == 3
    assert await take(store, "w1", ask(o, want=0, running=3)) == 0  # renewed for HOLD_S
    await asyncio.sleep(0.6)  # past the first hold
    assert await take(store, "w2", ask(o, want=3)) == 0


async def test_the_rate_holds_within_10_percent_over_a_span(store: Store) -> None:
    """At 50 calls a second over 2 s, a worker asking for as many as it can get is granted the
    bucket's capacity plus 50 a second of what passed, within 10 %; never a burst past that."""
    o, rate = new_owner(), 50.0
    loop = asyncio.get_running_loop()
    total, calls = 0, 0
    start = loop.time()
    while loop.time() - start < 2.0:
        total += await take(store, "w1", ask(o, want=1000, rate=rate, parallelism=10000))
        calls += 1
        await asyncio.sleep(0.02)
    span_s = loop.time() - start
    expected = rate * span_s + bucket_capacity(rate)
    load = os.getloadavg()[0]
    assert abs(total - expected) <= 0.1 * expected, (total, expected, span_s, calls, f"load1={load:.2f}")
    assert calls > 20, (calls, f"load1={load:.2f}")  # the span was sampled, not asked twice


async def test_an_idle_key_bursts_no_more_than_its_capacity(store: Store) -> None:
    o, loop = new_owner(), asyncio.get_running_loop()
    start = loop.time()
    assert await take(store, "w1", ask(o, want=1000, rate=200, parallelism=10000)) == 100  # 0.5 s of rate
    then = await take(store, "w2", ask(o, want=1000, rate=200, parallelism=10000))
    assert then <= 200 * (loop.time() - start) + 1  # only what the time between refilled
    p = new_owner()
    assert await take(store, "w1", ask(p, want=5, rate=0.5)) == 1  # at least one token
    assert await take(store, "w1", ask(p, want=5, rate=0.5, running=1)) == 0


async def test_two_owners_with_the_same_key_never_share(store: Store) -> None:
    a, b = new_owner(), new_owner()
    assert await take(store, "w1", ask(a, want=3)) == 3
    assert await take(store, "w1", ask(b, want=3)) == 3  # the same worker, key and limits
    assert await take(store, "w2", ask(a, want=1)) == 0
    assert await take(store, "w2", ask(b, want=1)) == 0
    # nor their buckets: a spent its only token, b still has its own
    assert await take(store, "w1", ask(a, want=1, key="slow", rate=1)) == 1
    assert await take(store, "w2", ask(a, want=1, key="slow", rate=1)) == 0
    assert await take(store, "w2", ask(b, want=1, key="slow", rate=1)) == 1


async def test_one_call_answers_every_ask_in_its_order(store: Store) -> None:
    a, b = new_owner(), new_owner()
    asks = [
        ask(a, want=2, key="zeta"),
        ask(b, want=9, key="alpha", parallelism=4),
        ask(a, want=1, key="alpha", parallelism=1),
        ask(a, want=0, key="idle"),
    ]
    grants = await store.take_flow("w1", asks, hold_s=HOLD_S)
    assert grants == [
        FlowGrant(a, "zeta", 2),
        FlowGrant(b, "alpha", 4),
        FlowGrant(a, "alpha", 1),
        FlowGrant(a, "idle", 0),
    ]
    assert await store.take_flow("w1", [], hold_s=HOLD_S) == []


@pytest.mark.parametrize(
    "asks",
    [
        [ask("o", want=1), ask("o", want=2)],  # one (owner, key) twice
        [ask("o", want=-1)],
        [ask("o", want=1, running=-1)],
        [ask("o", want=1, parallelism=0)],
        [ask("o", want=1, rate=0.0)],
    ],
)
async def test_asks_no_worker_should_send_are_refused(store: Store, asks: list[FlowAsk]) -> None:
    with pytest.raises(ValueError):
        await store.take_flow("w1", asks, hold_s=HOLD_S)
