"""Deterministic per-occurrence jitter.

The same (job, occurrence) always gets the same delay, so an engine that rebuilds its wheel after a
restart, or a second engine that takes over, fires at the same instant the first would have.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta


def jitter_ms(job_id: uuid.UUID, scheduled_for: datetime, jitter_s: int) -> int:
    """Uniform in [0, jitter_s * 1000] ms, from a hash of the job id and the occurrence."""
    if jitter_s <= 0:
        return 0
    micros = int(scheduled_for.timestamp() * 1_000_000)
    digest = hashlib.blake2b(job_id.bytes + micros.to_bytes(8, "big", signed=True), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (jitter_s * 1000 + 1)


def due_at(job_id: uuid.UUID, scheduled_for: datetime, jitter_s: int) -> datetime:
    """When the first attempt of an occurrence is due: the nominal time plus its jitter."""
    return scheduled_for + timedelta(milliseconds=jitter_ms(job_id, scheduled_for, jitter_s))
