"""Jobs selected by label: the filtered list and the bulk pause, resume and cancel.

A bulk action is the single-job action applied to many rows at once, under the same rules: the
rows are locked (in job id order, as completions lock them), each row's new plan is computed by
the same functions the single calls use, and one statement writes a batch. A claimed row gives
its lease back in that statement, so its fence finds it no longer scheduled and no run of a
paused or cancelled job starts after the answer; a run already fenced may finish, as with the
single calls. Batches are small and each is its own transaction, so a bulk call of 10,000 jobs
never holds thousands of row locks against the run path at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Final

import asyncpg

from duetime.core import codec
from duetime.core.changes import UNNAMED, ChangeAction, ChangeBy
from duetime.core.errors import Conflict
from duetime.core.lifecycle import RowPlan, owner_step, split_point
from duetime.core.model import PLAIN_PAUSE, Job, JobState, PauseRequest, Phase
from duetime.core.states import OwnerAction
from duetime.storage.ports import BulkAction, BulkResult, Page
from duetime.storage.postgres.changes import record_changes
from duetime.storage.postgres.pauses import add_pause_ends
from duetime.storage.postgres.pools import translated, utcnow
from duetime.storage.postgres.registry import RegistryPart
from duetime.storage.postgres.rows import job_from_row, plan_of
from duetime.storage.queries import Q
from duetime.storage.registry_rules import BULK_APPLIES, BULK_TARGET, bulk_states, encode_cursor, job_cursor

# Rows locked and written per transaction by a bulk action.
BULK_BATCH: Final = 500


# A selector of several pairs counts each pair's rows up to this many, to drive by the rarest.
_DRIVER_PROBE: Final = 10_000


async def _driver(pool: asyncpg.Pool, owner: str, labels: Mapping[str, str]) -> tuple[str, str]:
    """The pair whose job_labels range drives the scan; the others are checked on the row. With
    one pair, that one; with several, the one fewest of the owner's jobs carry on this database
    (counted up to ``_DRIVER_PROBE``, ties by key), so "team=x AND env=prod" reads team=x's few
    rows rather than env=prod's many (driven by env, that page took 102 ms at 1,000,000 jobs)."""
    pairs = sorted(labels.items())
    if len(pairs) == 1:
        return pairs[0]
    counts = [await pool.fetchval(Q["label_pair_count"], owner, k, v, _DRIVER_PROBE) for k, v in pairs]
    return min(zip(counts, pairs, strict=True))[1]


class SelectionPart(RegistryPart):
    """Label filters for the list, and bulk actions."""

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
        if not labels and name_prefix is None:
            return await super().list_jobs(owner, state=state, limit=limit, cursor=cursor)
        after = job_cursor(cursor)
        state_value = None if state is None else state.value
        rows: list[asyncpg.Record] = []
        async with translated():
            for pool in self.pools():
                if labels:
                    key, value = await _driver(pool, owner, labels)
                    rows.extend(
                        await pool.fetch(
                            Q["list_jobs_by_labels"],
                            owner,
                            key,
                            value,
                            after,
                            dict(labels),
                            state_value,
                            name_prefix,
                            limit + 1,
                        )
                    )
                else:
                    rows.extend(
                        await pool.fetch(
                            Q["list_jobs_by_name_prefix"], owner, name_prefix, after, state_value, limit + 1
                        )
                    )
        rows.sort(key=lambda r: r["job_id"])
        page = rows[:limit]
        next_cursor = encode_cursor(page[-1]["job_id"].bytes) if len(rows) > limit else None
        return Page([job_from_row(r) for r in page], next_cursor)

    async def bulk_action(
        self,
        owner: str,
        action: BulkAction,
        labels: Mapping[str, str],
        *,
        state: JobState | None,
        max_jobs: int,
        by: ChangeBy = UNNAMED,
        pause: PauseRequest = PLAIN_PAUSE,
    ) -> BulkResult:
        states = bulk_states(action, state)
        if not states:
            return BulkResult(matched=0, changed=0, more=False)
        wanted = sorted(s.value for s in states)
        selector = dict(labels)
        matched = changed = 0
        more = False
        remaining = max_jobs
        async with translated():
            for pool in self.pools():
                driver = await _driver(pool, owner, labels)
                if remaining == 0:
                    rest = await pool.fetch(Q["bulk_candidates"], owner, *driver, selector, wanted, 1)
                    if rest:
                        more = True
                        break
                    continue
                ids = [
                    r["job_id"]
                    for r in await pool.fetch(
                        Q["bulk_candidates"], owner, *driver, selector, wanted, remaining + 1
                    )
                ]
                if len(ids) > remaining:
                    more = True
                    ids = ids[:remaining]
                matched += len(ids)
                remaining -= len(ids)
                for start in range(0, len(ids), BULK_BATCH):
                    changed += await self._bulk_batch(
                        pool, owner, action, ids[start : start + BULK_BATCH], by=by, pause=pause
                    )
        return BulkResult(matched=matched, changed=changed, more=more)

    async def _bulk_batch(
        self,
        pool: asyncpg.Pool,
        owner: str,
        action: BulkAction,
        ids: list[uuid.UUID],
        *,
        by: ChangeBy,
        pause: PauseRequest,
    ) -> int:
        """One transaction: lock the rows, keep those the action still applies to (a row may have
        changed since it was selected), write their new state in one statement and their change
        records in another."""
        target = BULK_TARGET[action]
        applies = BULK_APPLIES[action]
        what = OwnerAction(action)
        now = utcnow()
        wake: list[tuple[int, RowPlan]] = []
        async with pool.acquire() as conn, conn.transaction():
            # The whole families in id order first (twice: see the statement), so this batch never
            # holds a row while waiting for an earlier one, as the engine's fence never does.
            await conn.execute(Q["lock_families_of_owner"], ids, owner)
            await conn.execute(Q["lock_families_of_owner"], ids, owner)
            rows = await conn.fetch(Q["lock_jobs_of_owner"], ids, owner)
            # Each row's step by the same owner table and lifecycle the single call uses; a row
            # that changed since it was selected (now a no-op or refused) is left as it is.
            todo, splits, revokes = [], [], set()
            for r in rows:
                if JobState(r["state"]) not in applies:
                    continue
                try:
                    step = owner_step(what, plan_of(r), now=now, idle=r["phase"] == Phase.IDLE)
                except Conflict:
                    continue
                if step is None or step.plan.state is not target:
                    continue
                todo.append(r)
                revokes.add(step.revoke)
                # Only a scheduled job has a split point (overlap=allow); pause and cancel clear it.
                splits.append(
                    split_point(codec.spec_from_json(r["spec"]), step.plan) if action == "resume" else None
                )
                wake.append((r["shard"], step.plan))
            if not todo:
                return 0
            todo_ids = [r["job_id"] for r in todo]
            revoke = revokes == {True}
            # Occurrence rows first, as the single calls do: their leases are given back too.
            await conn.execute(Q["bulk_cascade_state"], todo_ids, target.value)
            if action == "cancel":
                await conn.execute(Q["bulk_drop_idle_occurrences"], todo_ids)
            await conn.execute(
                Q["bulk_write_state"],
                todo_ids,
                target.value,
                splits,
                revoke,
                owner,
                pause.note,
                pause.until,
                by.key_id,
            )
            await record_changes(conn, todo_ids, ChangeAction(action), by)
            if action == "pause":
                await add_pause_ends(conn, pause.until, todo_ids, [r["shard"] for r in todo])
        if action == "resume":
            for shard, plan in wake:
                self._hints.due_soon(shard, plan, now)
        return len(todo)
