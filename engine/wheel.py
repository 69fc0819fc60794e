"""The engine's in-memory timer: a hierarchical timer wheel and the one task that drives it.

Why a wheel and not a heap or ``loop.call_at`` per run: an engine holds up to a million claimed runs
at once and a midnight cron burst can make all of them due in the same millisecond. A heap pays
O(log n) per insert and a Python object per entry; one ``call_at`` per run costs a ``TimerHandle``
(~200 bytes) plus a heap entry each. The wheel stores each run as the compact ``bytes`` the engine
already built, appends it to a list in O(1), and fires a whole millisecond's slot with one list swap.

Entry format (fixed, owned by ``runqueue.wire``; the wheel reads only its prefix): the first 8 bytes are
the due instant in ms since the Unix epoch as a big-endian signed int64 (``runqueue.wire.DUE_PREFIX``),
followed by an opaque payload. Sorting entries therefore sorts them by due time, and the wheel never
needs a side table to know when an entry is due. The engine hands it a burst's runs as bundles
(many entries behind one due prefix, ``runqueue.wire.bundle``); to the wheel a bundle is one entry.

Layout (``tick`` = ``tick_ms``, 1 ms by default; an entry due at ``d`` belongs to tick
``q = ceil(d / tick)`` so that rounding can only make it late, never early):

========  =======  ==========================  ==================================
level     slots    one slot spans              the level spans (tick = 1 ms)
========  =======  ==========================  ==================================
0         1024     1 tick                      1.024 s
1         64       2**10 ticks (1.024 s)       65.5 s
2         64       2**16 ticks (65.5 s)        69.9 min
3         64       2**22 ticks (69.9 min)      74.6 h
overflow  dict     2**28 ticks (74.6 h) block  unbounded; a heap of block numbers
========  =======  ==========================  ==================================

Levels are *aligned* to absolute time rather than relative to the insert time: an entry sits at the
highest level whose slot number differs between its tick and the wheel's next tick ``n`` (found
with one XOR). Three properties follow and the code leans on all of them:

* every entry at level k is due before every entry at level k+1, so the earliest deadline is at the
  lowest non-empty level (``next_due_ms`` is a few bit operations);
* the slot holding ``n`` at levels >= 1 is always empty: it is emptied ("cascaded") into the lower
  levels at the moment ``n`` enters it, so nothing ever waits in a slot that is already current;
* entries due at the same tick end up in one level-0 slot in insertion order (an earlier insert
  sits at a higher-or-equal level, and a cascade appends into slots that cannot yet hold entries
  of that block), so a burst fires in the order it was claimed without sorting.

Each level keeps an occupancy bitmap (a Python int), so advancing over a long empty stretch -- a
clock that jumps three hours -- jumps straight to the next occupied slot instead of walking ticks.
Every loop iteration of ``expire`` either fires a non-empty level-0 slot or cascades a non-empty
higher slot, and an entry cascades at most four times, so an advance costs O(entries moved + levels).

Bursts: re-placing a cascaded slot of a million entries costs 0.1-0.3 s of Python, and so does
retiring a million fired entries from the live set. ``expire(now, limit=k)`` therefore does at most
k entries' worth of either and keeps the rest queued in order (cascade queue, then the fired-but-
not-returned queue); the driver calls it with its batch size and yields in between, so the event
loop is never held for more than a few milliseconds (measured: 20 ms worst gap across a 1M burst).

Membership: a set of the live entries makes ``discard`` O(1), makes ``insert`` idempotent (an engine
that rebuilds its wheel and then re-claims may offer the same entry twice; it fires once), and keeps
``len`` exact. Cancellation is lazy: the discarded copy stays in its slot and a tombstone count is
consumed when the slot fires; tombstones are compacted away once they outnumber the live entries,
so cancelled runs cannot pile up.
"""

from __future__ import annotations

import asyncio
import heapq
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from operator import itemgetter

from duetime.engine.clock import Clock
from duetime.runqueue import wire

__all__ = ["ENTRY_HEADER", "TimerWheel", "WheelDriver", "entry_due_ms", "make_entry"]

log = logging.getLogger("duetime.engine.wheel")

ENTRY_HEADER = wire.DUE_PREFIX
"""The 8-byte big-endian due instant every entry starts with (``runqueue.wire`` owns the format)."""

_unpack_due = ENTRY_HEADER.unpack_from
_due_key = itemgetter(slice(0, 8))  # stable sort key: the due prefix only, payload ignored

_L0_BITS = 10
_L0_SIZE = 1 << _L0_BITS
_L0_MASK = _L0_SIZE - 1
_LN_BITS = 6
_LN_SIZE = 1 << _LN_BITS
_LN_MASK = _LN_SIZE - 1
# The tick-number shift giving the slot number at level 1, 2, 3, and the overflow block number.
_SHIFT1 = _L0_BITS  # 10
_SHIFT2 = _SHIFT1 + _LN_BITS  # 16
_SHIFT3 = _SHIFT2 + _LN_BITS  # 22
_SHIFT_OVF = _SHIFT3 + _LN_BITS  # 28
_HIGHER_SHIFTS = (_SHIFT1, _SHIFT2, _SHIFT3)

_COMPACT_MIN_TOMBSTONES = 4096
_SHRINK_MIN = 8192  # a live set that never held more keeps its table (at most 256 KiB)
_UNLIMITED = 1 << 62


def make_entry(due_ms: int, payload: bytes = b"") -> bytes:
    """Build an entry in the wheel's format (the engine may equally pack its own)."""
    return ENTRY_HEADER.pack(due_ms) + payload


entry_due_ms = wire.entry_due_ms


def _lowest_bit(x: int) -> int:
    """Index of the lowest set bit of a positive int."""
    return (x & -x).bit_length() - 1


class TimerWheel:
    """A hierarchical timer wheel of ``bytes`` entries; see the module docstring for the layout.

    Not thread-safe: one event loop owns it. All times are wall-clock ms since the epoch.
    """

    __slots__ = (
        "_bm0",
        "_bms",
        "_firing",
        "_firing_pos",
        "_live",
        "_live_peak",
        "_n",
        "_ovf",
        "_ovf_keys",
        "_pending",
        "_pending_pos",
        "_ready",
        "_slots0",
        "_slotsn",
        "_tick",
        "_tomb_total",
        "_tombs",
    )

    def __init__(self, now_ms: int, tick_ms: int = 1) -> None:
        if tick_ms < 1:
            raise ValueError(f"tick_ms must be >= 1, got {tick_ms}")
        self._tick = int(tick_ms)
        # Next tick to process: every entry with tick < _n has been handed out (or is in _ready).
        self._n = now_ms // self._tick + 1
        self._slots0: list[list[bytes]] = [[] for _ in range(_L0_SIZE)]
        self._bm0 = 0
        # Levels 1..3 at index 0..2.
        self._slotsn: list[list[list[bytes]]] = [[[] for _ in range(_LN_SIZE)] for _ in range(3)]
        self._bms: list[int] = [0, 0, 0]
        self._ovf: dict[int, list[bytes]] = {}
        self._ovf_keys: list[int] = []  # heap of the block numbers present in _ovf
        self._ready: list[bytes] = []
        # Due entries picked for firing but not yet returned, because expire() was given a limit;
        # they are still live (len() counts them, discard() can cancel them).
        self._firing: list[bytes] = []
        self._firing_pos = 0
        # Slots emptied by a cascade whose entries are not all re-placed yet (FIFO, top level first).
        # Re-placing a million-entry slot takes ~0.1-0.3 s, so a limited expire() does it in slices;
        # until the queue is empty the wheel does not move, and new inserts not yet due join its
        # tail so that equal instants keep their insertion order.
        self._pending: list[list[bytes]] = []
        self._pending_pos = 0
        self._live: set[bytes] = set()
        # The most entries _live held since it was last made: a set's table never shrinks as its
        # entries go (Python shrinks it only on some bulk removals, and keeps 4 MB for an empty set
        # after a 500,000-entry burst), so it is replaced by a fresh copy once it holds an eighth of
        # that (see _shrink_live).
        self._live_peak = 0
        self._tombs: dict[bytes, int] = {}
        self._tomb_total = 0

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, entry: object) -> bool:
        return entry in self._live

    @property
    def tick_ms(self) -> int:
        return self._tick

    @property
    def time_ms(self) -> int:
        """The wheel's own time: everything due at or before it has been returned by ``expire``.

        It only moves forward, so a wall clock that steps back cannot make entries fire twice.
        """
        return (self._n - 1) * self._tick

    def next_due_ms(self) -> int | None:
        """Earliest instant at which ``expire`` could return something, or None when empty.

        Exact while the earliest entry is within the current level-0 span; otherwise the start of
        the earliest occupied higher slot, which is when that slot must be cascaded anyway. May
        point at a slot holding only cancelled entries; expiring it then simply returns nothing.
        """
        tick = self._tick
        if self._firing:
            first: int = -(-_unpack_due(self._firing[self._firing_pos])[0] // tick)
            return first * tick
        if self._ready:
            earliest: int = min(-(-_unpack_due(e)[0] // tick) for e in self._ready)
            return earliest * tick
        n = self._n
        if self._pending:
            return n * tick  # a cascade is under way: come back at once to finish it
        c0 = n & _L0_MASK
        x = self._bm0 >> c0
        if x:
            return (n + _lowest_bit(x)) * tick
        ev = self._next_higher_event(n)
        return None if ev is None else ev * tick

    # ------------------------------------------------------------------ writing

    def insert(self, entry: bytes) -> None:
        """Schedule ``entry`` at the instant in its first 8 bytes; O(1).

        An entry already due (at or before ``time_ms``) fires on the next ``expire``. Inserting an
        entry that is already waiting does nothing: it fires once.
        """
        live = self._live
        if entry in live:
            return
        if len(entry) < 8:
            raise ValueError(f"an entry needs an 8-byte due prefix, got {len(entry)} bytes")
        live.add(entry)
        self._live_peak = max(self._live_peak, len(live))
        q = -(-_unpack_due(entry)[0] // self._tick)
        if self._pending and q >= self._n:
            self._pending[-1].append(entry)
        else:
            self._place(entry, q)

    def insert_many(self, entries: Iterable[bytes]) -> None:
        """Insert a claim batch; the level-0/1 cases are inlined because they are the common path."""
        live = self._live
        tick = self._tick
        slots0 = self._slots0
        slots1 = self._slotsn[0]
        place = self._place
        pending = self._pending
        for entry in entries:
            if entry in live:
                continue
            if len(entry) < 8:
                raise ValueError(f"an entry needs an 8-byte due prefix, got {len(entry)} bytes")
            live.add(entry)
            q = -(-_unpack_due(entry)[0] // tick)
            n = self._n
            x = q ^ n
            if pending and q >= n:
                pending[-1].append(entry)
            elif q >= n and x < _L0_SIZE:
                i = q & _L0_MASK
                slot = slots0[i]
                if not slot:
                    self._bm0 |= 1 << i
                slot.append(entry)
            elif q >= n and x < (1 << _SHIFT2):
                i = (q >> _SHIFT1) & _LN_MASK
                slot = slots1[i]
                if not slot:
                    self._bms[0] |= 1 << i
                slot.append(entry)
            else:
                place(entry, q)
        self._live_peak = max(self._live_peak, len(live))

    def discard(self, entry: bytes) -> bool:
        """Cancel a waiting entry; False if it is not waiting (never inserted, fired or drained)."""
        live = self._live
        if entry not in live:
            return False
        live.remove(entry)
        tombs = self._tombs
        tombs[entry] = tombs.get(entry, 0) + 1
        self._tomb_total += 1
        if self._tomb_total > _COMPACT_MIN_TOMBSTONES and self._tomb_total > len(live):
            self._compact()
        self._shrink_live()
        return True

    def expire(self, now_ms: int, limit: int | None = None) -> list[bytes]:
        """Advance to ``now_ms`` and return the entries due at or before it, in due order.

        Entries due at the same instant come out in insertion order. A ``now_ms`` behind the wheel's
        time (the wall clock stepped back) advances nothing; only entries inserted meanwhile that are
        due by ``now_ms`` come out, so nothing fires early and nothing is lost.

        With ``limit``, at most that many entries are handled (returned, skipped as cancelled, or
        moved down a level) and the rest stays queued, in order, for the next call; a call may then
        return fewer entries, even none, while ``next_due_ms()`` already says "now". The driver
        uses it so that a million-entry burst is cascaded and fired in slices with the event loop
        free in between; calls in a row return exactly what one unlimited call would have.
        """
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        now_tick = now_ms // self._tick
        room = _UNLIMITED if limit is None else limit
        out: list[bytes] = []
        if self._firing:
            room = self._take(out, room, now_tick)
            if self._firing:
                if room and now_tick < self._n - 1 and self._ready:
                    # The wall clock stepped back while a slot was being handed out: the staged
                    # rest is not due yet, but an entry inserted since may be. Due entries go
                    # first (they are earlier than the rest), or they would wait for the clock
                    # to catch up with the wheel.
                    due = self._ready_due(now_tick)
                    if due:
                        self._firing = due + self._firing[self._firing_pos :]
                        self._firing_pos = 0
                        self._take(out, room, now_tick)
                return out
        if self._ready:
            self._stage(self._ready_due(now_tick))
            room = self._take(out, room, now_tick)
            if self._firing:
                return out
        if self._n <= now_tick or self._pending:
            self._advance(now_tick, out, room)
        return out

    def drain(self) -> list[bytes]:
        """Remove and return every waiting entry, in due order (on shutdown, to release leases)."""
        physical: list[bytes] = []
        for lst in self._containers_in_insert_order():
            physical.extend(lst)
        if self._tombs:
            physical = self._without_tombstones(physical)
        physical.sort(key=_due_key)
        self._firing = []
        self._firing_pos = 0
        self._pending = []
        self._pending_pos = 0
        self._slots0 = [[] for _ in range(_L0_SIZE)]
        self._bm0 = 0
        self._slotsn = [[[] for _ in range(_LN_SIZE)] for _ in range(3)]
        self._bms = [0, 0, 0]
        self._ovf = {}
        self._ovf_keys = []
        self._ready = []
        self._live = set()
        self._live_peak = 0
        self._tombs = {}
        self._tomb_total = 0
        return physical

    # ------------------------------------------------------------------ internals

    def _place(self, entry: bytes, q: int) -> None:
        """Put an entry (already counted live) where the aligned layout says it belongs."""
        n = self._n
        if q < n:
            self._ready.append(entry)
            return
        x = q ^ n
        if x < _L0_SIZE:
            i = q & _L0_MASK
            slot = self._slots0[i]
            if not slot:
                self._bm0 |= 1 << i
            slot.append(entry)
        elif x < (1 << _SHIFT_OVF):
            level = 0 if x < (1 << _SHIFT2) else 1 if x < (1 << _SHIFT3) else 2
            i = (q >> _HIGHER_SHIFTS[level]) & _LN_MASK
            slot = self._slotsn[level][i]
            if not slot:
                self._bms[level] |= 1 << i
            slot.append(entry)
        else:
            block = q >> _SHIFT_OVF
            lst = self._ovf.get(block)
            if lst is None:
                self._ovf[block] = [entry]
                heapq.heappush(self._ovf_keys, block)
            else:
                lst.append(entry)

    def _next_higher_event(self, n: int) -> int | None:
        """First tick of the earliest occupied slot above level 0 (levels are time-ordered)."""
        bms = self._bms
        for level in range(3):
            bm = bms[level]
            if bm:
                shift = _HIGHER_SHIFTS[level]
                cur = (n >> shift) & _LN_MASK
                x = bm >> (cur + 1)
                if x:
                    j = cur + 1 + _lowest_bit(x)
                    parent = shift + _LN_BITS
                    return ((n >> parent) << parent) + (j << shift)
        if self._ovf_keys:
            return self._ovf_keys[0] << _SHIFT_OVF
        return None

    def _advance(self, now_tick: int, out: list[bytes], room: int) -> None:
        slots0 = self._slots0
        while room > 0:
            if self._pending:
                room = self._run_pending(room)
                if self._pending:
                    return
            n = self._n
            if n > now_tick:
                return
            c0 = n & _L0_MASK
            x = self._bm0 >> c0
            if x:
                s = c0 + _lowest_bit(x)
                q = n - c0 + s
                if q > now_tick:
                    # Next entry is later in this same level-0 span: no slot boundary is crossed.
                    self._n = now_tick + 1
                    return
                fired = slots0[s]
                slots0[s] = []
                self._bm0 &= ~(1 << s)
                if self._tick > 1 and len(fired) > 1:
                    fired.sort(key=_due_key)  # one slot spans several ms of due instants
                self._stage(fired)
                new_n = q + 1
            else:
                ev = self._next_higher_event(n)
                # Nothing occupied before ev, so jumping over the gap needs no per-tick work.
                new_n = now_tick + 1 if ev is None or ev > now_tick else ev
            self._n = new_n
            if (n ^ new_n) >> _SHIFT1:
                self._cascade(n, new_n)
            if self._firing:
                room = self._take(out, room, now_tick)

    def _cascade(self, old: int, n: int) -> None:
        """``n`` entered new slots at some levels: queue those slots for re-placing, top level first.

        Top level first matters: an entry waiting higher up was inserted before any entry with the
        same instant waiting lower down, and re-placing appends.
        """
        pending = self._pending
        if (old >> _SHIFT_OVF) != (n >> _SHIFT_OVF):
            moved = self._ovf.pop(n >> _SHIFT_OVF, None)
            if moved is not None:
                heapq.heappop(self._ovf_keys)  # the current block is necessarily the smallest
                pending.append(moved)
        for level in (2, 1, 0):
            shift = _HIGHER_SHIFTS[level]
            if (old >> shift) == (n >> shift):
                continue
            i = (n >> shift) & _LN_MASK
            if not (self._bms[level] >> i) & 1:
                continue
            slots = self._slotsn[level]
            pending.append(slots[i])
            slots[i] = []
            self._bms[level] &= ~(1 << i)

    def _run_pending(self, budget: int) -> int:
        """Re-place up to ``budget`` queued entries; returns the budget left."""
        pending = self._pending
        while pending and budget > 0:
            head = pending[0]
            pos = self._pending_pos
            end = min(len(head), pos + budget)
            self._replace(head if pos == 0 and end == len(head) else head[pos:end])
            budget -= end - pos
            if end == len(head):
                pending.pop(0)
                self._pending_pos = 0
            else:
                self._pending_pos = end
        return budget

    def _replace(self, moved: list[bytes]) -> None:
        """Re-place cascaded entries; the move into level 0 (every burst passes it) is inlined."""
        slots0 = self._slots0
        tick = self._tick
        place = self._place
        n = self._n
        bm = self._bm0
        for entry in moved:
            q = _unpack_due(entry)[0] if tick == 1 else -(-_unpack_due(entry)[0] // tick)
            if q >= n and q ^ n < _L0_SIZE:
                i = q & _L0_MASK
                slot = slots0[i]
                if not slot:
                    bm |= 1 << i
                slot.append(entry)
            else:
                self._bm0 = bm
                place(entry, q)
                bm = self._bm0
        self._bm0 = bm

    def _ready_due(self, now_tick: int) -> list[bytes]:
        """Take the ready entries due by ``now_tick`` out of the ready list, sorted by due (stable)."""
        tick = self._tick
        ready = self._ready
        if now_tick >= self._n - 1:
            take = ready
            self._ready = []
        else:
            # The wall clock is behind the wheel: only what is due by now_tick may go.
            take = []
            keep = []
            for entry in ready:
                if -(-_unpack_due(entry)[0] // tick) <= now_tick:
                    take.append(entry)
                else:
                    keep.append(entry)
            self._ready = keep
        if len(take) > 1:
            take.sort(key=_due_key)
        return take

    def _stage(self, entries: list[bytes]) -> None:
        if not entries:
            return
        if self._firing:
            self._firing = self._firing[self._firing_pos :] + entries
        else:
            self._firing = entries
        self._firing_pos = 0

    def _take(self, out: list[bytes], room: int, now_tick: int) -> int:
        """Hand out up to ``room`` staged entries; returns the room left."""
        firing = self._firing
        pos = self._firing_pos
        end = len(firing)
        if now_tick < self._n - 1:
            # Wall clock behind the wheel: staged entries are sorted, stop at the first not yet due.
            tick = self._tick
            stop = pos
            while stop < end and -(-_unpack_due(firing[stop])[0] // tick) <= now_tick:
                stop += 1
            end = stop
        k = min(end, pos + room)
        if k == pos:
            return room
        chunk = firing if pos == 0 and k == len(firing) else firing[pos:k]
        if self._tombs:
            chunk = self._without_tombstones(chunk)
        else:
            self._live.difference_update(chunk)
        out.extend(chunk)
        if k == len(firing):
            self._firing = []
            self._firing_pos = 0
        else:
            self._firing_pos = k
        self._shrink_live()
        return room - (k - pos)

    def _shrink_live(self) -> None:
        """Replace the live set by a fresh copy once it holds at most an eighth of its peak.

        A set keeps the table its largest size needed: after a million-run burst the wheel's
        empty set kept 4 MB per node of a table that had grown to 16 MB (32 B per entry), live
        for as long as the process. The copies cost at most an eighth of the entries retired
        since the last one."""
        live = self._live
        if self._live_peak >= _SHRINK_MIN and len(live) * 8 <= self._live_peak:
            self._live = set(live)
            self._live_peak = len(live)

    def _without_tombstones(self, entries: list[bytes]) -> list[bytes]:
        """Drop the cancelled copies and retire the rest from the live set.

        A tombstone cancels the *earliest* remaining copy, so an entry discarded and inserted again
        fires in the position of its latest insert.
        """
        tombs = self._tombs
        live = self._live
        kept: list[bytes] = []
        for entry in entries:
            count = tombs.get(entry)
            if count is not None:
                if count == 1:
                    del tombs[entry]
                else:
                    tombs[entry] = count - 1
                self._tomb_total -= 1
            else:
                live.discard(entry)
                kept.append(entry)
        return kept

    def _containers_in_insert_order(self) -> list[list[bytes]]:
        """Every list holding entries, ordered so that copies of one entry appear oldest first.

        Copies of one entry share a due tick; an older copy sits at a higher-or-equal level or
        earlier in the cascade queue (whose entries were re-placed or inserted after anything now in
        level 0), and the ready list only ever receives the newest.
        """
        containers: list[list[bytes]] = [self._ovf[k] for k in sorted(self._ovf)]
        for level in (2, 1, 0):
            containers.extend(s for s in self._slotsn[level] if s)
        containers.extend(s for s in self._slots0 if s)
        if self._pending_pos:
            self._pending[0] = self._pending[0][self._pending_pos :]
            self._pending_pos = 0
        containers.extend(self._pending)
        if self._firing_pos:
            self._firing = self._firing[self._firing_pos :]
            self._firing_pos = 0
        containers.append(self._firing)
        containers.append(self._ready)
        return containers

    def _compact(self) -> None:
        """Physically remove cancelled copies once they outnumber live entries (bounded memory)."""
        tombs = self._tombs
        for lst in self._containers_in_insert_order():
            if not tombs:
                break
            kept: list[bytes] = []
            for entry in lst:
                count = tombs.get(entry)
                if count is None:
                    kept.append(entry)
                elif count == 1:
                    del tombs[entry]
                else:
                    tombs[entry] = count - 1
            lst[:] = kept
        self._tomb_total = 0
        self._tombs = {}
        self._bm0 = sum(1 << i for i, s in enumerate(self._slots0) if s)
        self._bms = [sum(1 << i for i, s in enumerate(slots) if s) for slots in self._slotsn]
        self._ovf = {k: v for k, v in self._ovf.items() if v}
        self._ovf_keys = sorted(self._ovf)


OnFire = Callable[[list[bytes]], Awaitable[None] | None]
OnCrash = Callable[[BaseException], None]


class WheelDriver:
    """The single task that fires a ``TimerWheel`` on time.

    It waits for the first of: the next deadline, a ``wake()``, or ``stop()`` -- never a blind sleep
    and never one loop timer per entry. Loop timers have ~1 ms granularity; with uvloop they alone
    give fire lateness p50/p99 of about 0.6/1.6 ms (``loadtest/wheel_bench.py``). ``early_wake_ms``
    > 0 arms the timer that much before the deadline and then yields (``sleep(0)``) until the wall
    clock gets there: lateness drops to ~0.01 ms, but when runs are due every millisecond the driver
    never leaves that window and burns a core that workers on the same loop need, so it is off by
    default.

    The wait is capped at ``max_sleep_s`` because deadlines are wall instants while loop timers run
    on the monotonic clock: the cap bounds how long a wall-clock step can go unnoticed.

    Fired entries go to ``on_fire`` in batches of at most ``batch_size``, each taken from the wheel
    with ``expire(now, limit=batch_size)`` and with a yield between batches, so a million-entry burst
    never holds the loop for more than one batch's work. Whatever has not been handed over when the
    driver stops is still in the wheel, and a batch whose ``on_fire`` raised is put back; either way
    ``drain()`` returns them so their leases can be released.

    A crash is never silent: it is logged, then passed to ``on_crash`` if given, otherwise re-raised
    by ``stop()``.
    """

    def __init__(
        self,
        wheel: TimerWheel,
        clock: Clock,
        on_fire: OnFire,
        *,
        on_crash: OnCrash | None = None,
        batch_size: int = 5000,
        early_wake_ms: float = 0.0,
        max_sleep_s: float = 1.0,
        name: str = "duetime-wheel-driver",
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self._wheel = wheel
        self._clock = clock
        self._on_fire = on_fire
        self._on_crash = on_crash
        self._batch_size = batch_size
        self._early_ms = max(0.0, early_wake_ms)
        self._max_sleep_s = max_sleep_s
        self._name = name
        self._task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sleeping_until: int | None = None
        self._woken = False
        self._stopping = False
        self._crash: BaseException | None = None

    @property
    def wheel(self) -> TimerWheel:
        return self._wheel

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def crash(self) -> BaseException | None:
        """The exception the task died of, if it did."""
        return self._crash

    def start(self) -> asyncio.Task[None]:
        if self._task is not None:
            raise RuntimeError("WheelDriver.start() called twice")
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)
        self._task.add_done_callback(self._on_done)
        return self._task

    def wake(self) -> None:
        """Re-evaluate the deadline now (after an insert that may be earlier than the current wait)."""
        self._woken = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def insert(self, entry: bytes) -> None:
        """Insert into the wheel and wake the driver only if the entry beats the current wait."""
        self._wheel.insert(entry)
        self._wake_if_earlier(entry_due_ms(entry))

    def insert_many(self, entries: Iterable[bytes]) -> None:
        """Insert a claim batch; one wake-up at most, only if something in it beats the current wait."""
        batch = entries if isinstance(entries, list) else list(entries)
        if not batch:
            return
        self._wheel.insert_many(batch)
        self._wake_if_earlier(min(_unpack_due(e)[0] for e in batch))

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop firing; waits up to ``grace_s`` for the batch being handed over, then cancels.

        Re-raises the task's crash unless an ``on_crash`` callback already received it.
        """
        self._stopping = True
        self.wake()
        task = self._task
        if task is None:
            return
        if task is asyncio.current_task():
            return  # called from on_fire: the loop sees _stopping after this batch
        if not task.done():
            done, _ = await asyncio.wait({task}, timeout=grace_s)
            if not done:
                task.cancel()
                await asyncio.wait({task})
        if self._crash is not None and self._on_crash is None:
            raise self._crash

    # ------------------------------------------------------------------ internals

    def _wake_if_earlier(self, due_ms: int) -> None:
        until = self._sleeping_until
        if self._waiter is not None and (until is None or due_ms < until):
            self.wake()

    def _on_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        self._crash = exc
        log.error("timer wheel driver %r crashed; entries stop firing", self._name, exc_info=exc)
        if self._on_crash is not None:
            self._on_crash(exc)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        wheel = self._wheel
        clock = self._clock
        early = self._early_ms
        while not self._stopping:
            now = clock.now_ms()
            fired = wheel.expire(now, self._batch_size)
            if fired:
                await self._deliver(fired)
                if len(fired) >= self._batch_size:
                    await asyncio.sleep(0)  # more may be queued in the wheel: let the loop breathe
                continue
            due = wheel.next_due_ms()
            delay_s = self._max_sleep_s if due is None else min(self._max_sleep_s, (due - now - early) / 1000)
            if delay_s > 0:
                await self._wait(loop, delay_s, due)
            else:
                # Due within the early window (or the timer fired a hair before the wall clock
                # reached the due ms): yield to the loop and look again.
                await asyncio.sleep(0)

    async def _wait(self, loop: asyncio.AbstractEventLoop, delay_s: float, due: int | None) -> None:
        if self._woken:
            self._woken = False
            return
        waiter: asyncio.Future[None] = loop.create_future()
        handle = loop.call_later(delay_s, _release, waiter)
        self._waiter = waiter
        self._sleeping_until = due
        try:
            await waiter
        finally:
            handle.cancel()
            self._waiter = None
            self._sleeping_until = None
            self._woken = False

    async def _deliver(self, fired: list[bytes]) -> None:
        delivered = False
        try:
            result = self._on_fire(fired)
            if inspect.isawaitable(result):
                await result
            delivered = True
        finally:
            if not delivered:
                # Not confirmed handed over: back into the wheel (as due entries) for drain().
                self._wheel.insert_many(fired)


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
