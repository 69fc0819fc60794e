"""Dealing: which live engines serve which of the 16 logical shards.

Every engine computes this from the same membership (the live engines and the shards each may
serve) and gets the same answer, so no election and no coordinator are needed; claims stay
``FOR UPDATE SKIP LOCKED`` under lease tokens, so two engines disagreeing for a heartbeat costs
nothing but a moment of extra contention.

The rule, in order of priority:

1. **Replicas**: each shard gets ``min(R, engines allowed to serve it)`` distinct engines.
2. **Balance**: the loads (shards per engine) are as even as the restrictions allow -- the deal
   minimises the sum of squared loads, so two engines that could trade a shard never differ by
   more than one (in particular, engines without restrictions differ by at most one).
3. **Stickiness** (minimal movement): among the balanced deals, the one whose pairs have the
   highest rendezvous weights ``hash(shard, engine id)``. A pair's weight depends on nothing but
   the pair, so a join or a death changes the preferences of no other pair: the new optimum keeps
   the pairs that were already best, and a join takes about ``R * 16 / n`` slots from the others
   while a death hands out only the dead engine's slots.

It is a min-cost flow (source → shard → engine → sink) with the convex cost ``load * BIG`` on the
engine side and the rendezvous rank on the pair, solved by successive shortest paths; the graph
has 16 + n + 2 nodes, so it takes a millisecond or two for tens of engines. Pure and
deterministic: integers only, inputs sorted, ties broken by engine id.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from duetime.core.ids import SHARDS

ALL_SHARDS: frozenset[int] = frozenset(range(SHARDS))
# Pair weights are 48-bit; one unit of load must outweigh every pair weight of a deal together.
_WEIGHT_BITS = 48


@dataclass(frozen=True, slots=True)
class Member:
    """One live engine as the dealing sees it: its id and the shards it may serve."""

    engine_id: str
    allowed: frozenset[int] = ALL_SHARDS


@dataclass(frozen=True, slots=True)
class Deal:
    """The answer: for every shard 0-15 the engines serving it (sorted), and the reverse."""

    replicas: int
    by_shard: Mapping[int, tuple[str, ...]]
    by_engine: Mapping[str, frozenset[int]]

    def shards_of(self, engine_id: str) -> frozenset[int]:
        return self.by_engine.get(engine_id, frozenset())

    @property
    def unserved(self) -> tuple[int, ...]:
        """Shards no live engine may serve: nothing of them is claimed until one may."""
        return tuple(s for s in range(SHARDS) if not self.by_shard[s])

    @property
    def under_replicated(self) -> tuple[int, ...]:
        """Shards with fewer engines than ``replicas`` (too few engines, or restrictions)."""
        return tuple(s for s in range(SHARDS) if len(self.by_shard[s]) < self.replicas)


def weight(shard: int, engine_id: str) -> int:
    """The rendezvous weight of a (shard, engine) pair: stable across processes and versions."""
    digest = hashlib.blake2b(f"{shard}\x00{engine_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - _WEIGHT_BITS)


def deal(members: Iterable[Member], replicas: int) -> Deal:
    """Deal the 16 shards over ``members`` with ``replicas`` engines per shard (see the module)."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    engines = sorted({m.engine_id: m for m in members}.values(), key=lambda m: m.engine_id)
    n = len(engines)
    by_engine: dict[str, set[int]] = {m.engine_id: set() for m in engines}
    by_shard: dict[int, list[str]] = {s: [] for s in range(SHARDS)}
    if n:
        for shard, e in _solve(engines, replicas):
            by_shard[shard].append(engines[e].engine_id)
            by_engine[engines[e].engine_id].add(shard)
    return Deal(
        replicas=replicas,
        by_shard={s: tuple(sorted(ids)) for s, ids in by_shard.items()},
        by_engine={e: frozenset(s) for e, s in by_engine.items()},
    )


class _Graph:
    """A residual graph for min-cost flow: edges in flat lists, ``adj`` by node."""

    def __init__(self, nodes: int) -> None:
        self.adj: list[list[int]] = [[] for _ in range(nodes)]
        self.to: list[int] = []
        self.cap: list[int] = []
        self.cost: list[int] = []

    def add(self, u: int, v: int, cap: int, cost: int) -> int:
        self.adj[u].append(len(self.to))
        self.to.append(v)
        self.cap.append(cap)
        self.cost.append(cost)
        self.adj[v].append(len(self.to))
        self.to.append(u)
        self.cap.append(0)
        self.cost.append(-cost)
        return len(self.to) - 2


def _solve(engines: list[Member], replicas: int) -> list[tuple[int, int]]:
    """(shard, engine index) pairs of the min-cost flow."""
    n = len(engines)
    source, sink = 0, 1 + SHARDS + n
    shard_node = [1 + s for s in range(SHARDS)]
    engine_node = [1 + SHARDS + e for e in range(n)]
    g = _Graph(sink + 1)
    max_weight = (1 << _WEIGHT_BITS) - 1
    # One more unit of load must cost more than any difference in pair costs of a whole deal.
    big = (max_weight + 1) * SHARDS * SHARDS * 4
    pair_edges: list[tuple[int, int, int]] = []
    for s in range(SHARDS):
        allowed = [e for e in range(n) if s in engines[e].allowed]
        g.add(source, shard_node[s], min(replicas, len(allowed)), 0)
        for e in allowed:
            # Higher weight = cheaper; the id breaks exact ties (in rank order, via the cost).
            edge = g.add(shard_node[s], engine_node[e], 1, max_weight - weight(s, engines[e].engine_id))
            pair_edges.append((edge, s, e))
    for e in range(n):
        for k in range(1, len(engines[e].allowed & ALL_SHARDS) + 1):
            g.add(engine_node[e], sink, 1, big * (2 * k - 1))  # convex: Σ = big * load²
    _min_cost_flow(g, source, sink)
    return [(s, e) for edge, s, e in pair_edges if g.cap[edge] == 0]


def _min_cost_flow(g: _Graph, source: int, sink: int) -> None:
    """Successive shortest paths with Dijkstra on reduced costs (all initial costs are ≥ 0).

    Each augmentation pushes one unit (every path crosses a capacity-1 pair edge), so the result
    is the same on every machine: integer costs, a fixed edge order, heap ties broken by node."""
    nodes = len(g.adj)
    potential = [0] * nodes
    inf = 1 << 256
    while True:
        dist = [inf] * nodes
        via = [-1] * nodes
        dist[source] = 0
        heap: list[tuple[int, int]] = [(0, source)]
        while heap:
            d, u = heapq.heappop(heap)
            if d > dist[u]:
                continue
            for edge in g.adj[u]:
                if g.cap[edge] <= 0:
                    continue
                v = g.to[edge]
                nd = d + g.cost[edge] + potential[u] - potential[v]
                if nd < dist[v]:
                    dist[v] = nd
                    via[v] = edge
                    heapq.heappush(heap, (nd, v))
        if dist[sink] == inf:
            return
        for v in range(nodes):
            if dist[v] < inf:
                potential[v] += dist[v]
        v = sink
        while v != source:
            edge = via[v]
            g.cap[edge] -= 1
            g.cap[edge ^ 1] += 1
            v = g.to[edge ^ 1]
