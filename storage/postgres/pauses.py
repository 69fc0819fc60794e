"""Pauses that end by themselves (issue 30, item 3; migration 0020): ``RunStore.end_pauses``, and
the wake-ups a pause with an ``until`` leaves for it.

A job paused with an ``until`` is resumed once that time has come by whichever engine serves its
shard (engine/service.py calls this before each claim, every second or so): as an owner's resume
resumes it (core.lifecycle's owner step; occurrence rows follow; missed occurrences are left
overdue for the claim's misfire policy), under the same locks in the same order as a bulk resume,
with an ``auto_resume`` change record by Duetime in the same transaction. The wake-up
(``pause_ends``) only says when to look; the job's row, read again under lock, says whether its
pause really ended, so engines that look at once, a restart or another engine taking the shard
over resume it once, and an owner's resume or new pause that landed first wins. Each wake-up is
deleted in the transaction that dealt with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import asyncpg

from duetime.core import codec
from duetime.core.changes import AUTO_RESUME_REASON, UNNAMED, ActorType, ChangeAction
from duetime.core.lifecycle import RowPlan, owner_step, split_point
from duetime.core.model import JobState, Phase
from duetime.core.states import OwnerAction
from duetime.storage.postgres.changes import record_changes
from duetime.storage.postgres.pools import StoreBase, translated, utcnow
from duetime.storage.postgres.rows import plan_of
from duetime.storage.queries import Q


async def add_pause_ends(
    conn: asyncpg.Connection, until: datetime | None, job_ids: Sequence[uuid.UUID], shards: Sequence[int]
) -> None:
    """The wake-ups of jobs just paused until ``until`` (none without one), in ``conn``'s
    transaction: one statement for a batch."""
    if until is not None and job_ids:
        await conn.execute(Q["insert_pause_ends"], until, list(job_ids), list(shards))


class PausesPart(StoreBase):
    """``end_pauses`` of ``PostgresStore``."""

    async def end_pauses(self, shard: int, *, limit: int) -> int:
        async with translated(), self.pool_for_shard(shard).acquire() as conn:
            due = await conn.fetch(Q["pauses_ended"], shard, limit)
            if not due:
                return 0
            ids = sorted({r["job_id"] for r in due})
            now = utcnow()
            wake: list[tuple[int, RowPlan]] = []
            resumed: list[asyncpg.Record] = []
            async with conn.transaction():
                await conn.execute(Q["lock_families"], ids)
                await conn.execute(Q["lock_families"], ids)
                todo: list[uuid.UUID] = []
                splits: list[datetime | None] = []
                reasons: list[str] = []
                for r in await conn.fetch(Q["lock_ended_pauses"], ids):
                    if not r["ended"]:
                        continue
                    step = owner_step(OwnerAction.RESUME, plan_of(r), now=now, idle=r["phase"] == Phase.IDLE)
                    if step is None or step.plan.state is not JobState.SCHEDULED:
                        continue
                    todo.append(r["job_id"])
                    splits.append(split_point(codec.spec_from_json(r["spec"]), step.plan))
                    reasons.append(AUTO_RESUME_REASON.format(until=codec.format_time(r["paused_until"])))
                    wake.append((r["shard"], step.plan))
                if todo:
                    await conn.execute(Q["bulk_cascade_state"], todo, JobState.SCHEDULED.value)
                    resumed = await conn.fetch(Q["end_pauses"], todo, splits)
                    why = dict(zip(todo, reasons, strict=True))
                    ids_resumed = [r["job_id"] for r in resumed]
                    await record_changes(
                        conn,
                        ids_resumed,
                        ChangeAction.AUTO_RESUME,
                        UNNAMED,
                        actor=ActorType.DUETIME,
                        reasons=[why[i] for i in ids_resumed],
                    )
                # Every wake-up looked at goes: its job resumed now, or its pause is not this one
                # any more (resumed, paused anew with another end, cancelled, deleted).
                await conn.execute(
                    Q["delete_pause_ends"], shard, [r["job_id"] for r in due], [r["until"] for r in due]
                )
        for row_shard, plan in wake:
            self._hints.due_soon(row_shard, plan, now)
        return len(resumed)
