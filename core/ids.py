"""Job ids and the logical shard they belong to.

Ids are UUIDv7: time-ordered, so the primary key index stays append-mostly and listing by id is a
stable order. The shard is a hash of the id, never chosen by an owner, so load spreads evenly.
"""

from __future__ import annotations

import os
import time
import uuid
import zlib

SHARDS = 16


def shard_of(job_id: uuid.UUID) -> int:
    """``hash(job_id) mod 16``: CRC32 of the 16 id bytes, stable across processes and versions."""
    return zlib.crc32(job_id.bytes) % SHARDS


def new_job_id(shard: int | None = None) -> uuid.UUID:
    """A fresh UUIDv7; with ``shard``, one whose hash lands on that shard.

    Choosing the shard lets an Idempotency-Key record live in the same database (and the same
    transaction) as the job it names: about 16 draws of random bits on average, microseconds.
    """
    while True:
        ms = time.time_ns() // 1_000_000
        rand = int.from_bytes(os.urandom(10), "big")
        value = (ms & ((1 << 48) - 1)) << 80
        value |= 0x7 << 76  # version 7
        value |= ((rand >> 62) & 0xFFF) << 64  # 12 bits rand_a
        value |= 0b10 << 62  # RFC 4122 variant
        value |= rand & ((1 << 62) - 1)  # 62 bits rand_b
        job_id = uuid.UUID(int=value)
        if shard is None or shard_of(job_id) == shard:
            return job_id


def parse_job_id(text: str) -> uuid.UUID | None:
    """The id from a URL path, or None when it is not one of ours (the API answers 404, not 400)."""
    if len(text) != 36:
        return None
    try:
        return uuid.UUID(text)
    except ValueError:
        return None
