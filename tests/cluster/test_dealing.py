"""The self-healing cluster (issue 11) with real processes: `duetime api`, three `duetime engine`
**without --shards** (the live engines deal the 16 shards, two engines each), two `duetime worker`,
NATS JetStream, shards 0-7 and 8-15 on two PostgreSQL servers.

test_f: a burst; then SIGKILL of one engine and one worker in the middle of a second burst -- every
run starts, a run starts twice only after a lapsed lease, the runs of the dead engine's shards start
within one lease + 10 s of their due time, and `duetime cluster status --json` shows no
under-replicated shard within two leases; then a fourth engine joins while a third burst waits in
the survivors' wheels: it is dealt its share within two leases, and the claims it takes over are
neither lost nor doubled.

test_g: a rolling restart (SIGTERM, start again under the same id) of every engine under steady
load loses and doubles nothing.

DUETIME_TEST_CLUSTER_RUNS scales the bursts (default 3,000: bursts of 1,000).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from duetime.core.ids import SHARDS, shard_of
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from loadtest.common import ReceiverProcess, quantiles
from tests.cluster.harness import (
    Arrivals,
    Cluster,
    lateness_ms,
    new_owner,
    one_off_specs,
    register,
    until,
    utcnow,
    wait_for_arrivals,
)
from tests.support.wait import settles

RUNS = int(os.environ.get("DUETIME_TEST_CLUSTER_RUNS", "3000"))
BURST = max(RUNS // 3, 300)
LEASE_S = 4.0  # cluster_env's DUETIME_LEASE_S
# Registration through one API process on a loaded 2-core machine: budget 60 creates/s.
REGISTER_BUDGET_S = 5.0 + BURST / 60


@pytest.fixture
async def store(two_primaries: tuple[str, str]) -> AsyncIterator[PostgresStore]:
    a, b = two_primaries
    s = await PostgresStore.open(ShardMap.from_dsns([a] * 8 + [b] * 8), pool_size=2)
    yield s
    await s.close()


async def _dealt_cluster(cluster: Cluster) -> None:
    await cluster.api()
    # One after another: each start is a join the others see at their next heartbeat.
    for name in ("e1", "e2", "e3"):
        await cluster.engine(name)
    await asyncio.gather(cluster.worker("w1"), cluster.worker("w2"))
    await _until_dealt(cluster, {"test-e1", "test-e2", "test-e3"}, within=2 * LEASE_S)


# One `duetime cluster status` process takes 1-3 s to start and answer on the loaded 2-core
# machine; a deal that settled within two leases may be seen that much later.
STATUS_CALL_S = 3.0


async def _until_dealt(cluster: Cluster, engines: set[str], *, within: float) -> dict[str, Any]:
    """Until exactly ``engines`` are live, every shard has 2 of them, and loads differ by ≤ 1
    (``within`` plus the time of the one status call that may be under way)."""
    last: dict[str, Any] = {}

    async def settled() -> bool:
        nonlocal last
        last = await cluster.status()
        loads = [len(e["shards"]) for e in last["engines"]]
        return (
            {e["id"] for e in last["engines"]} == engines
            and last["under_replicated"] == []
            and all(len(last["shards"][str(s)]) == 2 for s in range(SHARDS))
            and max(loads) - min(loads) <= 1
        )

    try:
        await until(
            settled, within=within + STATUS_CALL_S, what=f"a settled deal over {sorted(engines)}", every=0.5
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status: {last}") from None
    return last


async def _burst(
    cluster: Cluster, store: PostgresStore, receiver: ReceiverProcess, *, spread_s: float, lead_s: float
) -> tuple[list[str], dict[str, datetime]]:
    n = BURST
    key, _ = await store.create_api_key(new_owner())
    first = utcnow() + timedelta(seconds=lead_s)
    specs, due = one_off_specs(f"{receiver.url}/burst", first, spread_s, n)
    started = time.monotonic()
    ids = await register(cluster.api_url, key, specs)
    took = time.monotonic() - started
    print(f"\nregistered {n} jobs in {took:.1f} s ({n / took:.0f}/s); first due at +{lead_s:.1f} s")
    assert took < lead_s, "registration ran past the first due time: raise the lead"
    return ids, {ids[i]: due[i] for i in range(n)}


async def _history(store: PostgresStore) -> dict[str, list[tuple[str, int]]]:
    out: dict[str, list[tuple[str, int]]] = {}
    for dsn in store.shard_map.databases():
        for r in await store.pool_for_dsn(dsn).fetch(
            "SELECT job_id, outcome, fencing_token FROM runs ORDER BY run_id"
        ):
            out.setdefault(str(r["job_id"]), []).append((r["outcome"], r["fencing_token"]))
    return out


async def _states(store: PostgresStore) -> dict[str, int]:
    counts: dict[str, int] = {}
    for dsn in store.shard_map.databases():
        for r in await store.pool_for_dsn(dsn).fetch("SELECT state, count(*) AS n FROM jobs GROUP BY state"):
            counts[r["state"]] = counts.get(r["state"], 0) + r["n"]
    return counts


async def _settled(store: PostgresStore, n: int) -> None:
    """Until all ``n`` jobs are completed. A worker records an outcome after its call came back
    (the completer writes in batches), so the receiver has seen the last calls before their rows
    say so: read once right after the arrivals, the states were a race."""
    await settles(lambda: _states(store), {"completed": n}, within=30, what="the jobs' states")


def _assert_duplicates_were_lapsed_leases(
    arrivals: Arrivals, history: dict[str, list[tuple[str, int]]], jobs: set[str]
) -> int:
    duplicated = {j: c for j, c in arrivals.duplicated().items() if j in jobs}
    for job, calls in duplicated.items():
        assert len(arrivals.keys[job]) == 1, f"{job}: one occurrence, one Idempotency-Key"
        tokens = [token for _, token, _ in calls]
        assert tokens == sorted(set(tokens)), f"{job}: each call under a higher token: {calls}"
        lapsed = {token for outcome, token in history.get(job, []) if outcome == "lease_expired"}
        assert set(tokens[:-1]) <= lapsed, (
            f"{job}: called again only after a lapsed lease: {history.get(job)}"
        )
    return len(duplicated)


def _report(name: str, arrivals: Arrivals, due: dict[str, datetime]) -> dict[str, float]:
    q = quantiles([ms for ms in lateness_ms(arrivals, due)])
    print(
        f"{name}: {sum(len(arrivals.by_job.get(j, [])) for j in due)} calls for {len(due)} jobs; "
        f"lateness ms p50 {q['p50']:.0f} p90 {q['p90']:.0f} p99 {q['p99']:.0f} max {q['max']:.0f}"
    )
    return q


def _only(arrivals: Arrivals, jobs: set[str]) -> Arrivals:
    return Arrivals(
        {j: c for j, c in arrivals.by_job.items() if j in jobs},
        {j: k for j, k in arrivals.keys.items() if j in jobs},
    )


@pytest.mark.timeout(420 + RUNS // 20)
async def test_f_three_dealt_engines_heal_a_death_and_take_in_a_fourth(
    cluster: Cluster, store: PostgresStore, receiver_process: ReceiverProcess
) -> None:
    await _dealt_cluster(cluster)

    # 1. A burst over the three dealt engines: each run once.
    ids1, due1 = await _burst(cluster, store, receiver_process, spread_s=3.0, lead_s=REGISTER_BUDGET_S)
    got = await wait_for_arrivals(receiver_process, set(ids1), within=60 + BURST / 100)
    _report("burst 1", _only(got, set(ids1)), due1)
    # Nothing is killed here, but on a machine this loaded (the 4 s test lease, 1 s heartbeats) a
    # heartbeat can come too late: such a run may start twice, only after a lapsed lease.
    dups = _assert_duplicates_were_lapsed_leases(got, await _history(store), set(ids1))
    print(f"burst 1 duplicates: {dups} (each a lapsed lease with a higher token)")

    # 2. SIGKILL an engine and a worker a third of the way into a second burst.
    ids2, due2 = await _burst(cluster, store, receiver_process, spread_s=8.0, lead_s=REGISTER_BUDGET_S)
    before = await cluster.status()
    victim_shards = set(next(e["shards"] for e in before["engines"] if e["id"] == "test-e1"))
    first_due = min(due2.values())
    await asyncio.sleep(max((first_due - utcnow()).total_seconds(), 0) + 8.0 / 3)
    cluster.procs["e1"].kill()
    cluster.procs["w1"].kill()
    killed_at = utcnow()
    killed_mono = time.monotonic()
    print(
        f"killed test-e1 (shards {sorted(victim_shards)}) and w1 "
        f"at +{(killed_at - first_due).total_seconds():.1f} s into the burst"
    )
    after = await _until_dealt(cluster, {"test-e2", "test-e3"}, within=2 * LEASE_S)
    healed_s = time.monotonic() - killed_mono
    print(f"cluster status: no under-replicated shard {healed_s:.1f} s after the kill")
    assert all(set(after["shards"][str(s)]) == {"test-e2", "test-e3"} for s in range(SHARDS))

    got = await wait_for_arrivals(
        receiver_process, set(ids1) | set(ids2), within=90 + BURST / 100, settle_s=6.0
    )
    history = await _history(store)
    burst2 = _only(got, set(ids2))
    _report("burst 2 (kills)", burst2, due2)
    dups = _assert_duplicates_were_lapsed_leases(got, history, set(ids2))
    print(f"duplicates after the kills: {dups} (each a lapsed lease with a higher token)")
    # The runs of the dead engine's shards started within one lease + 10 s of their due time.
    on_victim = {j for j in ids2 if shard_of(uuid.UUID(j)) in victim_shards}
    late = {j: burst2.by_job[j][0][2] / 1e6 - due2[j].timestamp() * 1000 for j in on_victim}
    worst = max(late.values())
    q = quantiles(list(late.values()))
    print(
        f"runs on the dead engine's shards: {len(on_victim)}, lateness ms p50 {q['p50']:.0f} "
        f"p90 {q['p90']:.0f} p99 {q['p99']:.0f} max {worst:.0f}"
    )
    assert worst <= (LEASE_S + 10) * 1000, f"a run on a dead engine's shard started {worst / 1000:.1f} s late"
    # Failover: SIGKILL → first start, on each of the victim's shards, of a run due after the kill.
    firsts: dict[int, float] = {}
    for j in on_victim:
        if due2[j] > killed_at:
            shard = shard_of(uuid.UUID(j))
            at = burst2.by_job[j][0][2] / 1e9 - killed_at.timestamp()
            firsts[shard] = min(firsts.get(shard, at), at)
    if firsts:
        print(
            f"failover (kill → first start per shard): max {max(firsts.values()):.1f} s, "
            f"min {min(firsts.values()):.1f} s over {len(firsts)} shards"
        )

    # 3. A third burst claimed into the survivors' wheels, then a fourth engine joins.
    ids3, due3 = await _burst(
        cluster, store, receiver_process, spread_s=3.0, lead_s=REGISTER_BUDGET_S + 2 * LEASE_S + 6
    )
    await asyncio.sleep(1.0)  # the survivors claim it (due inside their lookahead)
    joined = time.monotonic()
    await cluster.engine("e4")
    dealt = await _until_dealt(cluster, {"test-e2", "test-e3", "test-e4"}, within=2 * LEASE_S)
    share = next(len(e["shards"]) for e in dealt["engines"] if e["id"] == "test-e4")
    print(f"the fourth engine serves {share} shards {time.monotonic() - joined:.1f} s after it started")
    assert share in (10, 11)
    assert min(due3.values()) > utcnow(), "the join was over only after the third burst came due"
    got = await wait_for_arrivals(
        receiver_process, set(ids1) | set(ids2) | set(ids3), within=60 + BURST / 100, settle_s=3.0
    )
    burst3 = _only(got, set(ids3))
    _report("burst 3 (join)", burst3, due3)
    assert burst3.by_job.keys() == set(ids3)
    assert burst3.duplicated() == {}, "a handover to a joining engine must not call anything twice"
    await _settled(store, 3 * BURST)


@pytest.mark.timeout(300 + RUNS // 20)
async def test_g_a_rolling_restart_of_dealt_engines_loses_and_doubles_nothing(
    cluster: Cluster, store: PostgresStore, receiver_process: ReceiverProcess
) -> None:
    await _dealt_cluster(cluster)
    ids, due = await _burst(cluster, store, receiver_process, spread_s=80.0, lead_s=REGISTER_BUDGET_S)
    first_in_s = max((min(due.values()) - utcnow()).total_seconds(), 0.0)
    await asyncio.sleep(first_in_s + 1.0)
    for name in ("e1", "e2", "e3"):
        assert await cluster.procs[name].terminate() == 0, cluster.procs[name].output()[-3000:]
        await cluster.restart(name)
        await _until_dealt(cluster, {"test-e1", "test-e2", "test-e3"}, within=2 * LEASE_S)
    seen = len(_only(Arrivals.of(await receiver_process.dump()), set(ids)).by_job)
    assert seen < len(ids), "the restarts were over before the load was: make the spread longer"
    got = await wait_for_arrivals(receiver_process, set(ids), within=120 + BURST / 100, settle_s=3.0)
    _report("rolling restart", got, due)
    assert got.by_job.keys() == set(ids)
    assert got.duplicated() == {}, "a graceful restart must not call anything twice"
    await _settled(store, BURST)
