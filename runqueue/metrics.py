"""Prometheus metrics of the run path, one per stage, so a burst can be read stage by stage."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

_LATENESS_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)

CLAIMS = Counter("duetime_claims_total", "Rows claimed into a wheel", ["shard"])
CLAIM_BATCHES = Counter("duetime_claim_batches_total", "Claim statements run", ["shard"])
RETAKEN = Counter("duetime_claims_retaken_total", "Rows taken back by a restarted engine")
CLAIMS_KEPT = Counter(
    "duetime_claims_kept_total", "Waiting claims whose lease the engine extended while a burst drained"
)
WHEEL_SIZE = Gauge("duetime_wheel_entries", "Runs waiting in this engine's wheel")
FIRES = Counter("duetime_fires_total", "Wheel entries fired")
FIRE_LATENESS = Histogram(
    "duetime_fire_lateness_seconds", "Wheel fire time minus due time", buckets=_LATENESS_BUCKETS
)
FENCE_SECONDS = Histogram(
    "duetime_fence_seconds",
    "Duration of one fence statement (a batch of fired runs)",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)
FENCED = Counter("duetime_fenced_total", "Runs that passed the fence before the call")
FENCE_REJECTED = Counter(
    "duetime_fence_rejected_total", "Fired runs dropped by the fence (cancelled, paused, changed, lease lost)"
)
MISFIRES = Counter("duetime_misfires_total", "Overdue occurrences handled by policy", ["policy"])
SKIPPED = Counter("duetime_skipped_occurrences_total", "Missed occurrences skipped by policy")
CATCH_UP_RUNS = Counter(
    "duetime_catch_up_runs_total", "Late occurrences handed to runs of their own to catch up (run_all, grace)"
)
QUEUE_DEPTH = Gauge("duetime_run_queue_depth", "Runs fenced and waiting for a worker")
CALLS = Counter("duetime_calls_total", "Target calls by outcome", ["outcome"])
START_LATENESS = Histogram(
    "duetime_start_lateness_seconds", "Call start minus due time", buckets=_LATENESS_BUCKETS
)
TARGET_LATENCY = Histogram(
    "duetime_target_latency_seconds",
    "Target call duration",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
TARGET_STATES = Gauge("duetime_target_state", "Webhook hosts this worker tracks, by health state", ["state"])
TARGET_STATE_CHANGES = Counter(
    "duetime_target_state_changes_total", "Webhook hosts' health changes, by the state entered", ["state"]
)
RUNS_WAITING = Gauge(
    "duetime_runs_waiting",
    "Runs a worker holds waiting: for their host's room (host), for a host that backs off "
    "(backing_off), for a flow key's grant (flow)",
    ["reason"],
)
COMPLETIONS = Counter("duetime_completions_total", "Attempts recorded under a valid lease")
STALE_COMPLETIONS = Counter(
    "duetime_stale_completions_total", "Completions rejected because the lease token no longer matched"
)
UNWRITABLE_COMPLETIONS = Counter(
    "duetime_unwritable_completions_total",
    "Outcomes the database refused for a reason of their own (not an outage or contention): "
    "given up alone so the rest of their batch is recorded; the run's lease lapses and the "
    "janitor records it as lease_expired",
)
LEASE_EXTENSIONS = Counter("duetime_lease_extensions_total", "Leases extended by heartbeats")
LEASES_LOST = Counter("duetime_leases_lost_total", "Heartbeats that found the lease taken over")
JANITOR_RESCUES = Counter("duetime_janitor_rescues_total", "Rows whose lapsed lease the janitor handled")
RELEASED = Counter("duetime_released_total", "Claimed rows given back unfired (shutdown)")
OVERLAP_SPLITS = Counter(
    "duetime_overlap_splits_total",
    "Occurrences of overlap=allow jobs started in a row of their own because the previous run was in flight",
)
PAUSES_ENDED = Counter(
    "duetime_pauses_ended_total",
    "Jobs resumed by Duetime because their pause's until came (auto_resume)",
)
OLDEST_UNCLAIMED_DUE = Gauge(
    "duetime_oldest_unclaimed_due_seconds",
    "Age of the oldest due row of the shard that no engine has claimed (0 = none waits)",
    ["shard"],
)
# Membership and dealing (engine/membership.py): what this engine serves and what it sees.
SERVING = Gauge("duetime_engine_shards", "Logical shards this engine serves now (dealt to it)")
SHARDS_GAINED = Counter("duetime_shards_gained_total", "Shards dealt to this engine while it ran")
SHARDS_LOST = Counter("duetime_shards_lost_total", "Shards dealt away from this engine (handed over)")
SHARD_ENGINES = Gauge(
    "duetime_shard_engines",
    "Live engines serving each logical shard, as this engine read the membership (0: nobody claims it)",
    ["shard"],
)
SHARD_REPLICAS = Gauge("duetime_shard_replicas", "Engines wanted per shard (DUETIME_SHARD_REPLICAS)")
LIVE_ENGINES = Gauge("duetime_live_engines", "Live engines in the membership, as this engine read it")
MEMBERSHIP_FAILURES = Counter(
    "duetime_membership_failures_total", "Membership heartbeats that failed (home database unreachable)"
)


def observe_many(histogram: Histogram, amounts: Iterable[float]) -> None:
    """``histogram.observe(a)`` for each of ``amounts``, with one increment per bucket and one of
    the sum instead of one of each per amount.

    A burst observes three histograms per run (fire lateness, start lateness, target latency),
    a batch of 500 at a time with the same target latency for all of them: at ~0.6-1 µs per
    ``observe`` (a Python scan of the bounds and a lock per increment) that was 4-5 % of a node's
    CPU per run. The buckets are the client library's own (``_upper_bounds``, ``_buckets``,
    ``_sum``, as ``Histogram.observe`` uses them); ``tests/pure/test_metrics_many.py`` checks the
    result equals one ``observe`` per amount on the installed version, and a client without those
    attributes gets the plain loop.
    """
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for amount in amounts:
            histogram.observe(amount)
        return
    counts = [0] * len(bounds)
    summed = 0.0
    for amount in amounts:
        summed += amount
        # Histogram.observe's bucket: the first bound the amount is <= to (the last is +Inf).
        counts[bisect_left(bounds, amount)] += 1
    total.inc(summed)
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)
