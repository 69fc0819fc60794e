"""Change history on PostgreSQL (migration 0018): records written in the transaction of the change
they describe, one statement per call whatever the number of jobs, and one job's records read
newest first.

What a record says is the core's (core/changes.py); which calls write one, and with what, is the
registry's (storage/postgres/registry.py, selection.py, names.py) and the completion writer's
(``auto_pause``: storage/sql/completion.sql, pause_failing_jobs).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg

from duetime.core.changes import ActorType, Change, ChangeAction, ChangeBy
from duetime.core.errors import NotFound
from duetime.core.ids import shard_of
from duetime.storage.ports import Page
from duetime.storage.postgres.pools import StoreBase, translated
from duetime.storage.queries import Q
from duetime.storage.registry_rules import change_cursor, encode_change_cursor

_NO_DIFF: Mapping[str, Any] = {}


async def record_changes(
    conn: asyncpg.Connection,
    job_ids: Sequence[uuid.UUID],
    action: ChangeAction,
    by: ChangeBy,
    diff: Mapping[str, Any] = _NO_DIFF,
    *,
    actor: ActorType = ActorType.OWNER,
    reasons: Sequence[str | None] | None = None,
) -> None:
    """One record per job of ``job_ids`` (their rows locked in ``conn``'s transaction, and written
    already: the records carry the spec_revision the transaction wrote), alike but for their
    reasons: ``by.reason`` for each, or ``reasons`` (Duetime's own changes give one per job)."""
    ids = list(job_ids)
    why = list(reasons) if reasons is not None else [by.reason] * len(ids)
    await conn.execute(Q["record_changes"], ids, actor.value, by.key_id, action.value, why, dict(diff))


def change_from_row(row: asyncpg.Record) -> Change:
    return Change(
        seq=row["seq"],
        at=row["at"],
        actor=ActorType(row["actor"]),
        key_id=row["key_id"],
        action=ChangeAction(row["action"]),
        reason=row["reason"],
        spec_version=row["spec_version"],
        diff=row["diff"],
    )


class ChangesPart(StoreBase):
    """``Registry.list_changes`` of ``PostgresStore``."""

    async def list_changes(
        self, owner: str, job_id: uuid.UUID, *, limit: int, cursor: str | None
    ) -> Page[Change]:
        before = change_cursor(cursor)
        pool = self.pool_for_shard(shard_of(job_id))
        async with translated():
            if await pool.fetchval(Q["job_exists"], job_id, owner) is None:
                raise NotFound(f"no job {job_id}", ident=str(job_id))
            rows = await pool.fetch(Q["list_changes"], job_id, before, limit + 1)
        page = rows[:limit]
        next_cursor = encode_change_cursor(page[-1]["seq"]) if len(rows) > limit else None
        return Page([change_from_row(r) for r in page], next_cursor)
