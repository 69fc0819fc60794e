"""The storage seam: verb-named methods, each naming its owner or shard.

The API talks to a ``Registry``; the engine and workers talk to a ``RunStore``. Only ``storage/``
imports asyncpg; database errors are translated to ``core.errors`` here, at the seam.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from duetime.core.model import Job, JobSpec, JobState, Run


@dataclass(frozen=True, slots=True)
class IdempotencyRequest:
    key: str
    body_hash: bytes


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Backfill:
    """What a backfill queued: how many occurrences, the oldest and the newest."""

    queued: int
    first: datetime | None
    last: datetime | None


class Registry(Protocol):
    """What the API needs. Every call is scoped by owner: another owner's job is NotFound."""

    async def create_job(
        self, owner: str, spec: JobSpec, *, idempotency: IdempotencyRequest | None = None
    ) -> tuple[Job, bool]:
        """Returns (job, created). Same key + same body: the original job and False.
        Same key + different body: ``InvalidRequest(code="idempotency_key_reused")``."""
        ...

    async def get_job(self, owner: str, job_id: uuid.UUID) -> Job: ...

    async def list_jobs(
        self, owner: str, *, state: JobState | None, limit: int, cursor: str | None
    ) -> Page[Job]:
        """Stable order (by id); following next_cursor to the end lists every job once.
        A cursor we did not issue raises ``InvalidRequest(code="invalid_cursor", field="cursor")``."""
        ...

    async def update_job(self, owner: str, job_id: uuid.UUID, spec: JobSpec) -> Job:
        """Replace the spec (the API merged the PATCH); recompute next_run_at on a schedule change.
        Conflict on a cancelled or completed job."""
        ...

    async def cancel_job(self, owner: str, job_id: uuid.UUID) -> Job: ...

    async def pause_job(self, owner: str, job_id: uuid.UUID) -> Job: ...

    async def resume_job(self, owner: str, job_id: uuid.UUID) -> Job: ...

    async def trigger_job(self, owner: str, job_id: uuid.UUID, *, max_pending: int = 0) -> Job:
        """Queue one extra run now, besides the schedule. Conflict unless the job is scheduled, and
        (``too_many_triggers``) when ``max_pending`` (> 0) triggers already wait."""
        ...

    async def replay_job(self, owner: str, job_id: uuid.UUID) -> Job: ...

    async def backfill_job(
        self,
        owner: str,
        job_id: uuid.UUID,
        start: datetime,
        end: datetime,
        *,
        max_occurrences: int,
        pace_per_s: float,
    ) -> Backfill:
        """Queue a run of every occurrence of a recurring job in [start, end) (see core.backfill)."""
        ...

    async def list_runs(
        self, owner: str, job_id: uuid.UUID, *, limit: int, cursor: str | None
    ) -> Page[Run]: ...

    async def count_active_jobs(self, owner: str) -> int:
        """Scheduled and paused jobs of this owner (for the per-owner cap)."""
        ...

    async def active_job_bytes(self, owner: str) -> int:
        """Bytes the specs of this owner's scheduled and paused jobs take as stored (for the cap)."""
        ...

    async def owner_for_key(self, api_key: str) -> str | None: ...

    async def create_api_key(self, owner: str) -> tuple[str, str]:
        """Returns (api_key, signing_secret); makes the owner and its secret when new."""
        ...

    async def revoke_api_key(self, api_key_or_prefix: str) -> int: ...

    async def signing_secret(self, owner: str) -> str | None: ...

    async def ping(self) -> None:
        """Raises StorageUnavailable when any database in the shard map cannot be reached."""
        ...
