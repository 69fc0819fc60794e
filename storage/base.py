"""The storage seam: verb-named methods, each naming its owner or shard.

The API talks to a ``Registry``; the engine and workers talk to a ``RunStore``. Only ``storage/``
imports asyncpg; database errors are translated to ``core.errors`` here, at the seam.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Literal, Protocol, TypeVar

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


BulkAction = Literal["pause", "resume", "cancel"]


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What one bulk call did: jobs it found that the action applies to (at most the bound), how
    many of them it changed, and whether more such jobs are left for the next call."""

    matched: int
    changed: int
    more: bool


class NameHolderChanged(Exception):
    """``apply_job``: the job holding the name is not the one the caller built its spec against
    (a concurrent PUT created or cancelled it). The caller reads the holder again and retries."""


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
        self,
        owner: str,
        *,
        state: JobState | None,
        limit: int,
        cursor: str | None,
        labels: Mapping[str, str] | None = None,
        name_prefix: str | None = None,
    ) -> Page[Job]:
        """Stable order (by id); following next_cursor to the end lists every job once. With
        ``labels``, only jobs carrying every pair; with ``name_prefix``, only names starting so.
        A cursor we did not issue raises ``InvalidRequest(code="invalid_cursor", field="cursor")``."""
        ...

    async def get_job_by_name(self, owner: str, name: str) -> Job:
        """The job (not cancelled) that holds this name; NotFound when none does."""
        ...

    async def apply_job(self, owner: str, spec: JobSpec, *, expected_id: str | None) -> tuple[Job, bool]:
        """PUT by name (``spec.name`` is set): create the job when no job holds the name (True),
        else make the holder match ``spec`` as a PATCH of every field would (False); a spec equal
        to the holder's writes nothing. ``expected_id`` is the holder the caller built ``spec``
        against (None: none); another one raises ``NameHolderChanged``."""
        ...

    async def bulk_action(
        self,
        owner: str,
        action: BulkAction,
        labels: Mapping[str, str],
        *,
        state: JobState | None,
        max_jobs: int,
    ) -> BulkResult:
        """Pause, resume or cancel up to ``max_jobs`` of the owner's jobs that carry every label
        (and are in ``state``, if given) and that the action would change, each under the same
        rules as the single-job call."""
        ...

    async def update_job(self, owner: str, job_id: uuid.UUID, spec: JobSpec) -> Job:
        """Replace the spec (the API merged the PATCH); recompute next_run_at on a schedule change.
        Conflict on a cancelled or completed job."""
        ...

    async def cancel_job(self, owner: str, job_id: uuid.UUID) -> Job: ...

    async def pause_job(self, owner: str, job_id: uuid.UUID) -> Job: ...

    async def resume_job(self, owner: str, job_id: uuid.UUID) -> Job: ...

    async def trigger_job(self, owner: str, job_id: uuid.UUID) -> Job:
        """Queue one extra run now, besides the schedule. Conflict unless the job is scheduled."""
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

    async def owner_for_key(self, api_key: str) -> str | None: ...

    async def create_api_key(self, owner: str) -> tuple[str, str]:
        """Returns (api_key, signing_secret); makes the owner and its secret when new."""
        ...

    async def revoke_api_key(self, api_key_or_prefix: str) -> int: ...

    async def signing_secret(self, owner: str) -> str | None: ...

    async def ping(self) -> None:
        """Raises StorageUnavailable when any database in the shard map cannot be reached."""
        ...
