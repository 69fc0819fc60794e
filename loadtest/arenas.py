"""Which live objects keep pymalloc's arenas from being returned (issue 16, "memory back after a
million"): a diagnostic for the benchmark's task dump (``DUETIME_BENCH_ARENAS=1``) and for
in-process experiments.

pymalloc (CPython's allocator for blocks of at most 512 B) carves 1 MiB arenas into 16 KiB pools,
each pool holding blocks of one size class, and gives an arena back to the system only once every
pool in it is empty. After a burst the blocks of its runs are freed, but one surviving block in an
arena keeps the whole MiB. This reads the pools' own headers (CPython 3.11 layout, 64-bit) to count
the used pools per arena, then places every live object it can reach into its pool, so that an
arena kept by a few blocks names the types of those blocks and, with tracemalloc on, where they were
allocated.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import sys
import tracemalloc
from typing import Any

POOL_SIZE = 1 << 14
_POOL_MASK = ~(POOL_SIZE - 1)
_HEADER = 48  # sizeof(struct pool_header): ref, freeblock, nextpool, prevpool, 4 uints
_HAVE_GC = 1 << 14  # Py_TPFLAGS_HAVE_GC: the object sits after a 16-byte GC header


def _anonymous_ranges() -> list[tuple[int, int]]:
    """Anonymous read-write mappings (pymalloc's arenas are among them)."""
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 5 and parts[1].startswith("rw"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((lo, hi))
    return ranges


def _pool_header(pool: int) -> tuple[int, int, int] | None:
    """(blocks in use, arena index, size class) if ``pool`` looks like a used pymalloc pool."""
    count = ctypes.c_uint.from_address(pool).value
    arena, szidx, nextoff, maxnext = (ctypes.c_uint * 4).from_address(pool + 32)
    if szidx > 31 or not count:
        return None
    size = (szidx + 1) * 16
    if maxnext != POOL_SIZE - size or nextoff > POOL_SIZE or count > (POOL_SIZE - _HEADER) // size:
        return None
    return count, arena, szidx


def used_pools() -> dict[int, tuple[int, int, int]]:
    """Every used pool of every arena: pool address -> (blocks in use, arena index, size class)."""
    pools: dict[int, tuple[int, int, int]] = {}
    for lo, hi in _anonymous_ranges():
        start = (lo + POOL_SIZE - 1) & _POOL_MASK
        for pool in range(start, hi - POOL_SIZE + 1, POOL_SIZE):
            header = _pool_header(pool)
            if header is not None:
                pools[pool] = header
    return pools


def _all_objects() -> list[Any]:
    """Every object reachable from the GC's list, untracked ones (str, bytes, int, float,
    datetime, untracked tuples) included, once each."""
    seen: dict[int, Any] = {}
    for o in gc.get_objects():
        seen[id(o)] = o
    todo = list(seen.values())
    while todo:
        found = []
        for o in todo:
            for r in gc.get_referents(o):
                if id(r) not in seen:
                    seen[id(r)] = r
                    found.append(r)  # untracked: its own referents are not on the GC's list
        todo = found
    return list(seen.values())


def report(out: Any, *, sparse_pools: int = 8, tracebacks: int = 12) -> None:
    """Arenas by how many of their pools are used, and what the blocks in the sparse ones are."""
    objects = _all_objects()  # first: what the report allocates below is not counted
    pools = used_pools()
    arenas: dict[int, list[int]] = collections.defaultdict(list)
    for pool, (_, arena, _) in pools.items():
        arenas[arena].append(pool)
    blocks = sum(c * (s + 1) * 16 for c, _, s in pools.values())
    print(
        f"--- pymalloc: {len(arenas)} arenas with used pools, {len(pools)} used pools, "
        f"{blocks / 2**20:.1f} MB in blocks",
        file=out,
    )
    hist = collections.Counter(min(len(p), 64) // 8 * 8 for p in arenas.values())
    print(
        "  arenas by used pools (of ~63): " + ", ".join(f"{k}-{k + 7}: {hist[k]}" for k in sorted(hist)),
        file=out,
    )
    classes: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for count, _, szidx in pools.values():
        row = classes[(szidx + 1) * 16]
        row[0] += 1
        row[1] += count
        row[2] += (POOL_SIZE - _HEADER) // ((szidx + 1) * 16)
    print(
        "  used pools by block size (pools, blocks used / capacity): "
        + ", ".join(f"{k}: {r[0]} ({100 * r[1] // r[2]}%)" for k, r in sorted(classes.items())),
        file=out,
    )
    sparse = {a for a, p in arenas.items() if len(p) <= sparse_pools}
    sparse_blocks = sum(pools[p][0] for a in sparse for p in arenas[a])
    print(
        f"  {len(sparse)} arenas with <= {sparse_pools} used pools: {len(sparse)} MB kept by "
        f"{sparse_blocks} blocks",
        file=out,
    )
    by_class = collections.Counter((pools[p][2] + 1) * 16 for a in sparse for p in arenas[a])
    print(f"  their used pools by block size: {sorted(by_class.items())}", file=out)
    # Which objects sit in the sparse arenas' pools.
    in_sparse = {p for a in sparse for p in arenas[a]}
    kinds: collections.Counter[str] = collections.Counter()
    found: collections.Counter[int] = collections.Counter()
    where: collections.Counter[str] = collections.Counter()
    samples: list[Any] = []
    for o in objects:
        t = type(o)
        start = id(o) - (16 if t.__flags__ & _HAVE_GC else 0)
        pool = start & _POOL_MASK
        if pool in in_sparse:
            kinds[t.__qualname__] += 1
            found[pool] += 1
            if tracemalloc.is_tracing():
                tb = tracemalloc.get_object_traceback(o)
                if tb is not None:
                    where[
                        " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in list(tb)[-4:])
                    ] += 1
            if len(samples) < 40:
                samples.append(o)
    # Per block size, the types found in the sparse arenas' pools, and what refers to a few.
    by_size: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    examples: dict[tuple[int, str], list[Any]] = collections.defaultdict(list)
    for o in objects:
        t = type(o)
        start = id(o) - (16 if t.__flags__ & _HAVE_GC else 0)
        pool = start & _POOL_MASK
        if pool in in_sparse:
            size = (pools[pool][2] + 1) * 16
            by_size[size][t.__qualname__] += 1
            ex = examples[(size, t.__qualname__)]
            if len(ex) < 3:
                ex.append(o)
    for size in sorted(by_size):
        print(f"  in {size}-byte pools: {by_size[size].most_common(8)}", file=out)
        for name, _ in by_size[size].most_common(4):
            for o in examples[(size, name)][:2]:
                refs = [describe(r) for r in gc.get_referrers(o) if r is not objects][:3]
                print(f"      {name}: {_short(o)[:70]} <- {refs}", file=out)
    _abc_cache_owners(objects, out)
    unfound = sum(pools[p][0] for p in in_sparse) - sum(found.values())
    print(f"  objects found in them by type (blocks not objects: {unfound}):", file=out)
    for name, n in kinds.most_common(20):
        print(f"    {n:>7} {name}", file=out)
    for text, n in where.most_common(tracebacks):
        print(f"    {n:>7} allocated at {text}", file=out)
    for o in samples[:20]:
        print(f"    e.g. {type(o).__qualname__}: {_short(o)}", file=out)
    sys.stdout.flush()


def _short(o: Any) -> str:
    try:
        text = repr(o)
    except Exception:  # a diagnostic: any repr may fail
        text = "?"
    return text[:100]


def describe(o: Any) -> str:
    """An object in a referrer chain, short: a container with its length, a frame or coroutine
    with its file and function, anything else by its type (also the burst's referrer dump)."""
    name = type(o).__qualname__
    if isinstance(o, (list, dict, set, tuple, collections.deque)):
        return f"{name}(len={len(o)})"
    code = getattr(o, "f_code", None) or getattr(o, "cr_code", None)
    if code is not None:
        return f"{name}:{code.co_filename.rsplit('/', 2)[-1]}:{code.co_name}"
    return name[:60]


def _abc_cache_owners(objects: list[Any], out: Any) -> None:
    """The ``_destroy`` callbacks are abc's: one per entry of an ABC's registry or isinstance
    caches (``_abc._add_to_weak_set``). Which ABCs own a sample of the live ones (set <- _abc_data
    <- the class's __dict__ <- the class), and which types are cached."""
    owners: collections.Counter[str] = collections.Counter()
    cached: collections.Counter[str] = collections.Counter()
    n = 0
    for o in objects:
        if type(o).__name__ == "builtin_function_or_method" and getattr(o, "__name__", "") == "_destroy":
            n += 1
            if n % 25 != 1 or len(owners) > 60:
                continue
            wr = getattr(o, "__self__", None)
            target = wr() if callable(wr) else None
            owners[_abc_owner(target)] += 1
        elif type(o).__name__ == "ReferenceType" and getattr(o.__callback__, "__name__", "") == "_destroy":
            ref = o()
            cached[getattr(ref, "__qualname__", type(ref).__qualname__)] += 1
    print(f"  abc cache callbacks alive: {n}; owners of every 25th: {owners.most_common(15)}", file=out)
    print(f"  types in abc caches: {cached.most_common(12)}", file=out)


def _abc_owner(target: Any) -> str:
    if target is None:
        return "dead set"
    for data in gc.get_referrers(target):
        if type(data).__name__ == "_abc_data":
            for d in gc.get_referrers(data):
                if isinstance(d, dict):
                    for cls in gc.get_referrers(d):
                        if isinstance(cls, type):
                            return f"{cls.__module__}.{cls.__qualname__}"
            return "_abc_data of ?"
    return f"set(len={len(target)}) of ?"
