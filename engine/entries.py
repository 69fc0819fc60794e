"""The wheel's entry format: one compact ``bytes`` per waiting run.

A million runs wait in one engine's wheel before a midnight burst, so an entry is 43 bytes of
packed fields (about 80 bytes of RSS with the bytes header), not a Python object per run. The
first 8 bytes are the due instant in ms, big-endian, which is what the wheel sorts and slots by.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

_FMT = struct.Struct(">q16sqqBH")  # due_ms, job_id, lease_token, scheduled_for_us, shard, lane
ENTRY_SIZE = _FMT.size
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Entry(NamedTuple):
    due_ms: int
    job_id: uuid.UUID
    lease_token: int
    scheduled_for: datetime
    shard: int
    lane: int  # the owner's fairness lane (a 16-bit hash of the owner)


def owner_lane(owner: str) -> int:
    """Runs of one owner share a lane; lanes take turns at the fence and in the run queue, so
    one owner's million runs due at midnight cannot hold back another owner's run."""
    return zlib.crc32(owner.encode()) & 0xFFFF


def lane_of(entry: bytes) -> int:
    return int.from_bytes(entry[41:43], "big")


def to_us(value: datetime) -> int:
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def to_ms(value: datetime) -> int:
    return to_us(value) // 1000


def pack(  # noqa: PLR0917 - the entry's fields, in their packed order
    due_ms: int, job_id: uuid.UUID, lease_token: int, scheduled_for: datetime, shard: int, lane: int = 0
) -> bytes:
    return _FMT.pack(due_ms, job_id.bytes, lease_token, to_us(scheduled_for), shard, lane)


def unpack(entry: bytes) -> Entry:
    due_ms, jid, token, sched_us, shard, lane = _FMT.unpack(entry)
    return Entry(due_ms, uuid.UUID(bytes=jid), token, from_us(sched_us), shard, lane)
