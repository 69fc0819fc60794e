"""The run path's two wire formats, owned here and nowhere else: the wheel entry and the run-queue
message. No I/O (struct and msgpack); it sits in the run-queue layer rather than the core because
the core imports no serialization library, and the engine (whose wheel holds the entries) is
above this layer.

**Wheel entry.** A million runs wait in one engine's wheel before a midnight burst, so an entry is
43 bytes of packed fields (about 80 bytes of RSS with the bytes header), not a Python object per
run. The first 8 bytes are the due instant in ms since the epoch, big-endian signed, which is what
the timer wheel sorts and slots by (``DUE_PREFIX``); the last 2 are the owner's fairness lane, which
the fencer reads without unpacking the rest.

**Run-queue message** (DUETIME_RUN_QUEUE=nats). A fenced run as a msgpack array of format 1, with
the engine that published it. The spec travels as JSON text, exactly as the fence read it: it is
JSON (a payload may hold integers wider than msgpack's 64 bits), and a worker that receives the
row's own text can reuse its parse at the completion. A 13th field (the parent of an occurrence
row) is optional: messages of older engines lack it. So are the three after it, the run's context
as the fence read it (``FencedRun.job_created_at``, ``last_success_for``, ``folded_from``, each µs
since the epoch or nil): a message without them decodes with none, and a worker of the release
before reads the fields it knows and ignores these. The 17th, as optional, is the spec version as
the API counts it (``FencedRun.spec_revision``, migration 0018), which the target is told.

**Run bundle** (format 2): runs of one shard that one engine published together, in one message:
``[2, publisher, run, run, ...]``, each run the fields of format 1 after the publisher. In a burst a
message per run cost more than the run's own work on the way (nats-server storing, acknowledging,
delivering and taking the ack of each; the engine's publish and PubAck, the worker's receive and
ack): a bundle pays those once for up to ``BUNDLE_RUNS`` runs. A lone run is still sent as format 1.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgpack

from duetime.core.runpath import FencedRun, Published, RunSpec
from duetime.core.schedule import epoch_us, from_epoch_us

# ---------------------------------------------------------------------------------- wheel entries

ENTRY = struct.Struct(">q16sqqBH")  # due_ms, job_id, lease_token, scheduled_for_us, shard, lane
ENTRY_SIZE = ENTRY.size
DUE_PREFIX = struct.Struct(">q")
"""The 8-byte big-endian due instant every wheel entry starts with (the wheel reads only this)."""


@dataclass(frozen=True, slots=True)
class WheelEntry:
    """A wheel entry unpacked: a claim's lease and the occurrence it fires for (a ``FenceItem``).

    Its fields are the entry's own, as packed (the id's 16 bytes, the occurrence in µs): the
    fencer unpacks 500 entries per batch, and the PostgreSQL fence sends these forms as they are.
    ``job_id`` and ``scheduled_for`` build the ``UUID`` and the ``datetime`` for whoever asks."""

    due_ms: int
    job_id_bytes: bytes
    lease_token: int
    scheduled_for_us: int
    shard: int
    lane: int  # the owner's fairness lane (a 16-bit hash of the owner)

    @property
    def job_id(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.job_id_bytes)

    @property
    def scheduled_for(self) -> datetime:
        return from_us(self.scheduled_for_us)


def owner_lane(owner: str) -> int:
    """Runs of one owner share a lane; lanes take turns at the fence and in the run queue, so
    one owner's million runs due at midnight cannot hold back another owner's run."""
    return zlib.crc32(owner.encode()) & 0xFFFF


to_us = epoch_us
from_us = from_epoch_us


def to_ms(value: datetime) -> int:
    """The wheel's due millisecond for an instant: the first whole millisecond at or after it.

    Rounded up, never down: the wheel fires an entry once the wall clock's millisecond reaches
    its due one, so a due time of 12:00:00.839668 kept as 839 ms fired up to a millisecond
    before it was due (``test_engine_on_memory`` caught it: a run handed over 7 µs early). Up, a
    run starts at most a millisecond later than its exact instant, and never before it."""
    return -(-to_us(value) // 1000)


_pack = ENTRY.pack
_unpack = ENTRY.unpack
_due = DUE_PREFIX.unpack_from


def pack_entry(  # noqa: PLR0917 - the entry's fields, in their packed order
    due_ms: int, job_id: uuid.UUID, lease_token: int, scheduled_for: datetime, shard: int, lane: int = 0
) -> bytes:
    return _pack(due_ms, job_id.bytes, lease_token, to_us(scheduled_for), shard, lane)


def unpack_entry(entry: bytes) -> WheelEntry:
    return WheelEntry(*_unpack(entry))


def entry_due_ms(entry: bytes) -> int:
    """The due instant an entry carries in its first 8 bytes."""
    due: int = _due(entry)[0]
    return due


def entry_lane(entry: bytes) -> int:
    """The owner lane of an entry, or of every run of a bundle (read from its end, so both)."""
    return entry[-2] << 8 | entry[-1]


def entry_shard(entry: bytes) -> int:
    """The shard an entry's claim is on, without unpacking the rest (a shard handed away); of a
    bundle, the shard of all of its runs."""
    return entry[-3]


# ---------------------------------------------------------------------------------- bundles
# A claim batch's runs that are due at the same millisecond for the same owner (one shard: a
# batch is one shard's) go through the wheel and the fence's owner lanes as one ``bytes``: their
# shared due prefix, then each entry whole. Why: a burst's half a million runs per node would
# otherwise wait as half a million 76-byte objects, filling pymalloc's pools for the length of the
# drain; every object that outlives the drain and lands in one of their freed slots keeps its
# 1 MiB arena from going back, and after a million runs a node kept 2.2-2.5x its idle memory. A
# bundle of 500 runs is one 21.5 KB block of the C allocator, which the drain returns whole. The
# wheel reads only the due prefix, so it holds bundles as it holds entries; the engine splits
# them just before the fence. A lone run stays a plain entry (``ENTRY_SIZE`` bytes).

BUNDLE_MAX = 1024
"""Runs in one bundle at most (a claim batch is 500 by default)."""


def bundle(entries: list[bytes]) -> list[bytes]:
    """``entries`` (one claim batch, in claim order) as wheel items: the runs sharing a due
    millisecond and an owner lane as one bundle each, a lone run as itself. Each owner's runs of
    one instant keep their claim order, and the owners first appear in the same order, so the
    fencer's lanes see what they saw unbundled (across owners the lanes take turns anyway)."""
    if len(entries) < 2:
        return entries
    groups: dict[bytes, list[bytes]] = {}
    for entry in entries:
        key = entry[:8] + entry[-2:]
        group = groups.get(key)
        if group is None:
            groups[key] = [entry]
        else:
            group.append(entry)
    out: list[bytes] = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        for i in range(0, len(group), BUNDLE_MAX):
            part = group[i : i + BUNDLE_MAX]
            out.append(part[0] if len(part) == 1 else part[0][:8] + b"".join(part))
    return out


def runs_in(item: bytes) -> int:
    """How many runs a wheel item holds: 1 for an entry, k for a bundle of k."""
    return 1 if len(item) == ENTRY_SIZE else (len(item) - 8) // ENTRY_SIZE


def entries_in(item: bytes) -> list[bytes]:
    """The entries of a wheel item, in order."""
    if len(item) == ENTRY_SIZE:
        return [item]
    return _bundled(item, len(item))


def take_from(item: bytes, n: int) -> tuple[list[bytes], bytes | None]:
    """The first ``n`` entries of a wheel item, and what is left of it (None if nothing)."""
    k = runs_in(item)
    if n >= k:
        return entries_in(item), None
    cut = 8 + n * ENTRY_SIZE
    rest = item[cut:] if k - n == 1 else item[:8] + item[cut:]
    return _bundled(item, cut), rest


def _bundled(bundle: bytes, end: int) -> list[bytes]:
    """The entries of a bundle that end by byte ``end`` (past the shared due prefix)."""
    return [bundle[i : i + ENTRY_SIZE] for i in range(8, end, ENTRY_SIZE)]


# ---------------------------------------------------------------------------------- run messages

MESSAGE_FORMAT = 1
BUNDLE_FORMAT = 2
BUNDLE_RUNS = 64
"""Runs in one bundle at most. A worker asks for messages by free slots divided by this, so it
never holds more than its concurrency plus this many runs less one."""
BUNDLE_SPEC_CHARS = 128 * 1024
"""Spec text (characters) in one bundle at most, so a bundle stays well under NATS's default 1 MB
payload limit even for four-byte characters; a run whose spec alone is larger goes alone."""


def _us_or_none(value: datetime | None) -> int | None:
    return None if value is None else to_us(value)


def _fields(run: FencedRun) -> list[Any]:
    """A run's fields as a message carries them (format 1 after its publisher)."""
    return [
        run.job_id.bytes,
        run.shard,
        run.owner,
        run.lease_token,
        to_us(run.scheduled_for),
        to_us(run.due_at),
        run.attempt,
        run.spec.text,
        run.spec.version,
        run.run_kind,
        run.parent_id.bytes if run.parent_id else None,
        _us_or_none(run.job_created_at),
        _us_or_none(run.last_success_for),
        _us_or_none(run.folded_from),
        run.spec_revision,
    ]


def encode_message(run: FencedRun, publisher: str) -> bytes:
    """A fenced run and the engine that published it, as one run-queue message (format 1)."""
    f = _fields(run)
    packed: bytes = msgpack.packb([MESSAGE_FORMAT, *f[:10], publisher, *f[10:]], use_bin_type=True)
    return packed


def encode_runs(runs: Sequence[FencedRun], publisher: str) -> bytes:
    """One message for ``runs`` (one shard's, from ``bundles_of``): format 1 for a lone run, a
    bundle for more."""
    if len(runs) == 1:
        return encode_message(runs[0], publisher)
    packed: bytes = msgpack.packb([BUNDLE_FORMAT, publisher, *[_fields(r) for r in runs]], use_bin_type=True)
    return packed


def bundles_of(runs: Sequence[FencedRun]) -> list[list[FencedRun]]:
    """A publish batch as the messages it goes out in: the runs of each shard (one subject per
    shard) in their order, in bundles of at most ``BUNDLE_RUNS`` runs and ``BUNDLE_SPEC_CHARS`` of
    spec text. Shards appear in the order of their first run."""
    by_shard: dict[int, list[list[FencedRun]]] = {}
    room: dict[int, int] = {}
    for run in runs:
        chars = len(run.spec.text)
        parts = by_shard.get(run.shard)
        if parts is None or len(parts[-1]) >= BUNDLE_RUNS or room[run.shard] < chars:
            if parts is None:
                parts = by_shard[run.shard] = []
            parts.append([run])
            room[run.shard] = BUNDLE_SPEC_CHARS - chars
        else:
            parts[-1].append(run)
            room[run.shard] -= chars
    return [part for parts in by_shard.values() for part in parts]


@dataclass(frozen=True, slots=True)
class Decoded:
    """What one message holds: the runs a worker can read, and how many it could not (a bundle
    whose one run is unreadable still hands over the others)."""

    runs: list[Published]
    unreadable: int = 0


def _run_of(fields: list[Any]) -> FencedRun:
    (job_id, shard, owner, token, scheduled_us, due_us, attempt, spec, version, kind) = fields[:10]
    if not isinstance(spec, str):
        raise TypeError("the spec is not JSON text")
    run_spec = RunSpec(spec, int(version))
    run_spec.parsed  # noqa: B018 - parsed here so an unreadable spec drops the run, not the worker
    return FencedRun(
        job_id=uuid.UUID(bytes=job_id),
        shard=int(shard),
        owner=str(owner),
        lease_token=int(token),
        scheduled_for=from_us(scheduled_us),
        due_at=from_us(due_us),
        attempt=int(attempt),
        spec=run_spec,
        run_kind=str(kind),
        parent_id=uuid.UUID(bytes=fields[10]) if len(fields) > 10 and fields[10] else None,
        job_created_at=_time_or_none(fields, 11),
        last_success_for=_time_or_none(fields, 12),
        folded_from=_time_or_none(fields, 13),
        spec_revision=int(fields[14]) if len(fields) > 14 and fields[14] is not None else None,
    )


def _time_or_none(fields: list[Any], index: int) -> datetime | None:
    """An optional instant (µs since the epoch) of a run's fields: None when the message has no
    such field (an older engine's) or nil."""
    value = fields[index] if len(fields) > index else None
    return None if value is None else from_us(int(value))


_UNREADABLE = (ValueError, TypeError, KeyError, msgpack.UnpackException)


def _single(fields: Any) -> Published:
    if not isinstance(fields, list) or len(fields) < 12 or fields[0] != MESSAGE_FORMAT:
        raise ValueError(f"not a Duetime run message of format {MESSAGE_FORMAT} or {BUNDLE_FORMAT}")
    return Published(_run_of([*fields[1:11], *fields[12:]]), str(fields[11]))


def decode_runs(data: bytes) -> Decoded:
    """The runs of a message of either format (the inverse of ``encode_runs`` and
    ``encode_message``); ValueError for anything that is not such a message, or a lone run that
    cannot be read. A bundle's unreadable runs are counted, not returned: the others are taken."""
    try:
        fields = msgpack.unpackb(data, raw=False)
        if not isinstance(fields, list) or not fields or fields[0] != BUNDLE_FORMAT:
            return Decoded([_single(fields)])
    except _UNREADABLE as exc:
        raise ValueError(f"unreadable run message: {exc}") from exc
    if len(fields) < 3 or not isinstance(fields[1], str):
        raise ValueError("unreadable run message: a bundle without its publisher or runs")
    runs: list[Published] = []
    for one in fields[2:]:
        try:
            if not isinstance(one, list) or len(one) < 10:
                raise ValueError("not a run's fields")
            runs.append(Published(_run_of(one), fields[1]))
        except _UNREADABLE:
            pass
    return Decoded(runs, len(fields) - 2 - len(runs))
