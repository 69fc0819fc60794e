"""Pausing with a note, until a time (issue 30, item 3), for every store: the Job's ``paused``
object while paused; ``end_pauses`` resuming a job once its ``until`` has come, once however many
engines look, as an owner's resume does, with an ``auto_resume`` record by Duetime; a resume or
a pause that landed first wins."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import datetime, timedelta

from duetime.core.changes import ActorType, ChangeAction, ChangeBy
from duetime.core.ids import shard_of
from duetime.core.model import JobState, Misfire, Outcome, Overlap, PauseRequest
from tests.contract.conftest import Store, cron, engine_id, new_owner, now, one_off
from tests.contract.test_runstore_contract import claim, fence, report

ALICE = ChangeBy(key_id="dt_alice12", reason="maintenance window")


async def _paused_job(store: Store, owner: str, until: datetime | None, **kw: object) -> uuid.UUID:
    job, _ = await store.create_job(owner, cron("0 0 1 1 *", **kw))
    jid = uuid.UUID(job.id)
    await store.pause_job(owner, jid, by=ALICE, pause=PauseRequest(note="db upgrade", until=until))
    return jid


async def _past(instant: datetime) -> None:
    """Wait until ``instant`` is a little in the past (the stores' clock is this machine's)."""
    await asyncio.sleep(max(0.0, (instant - now()).total_seconds()) + 0.05)


async def _end_pauses_until(store: Store, jid: uuid.UUID, within_s: float = 10.0) -> int:
    """Call end_pauses on the job's shard until it resumes a job (bounded); how many calls it took."""
    deadline = asyncio.get_running_loop().time() + within_s
    calls = 0
    while True:
        calls += 1
        if await store.end_pauses(shard_of(jid), limit=500) >= 1:
            return calls
        assert asyncio.get_running_loop().time() < deadline, "the pause did not end"
        await asyncio.sleep(0.05)


async def test_a_paused_job_shows_its_pause_and_only_while_paused(store: Store) -> None:
    o = new_owner()
    before = now()
    until = (now() + timedelta(hours=2)).replace(microsecond=0)
    jid = await _paused_job(store, o, until)
    job = await store.get_job(o, jid)
    assert job.state is JobState.PAUSED and job.paused is not None
    assert (job.paused.note, job.paused.until, job.paused.actor, job.paused.key_id) == (
        "db upgrade",
        until,
        ActorType.OWNER,
        "dt_alice12",
    )
    assert job.paused.at is not None and before - timedelta(seconds=1) <= job.paused.at <= now()
    # A PATCH keeps the pause as it was; a second pause is a no-op and changes nothing of it.
    patched = await store.update_job(o, jid, replace(job.spec, payload={"x": 1}))
    assert patched.paused == job.paused
    again = await store.pause_job(o, jid, pause=PauseRequest(note="other", until=None))
    assert again.paused == job.paused
    [listed] = (await store.list_jobs(o, state=JobState.PAUSED, limit=10, cursor=None)).items
    assert listed.paused == job.paused
    # A resume ends it, and a plain pause says nothing more.
    assert (await store.resume_job(o, jid)).paused is None
    plain = await store.pause_job(o, jid)
    assert plain.paused is not None and (plain.paused.note, plain.paused.until, plain.paused.key_id) == (
        None,
        None,
        None,
    )
    assert (await store.cancel_job(o, jid)).paused is None


async def test_the_pause_ends_at_until_once_with_an_auto_resume_record(store: Store) -> None:
    o = new_owner()
    until = now() + timedelta(seconds=1)
    jid = await _paused_job(store, o, until)
    assert await store.end_pauses(shard_of(jid), limit=500) == 0 or now() >= until  # not before
    await _end_pauses_until(store, jid)
    assert now() >= until
    job = await store.get_job(o, jid)
    assert job.state is JobState.SCHEDULED and job.paused is None
    newest, pause, _create = (await store.list_changes(o, jid, limit=10, cursor=None)).items
    assert (newest.seq, newest.action, newest.actor, newest.key_id) == (
        3,
        ChangeAction.AUTO_RESUME,
        ActorType.DUETIME,
        None,
    )
    assert newest.reason is not None and newest.reason.startswith("the pause until ")
    assert (pause.action, pause.reason) == (ChangeAction.PAUSE, "maintenance window")
    # Nothing is left to end: later looks find nothing, and nothing is recorded twice.
    assert await store.end_pauses(shard_of(jid), limit=500) == 0
    assert len((await store.list_changes(o, jid, limit=10, cursor=None)).items) == 3


async def test_engines_looking_at_once_resume_a_job_once(store: Store) -> None:
    o = new_owner()
    until = now() + timedelta(seconds=0.5)
    jids = [await _paused_job(store, o, until) for _ in range(4)]
    await _past(until)
    shards = sorted({shard_of(j) for j in jids})
    resumed = await asyncio.gather(*(store.end_pauses(s, limit=500) for s in shards for _ in range(3)))
    assert sum(resumed) == 4
    for jid in jids:
        records = (await store.list_changes(o, jid, limit=10, cursor=None)).items
        assert [c.action for c in records].count(ChangeAction.AUTO_RESUME) == 1
        assert (await store.get_job(o, jid)).state is JobState.SCHEDULED


async def test_a_resume_or_a_new_pause_first_wins(store: Store) -> None:
    o = new_owner()
    until = now() + timedelta(seconds=0.3)
    resumed_by_hand = await _paused_job(store, o, until)
    await store.resume_job(o, resumed_by_hand)
    paused_again = await _paused_job(store, o, until)
    await store.resume_job(o, paused_again)
    await store.pause_job(o, paused_again)  # no until this time: paused until a resume
    await _past(until)
    for jid in (resumed_by_hand, paused_again):
        assert await store.end_pauses(shard_of(jid), limit=500) == 0
    assert (await store.get_job(o, resumed_by_hand)).state is JobState.SCHEDULED
    assert (await store.get_job(o, paused_again)).state is JobState.PAUSED
    actions = [c.action for c in (await store.list_changes(o, paused_again, limit=10, cursor=None)).items]
    assert ChangeAction.AUTO_RESUME not in actions


async def test_a_bulk_pause_says_the_same_for_every_job(store: Store) -> None:
    o = new_owner()
    team = {"team": "t-" + o}
    ids = [uuid.UUID((await store.create_job(o, cron("0 0 1 1 *", labels=team)))[0].id) for _ in range(3)]
    until = now() + timedelta(seconds=0.5)
    pause = PauseRequest(note="freeze", until=until)
    result = await store.bulk_action(o, "pause", team, state=None, max_jobs=100, by=ALICE, pause=pause)
    assert result.changed == 3
    for jid in ids:
        paused = (await store.get_job(o, jid)).paused
        assert paused is not None and (paused.note, paused.until, paused.key_id) == (
            "freeze",
            until,
            "dt_alice12",
        )
    for jid in ids:
        if (await store.get_job(o, jid)).state is JobState.PAUSED:
            await _end_pauses_until(store, jid)
    assert {(await store.get_job(o, jid)).state for jid in ids} == {JobState.SCHEDULED}


async def test_after_the_pause_the_missed_occurrences_follow_the_misfire_policy(store: Store) -> None:
    """As after an owner's resume: the occurrences due while paused are overdue, and the claim
    hands the job's misfire policy to the engine."""
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(
        o, cron("* * * * * *", overlap=Overlap.SKIP, misfire=Misfire.SKIP, misfire_grace_s=0)
    )
    jid = uuid.UUID(job.id)
    await store.pause_job(o, jid, pause=PauseRequest(until=now() + timedelta(seconds=1.5)))
    await _end_pauses_until(store, jid)
    row = (await claim(store, e, [jid]))[jid]
    assert row.misfire_spec is not None and row.misfire_spec.misfire is Misfire.SKIP


async def test_pause_after_failures_shows_duetime_as_the_pauser(store: Store) -> None:
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("0 0 1 1 *", overlap=Overlap.SKIP, pause_after_failures=1))
    jid = uuid.UUID(job.id)
    await store.trigger_job(o, jid)
    [run] = await fence(store, (await claim(store, e, [jid])).values())
    await store.complete_runs([report(run, Outcome.FAILED)])
    paused = (await store.get_job(o, jid)).paused
    assert paused is not None and (paused.actor, paused.key_id, paused.note, paused.until) == (
        ActorType.DUETIME,
        None,
        None,
        None,
    )
    assert await store.end_pauses(shard_of(jid), limit=500) == 0  # until a resume


async def test_a_job_that_left_paused_another_way_is_not_resumed(store: Store) -> None:
    """A one-off paused while its run was in flight completes when the run succeeds: its pause is
    over without a resume, and its until does nothing."""
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, one_off(now()))
    jid = uuid.UUID(job.id)
    [run] = await fence(store, (await claim(store, e, [jid])).values())
    until = now() + timedelta(seconds=0.3)
    await store.pause_job(o, jid, pause=PauseRequest(until=until))
    await store.complete_runs([report(run, Outcome.SUCCEEDED)])
    done = await store.get_job(o, jid)
    assert done.state is JobState.COMPLETED and done.paused is None
    await _past(until)
    assert await store.end_pauses(shard_of(jid), limit=500) == 0
    assert (await store.get_job(o, jid)).state is JobState.COMPLETED
    actions = [c.action for c in (await store.list_changes(o, jid, limit=10, cursor=None)).items]
    assert actions == [ChangeAction.PAUSE, ChangeAction.CREATE]
