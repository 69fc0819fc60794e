"""Occurrence rows (overlap=allow, backfill) in the store, on a real database: how they are made,
that they stay internal, that owner actions reach them, and that nothing hands an occurrence out
twice. Every case runs on one database and on two (shards 0-7 / 8-15)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from duetime.core.errors import Conflict, NotFound
from duetime.core.ids import shard_of
from duetime.core.model import JobState, Outcome, Overlap
from duetime.core.runpath import AttemptReport, Claim, FencedRun, RunSpec, Verdict
from duetime.runqueue import wire
from duetime.storage.postgres import PostgresStore
from duetime.storage.queries import Q
from tests.database.test_storage import ENGINE, claim_all, cron, fence, now, owner, report, store

__all__ = ["store"]  # the fixture, used by name below


async def _until(moment: datetime) -> None:
    await asyncio.sleep(max((moment - now()).total_seconds(), 0.0))


async def _occurrence_rows(store: PostgresStore, job_id: uuid.UUID) -> list[dict[str, Any]]:
    rows = await store.pool_for_shard(shard_of(job_id)).fetch(
        "SELECT * FROM jobs WHERE parent_id = $1 ORDER BY backfill_seq NULLS LAST, scheduled_for", job_id
    )
    return [dict(r) for r in rows]


async def _running(store: PostgresStore, o: str, expr: str = "* * * * * *", **kw: object) -> uuid.UUID:
    """A recurring job whose first run is fenced (in flight)."""
    job, _ = await store.create_job(o, cron(expr, **kw))
    jid = uuid.UUID(job.id)
    for _ in range(200):
        claimed = await claim_all(store, jid)
        if claimed:
            break
        await asyncio.sleep(0.02)
    assert claimed
    await _until(claimed[0].due_at)
    assert await fence(store, claimed)
    return jid


async def test_a_run_in_flight_hands_its_next_occurrence_to_a_row_of_its_own(store: PostgresStore) -> None:
    o = owner()
    jid = await _running(store, o)
    shard = shard_of(jid)
    running_for = await store.pool_for_shard(shard).fetchval(
        "SELECT scheduled_for FROM jobs WHERE job_id = $1", jid
    )
    assert await store.split_overlapping(shard, horizon_s=2.0) >= 1
    [child] = await _occurrence_rows(store, jid)
    assert child["state"] == "scheduled" and child["phase"] == "idle" and child["shard"] == shard
    assert child["owner"] == o and child["next_run_at"] is not None
    assert child["scheduled_for"] == running_for + timedelta(seconds=1)  # the very next occurrence
    # the occurrence row is claimed, fenced and called like any row, under the job's id
    rows = await store.claim_due(shard, ENGINE, lookahead_s=60, lease_s=30, limit=500)
    mine = [r for r in rows if r.job_id == child["job_id"]]
    assert len(mine) == 1 and mine[0].misfire_spec is None
    await _until(mine[0].due_at)
    [run] = await fence(store, mine)
    assert run.parent_id == jid and run.public_id == jid
    # a run message carries the parent through the NATS queue too
    [message] = wire.decode_runs(wire.encode_message(run, "engine-x")).runs
    decoded, by = message.run, message.publisher
    assert decoded.parent_id == jid and decoded.public_id == jid and by == "engine-x"
    await store.complete_runs([report(run, Outcome.SUCCEEDED)])
    assert await _occurrence_rows(store, jid) == []  # done: the row is gone
    history = await store.list_runs(o, jid, limit=10, cursor=None)
    assert [r.scheduled_for for r in history.items] == [child["scheduled_for"]]
    job = await store.get_job(o, jid)
    assert job.last_run is not None and job.last_run.scheduled_for == child["scheduled_for"]


async def test_two_engines_scanning_at_once_hand_an_occurrence_out_once(store: PostgresStore) -> None:
    o = owner()
    jids = [await _running(store, o) for _ in range(5)]
    shards = {shard_of(j) for j in jids}
    for shard in shards:
        await asyncio.gather(*(store.split_overlapping(shard, horizon_s=2.0) for _ in range(4)))
    for jid in jids:
        rows = await _occurrence_rows(store, jid)
        occurrences = [r["scheduled_for"] for r in rows]
        assert len(occurrences) == len(set(occurrences)) >= 1
    # and a second round hands out the next occurrence only once it is near
    for shard in shards:
        await store.split_overlapping(shard, horizon_s=0.0)
    for jid in jids:
        rows = await _occurrence_rows(store, jid)
        assert len({r["scheduled_for"] for r in rows}) == len(rows)


async def test_occurrence_rows_never_show_to_the_owner(store: PostgresStore) -> None:
    o = owner()
    jid = await _running(store, o)
    await store.split_overlapping(shard_of(jid), horizon_s=2.0)
    [child] = await _occurrence_rows(store, jid)
    page = await store.list_jobs(o, state=None, limit=100, cursor=None)
    assert [j.id for j in page.items] == [str(jid)]
    assert await store.count_active_jobs(o) == 1
    with pytest.raises(NotFound):
        await store.get_job(o, child["job_id"])
    with pytest.raises(NotFound):
        await store.pause_job(o, child["job_id"])


async def test_pause_resume_and_cancel_reach_the_occurrence_rows(store: PostgresStore) -> None:
    o = owner()
    job, _ = await store.create_job(o, cron("0 * * * *", overlap=Overlap.SKIP))
    jid = uuid.UUID(job.id)
    t = now().replace(minute=0, second=0, microsecond=0)
    result = await store.backfill_job(o, jid, t - timedelta(hours=3), t, max_occurrences=100, pace_per_s=10)
    assert result.queued == 3
    rows = await _occurrence_rows(store, jid)
    assert [r["next_run_at"] is None for r in rows] == [False, True, True]  # one at a time
    await store.pause_job(o, jid)
    assert {r["state"] for r in await _occurrence_rows(store, jid)} == {"paused"}
    assert [r for r in await claim_all_of(store, jid)] == []  # nothing of a paused job is claimable
    await store.resume_job(o, jid)
    assert {r["state"] for r in await _occurrence_rows(store, jid)} == {"scheduled"}
    claimed = await claim_all_of(store, jid)
    assert len(claimed) == 1  # the first backfilled run only
    await store.cancel_job(o, jid)
    # the claimed one gave its lease back and, with the waiting ones, is gone
    assert await _occurrence_rows(store, jid) == []
    assert await fence(store, claimed) == []


async def claim_all_of(store: PostgresStore, parent: uuid.UUID) -> list[Claim]:
    children = {r["job_id"] for r in await _occurrence_rows(store, parent)}
    rows = await store.claim_due(shard_of(parent), ENGINE, lookahead_s=60, lease_s=30, limit=500)
    return [r for r in rows if r.job_id in children]


async def test_a_backfilled_run_releases_the_next_and_the_janitor_covers_a_lost_release(
    store: PostgresStore,
) -> None:
    o = owner()
    job, _ = await store.create_job(o, cron("0 0 * * *", overlap=Overlap.BUFFER_ONE))
    jid = uuid.UUID(job.id)
    day = datetime(2025, 3, 1, tzinfo=UTC)
    await store.backfill_job(o, jid, day, day + timedelta(days=3), max_occurrences=100, pace_per_s=10)
    [first] = await claim_all_of(store, jid)
    [run] = await fence(store, [first])
    await store.complete_runs([report(run, Outcome.SUCCEEDED)])
    rows = await _occurrence_rows(store, jid)
    assert [r["scheduled_for"] for r in rows] == [day + timedelta(days=1), day + timedelta(days=2)]
    assert rows[0]["next_run_at"] is not None and rows[1]["next_run_at"] is None
    # simulate a crash between the completion's commit and the release: the next one never got
    # its start; the janitor's scan finds the job with runs waiting and none on its way
    pool = store.pool_for_shard(shard_of(jid))
    await pool.execute("UPDATE jobs SET next_run_at = NULL WHERE job_id = $1", rows[0]["job_id"])
    assert await store.release_stalled_backfills(shard_of(jid)) == 1
    assert await store.release_stalled_backfills(shard_of(jid)) == 0  # one at a time
    rows = await _occurrence_rows(store, jid)
    assert [r["next_run_at"] is not None for r in rows] == [True, False]


async def test_backfill_bounds_what_may_wait_per_job(store: PostgresStore) -> None:
    o = owner()
    job, _ = await store.create_job(o, cron("0 * * * *"))
    jid = uuid.UUID(job.id)
    t = now().replace(minute=0, second=0, microsecond=0)
    first = await store.backfill_job(o, jid, t - timedelta(hours=8), t, max_occurrences=10, pace_per_s=5)
    assert first.queued == 8
    try:
        await store.backfill_job(o, jid, t - timedelta(hours=5), t, max_occurrences=10, pace_per_s=5)
    except Conflict as exc:
        assert exc.code == "backfill_in_progress" and "at most 2" in exc.message
    else:
        raise AssertionError("a backfill past the per-job bound was accepted")
    rows = await _occurrence_rows(store, jid)
    dues = [r["next_run_at"] for r in rows]
    assert dues == sorted(dues) and dues[-1] - dues[0] >= timedelta(seconds=7 / 5 - 0.01)  # paced


async def test_overlap_queries_use_their_indexes(store: PostgresStore) -> None:
    pool = store.pool_for_shard(0)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + Q["overlap_due"], 0, 2.0, 500))
        assert "jobs_split" in plan and "Seq Scan on jobs" not in plan, plan
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + Q["release_stalled_backfills"], 0))
        assert "jobs_backfill_waiting" in plan, plan


async def test_a_finished_run_of_a_busy_job_goes_on_after_what_was_handed_out(store: PostgresStore) -> None:
    o = owner()
    jid = await _running(store, o)
    job_row = await store.pool_for_shard(shard_of(jid)).fetchrow(
        "SELECT scheduled_for FROM jobs WHERE job_id = $1", jid
    )
    running_for = job_row["scheduled_for"]
    await store.split_overlapping(shard_of(jid), horizon_s=2.0)
    handed = [r["scheduled_for"] for r in await _occurrence_rows(store, jid)]
    assert handed
    # the parent's own run ends: its next occurrence is after the handed-out ones, not one of them
    pool = store.pool_for_shard(shard_of(jid))
    token = await pool.fetchval("SELECT lease_token FROM jobs WHERE job_id = $1", jid)
    t = now()
    await store.complete_runs(
        [
            AttemptReport(
                FencedRun(
                    job_id=jid,
                    shard=shard_of(jid),
                    owner=o,
                    lease_token=token,
                    scheduled_for=running_for,
                    due_at=running_for,
                    attempt=1,
                    spec=RunSpec("", 1),  # no fence's text: the completion reads the row's
                    run_kind="scheduled",
                ),
                Verdict(Outcome.SUCCEEDED, False),
                started_at=t,
                finished_at=t,
            )
        ]
    )
    after = await pool.fetchrow("SELECT scheduled_for, handed_upto, state FROM jobs WHERE job_id = $1", jid)
    assert after["state"] == JobState.SCHEDULED.value and after["handed_upto"] is None
    assert after["scheduled_for"] > max(handed)


async def test_a_schedule_patch_withdraws_split_occurrences_not_yet_started(store: PostgresStore) -> None:
    """Regression (the races fault test): an occurrence of the old schedule, already handed to a
    row of its own, fired after the PATCH that replaced the schedule had answered."""
    o = owner()
    jid = await _running(store, o)
    await store.split_overlapping(shard_of(jid), horizon_s=2.0)
    [child] = await _occurrence_rows(store, jid)
    claimed = await claim_all_of(store, jid)  # waiting in a wheel
    assert [c.job_id for c in claimed] == [child["job_id"]]
    t = now().replace(microsecond=0) - timedelta(minutes=5)
    await store.backfill_job(o, jid, t - timedelta(seconds=2), t, max_occurrences=10, pace_per_s=1)
    await store.update_job(o, jid, cron("0 0 1 1 *"))
    rows = await _occurrence_rows(store, jid)
    assert child["job_id"] not in {r["job_id"] for r in rows}
    assert len(rows) == 2 and all(r["backfill_seq"] is not None for r in rows)  # backfills stay
    await _until(claimed[0].due_at)
    assert await fence(store, claimed) == []  # the wheel's entry finds nothing to call


async def test_a_job_whose_schedule_ended_is_not_completed_while_a_run_of_it_waits(
    store: PostgresStore,
) -> None:
    """Regression (the races fault test): the job's last occurrence had been handed to a row of
    its own, the job's own run then ended and the job showed 'completed', so a pause answered 409
    'too late' and the last occurrence still ran afterwards."""
    from duetime.core.model import CronSchedule, JobSpec, WebhookTarget

    o = owner()
    base = now().replace(microsecond=0) + timedelta(seconds=2)
    spec = JobSpec(
        target=WebhookTarget(url="https://example.com/hook"),
        schedule=CronSchedule(cron="* * * * * *", start_at=base, end_at=base + timedelta(seconds=1)),
    )
    job, _ = await store.create_job(o, spec)
    jid = uuid.UUID(job.id)
    claimed = await claim_all(store, jid)
    await _until(claimed[0].due_at)
    [run] = await fence(store, claimed)
    await store.split_overlapping(shard_of(jid), horizon_s=2.0)
    assert [r["scheduled_for"] for r in await _occurrence_rows(store, jid)] == [base + timedelta(seconds=1)]
    await store.complete_runs([report(run, Outcome.SUCCEEDED)])
    held = await store.get_job(o, jid)
    assert held.state is JobState.SCHEDULED and held.next_run_at is None  # not completed yet
    paused = await store.pause_job(o, jid)  # so the owner can still stop the last run
    assert paused.state is JobState.PAUSED
    assert {r["state"] for r in await _occurrence_rows(store, jid)} == {"paused"}
    await store.resume_job(o, jid)
    [last] = await claim_all_of(store, jid)
    await _until(last.due_at)
    [last_run] = await fence(store, [last])
    await store.complete_runs([report(last_run, Outcome.SUCCEEDED)])
    done = await store.get_job(o, jid)
    assert done.state is JobState.COMPLETED  # the last occurrence row is gone: now it is
    assert [r.scheduled_for for r in (await store.list_runs(o, jid, limit=10, cursor=None)).items] == [
        base + timedelta(seconds=1),
        base,
    ]


async def test_the_janitor_completes_a_drained_job_whose_completion_was_lost(store: PostgresStore) -> None:
    from duetime.core.model import CronSchedule, JobSpec, WebhookTarget

    o = owner()
    past = now().replace(microsecond=0) - timedelta(hours=1)
    spec = JobSpec(
        target=WebhookTarget(url="https://example.com/hook"),
        schedule=CronSchedule(cron="0 0 1 1 *"),
    )
    job, _ = await store.create_job(o, spec)
    jid = uuid.UUID(job.id)
    pool = store.pool_for_shard(shard_of(jid))
    # as if its schedule had ended while an occurrence row still waited, and that row then
    # finished without the statement after it (a crash)
    await pool.execute("UPDATE jobs SET next_run_at = NULL, scheduled_for = $2 WHERE job_id = $1", jid, past)
    assert (await store.get_job(o, jid)).state is JobState.SCHEDULED
    assert await store.complete_drained_jobs(shard_of(jid)) >= 1
    assert (await store.get_job(o, jid)).state is JobState.COMPLETED
