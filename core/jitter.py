"""When an occurrence's first attempt is due: its nominal time plus the job's spread and jitter.

Two deterministic offsets, both hashes, never random draws, so an engine that rebuilds its wheel
after a restart, or a second engine that takes over, fires at the same instant the first would
have, and every place that asks (the row's ``next_run_at``, the preview, lateness, the retry
window, misfire) gets the same answer from this one function:

- ``spread_s``: one fixed offset per job in ``[0, spread_s)``, from the job's id alone. The same
  offset for every occurrence, so an hourly job runs at the same minute and second every hour,
  and many jobs on the same round time are spread evenly over the window.
- ``jitter_s``: a fresh delay per occurrence in ``[0, jitter_s]``, from the id and the occurrence.

``Duetime-Scheduled-For`` and the history's ``scheduled_for`` stay the nominal time.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta

from duetime.core.model import JobSpec

_SPREAD_PERSON = b"duetime-spread"  # keeps the spread's hash apart from the jitter's


def jitter_ms(job_id: uuid.UUID, scheduled_for: datetime, jitter_s: int) -> int:
    """Uniform in [0, jitter_s * 1000] ms, from a hash of the job id and the occurrence."""
    if jitter_s <= 0:
        return 0
    micros = int(scheduled_for.timestamp() * 1_000_000)
    digest = hashlib.blake2b(job_id.bytes + micros.to_bytes(8, "big", signed=True), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (jitter_s * 1000 + 1)


def spread_ms(job_id: uuid.UUID, spread_s: int) -> int:
    """The job's fixed offset in [0, spread_s * 1000) ms.

    The id's BLAKE2b (personalised, so it is independent of the jitter and of the shard) read as a
    fraction of 2**64 and scaled to the window: a job keeps its place in the window when the
    window is resized (doubling ``spread_s`` doubles its offset), and ids, being random, land
    uniformly. Published in docs/scheduling.md; changing it moves every spread job, so don't.
    """
    if spread_s <= 0:
        return 0
    digest = hashlib.blake2b(job_id.bytes, digest_size=8, person=_SPREAD_PERSON).digest()
    return (int.from_bytes(digest, "big") * spread_s * 1000) >> 64


def spread(job_id: uuid.UUID, spec: JobSpec) -> timedelta:
    """``spread_ms`` of a job as a duration."""
    return timedelta(milliseconds=spread_ms(job_id, spec.spread_s))


def due_at(job_id: uuid.UUID, scheduled_for: datetime, spec: JobSpec) -> datetime:
    """When the first attempt of an occurrence is due: the nominal time plus the job's spread and
    that occurrence's jitter. ``job_id`` is the job's own id (an occurrence row's parent)."""
    offset = spread_ms(job_id, spec.spread_s) + jitter_ms(job_id, scheduled_for, spec.jitter_s)
    return scheduled_for + timedelta(milliseconds=offset)
