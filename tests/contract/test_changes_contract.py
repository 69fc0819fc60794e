"""The change history's contract (issue 30, item 1), for every store: each call that changes a job
writes one record (action, diff, actor, reason, the spec_version after it), numbered from 1 per
job and listed newest first; a call that changes nothing writes none; Duetime's own pause is
recorded as ``auto_pause``; and each run carries the spec_version it ran under."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import pytest

from duetime.core import codec
from duetime.core.changes import ActorType, Change, ChangeAction, ChangeBy
from duetime.core.errors import InvalidRequest, NotFound
from duetime.core.model import CronSchedule, JobState, Outcome, Overlap, RetryPolicy, WebhookTarget
from duetime.storage.ports import IdempotencyRequest
from tests.contract.conftest import Store, cron, engine_id, new_owner, now, one_off
from tests.contract.test_runstore_contract import claim, fence, report

ALICE = ChangeBy(key_id="dt_alice12", reason="ticket OPS-1")
BOB = ChangeBy(key_id="dt_bob4567", reason=None)


async def history(store: Store, owner: str, jid: uuid.UUID) -> list[Change]:
    """Every record of the job, newest first, read a page of two at a time."""
    out: list[Change] = []
    cursor: str | None = None
    while True:
        page = await store.list_changes(owner, jid, limit=2, cursor=cursor)
        out += page.items
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


def actions(records: list[Change]) -> list[tuple[int, ChangeAction, int]]:
    """(seq, action, spec_version) of each record, as listed."""
    return [(c.seq, c.action, c.spec_version) for c in records]


async def test_create_records_the_whole_spec_with_its_secrets_redacted(store: Store) -> None:
    o = new_owner()
    spec = one_off(now() + timedelta(hours=1), name="n-" + o, labels={"team/a": "x"})
    job, created = await store.create_job(o, spec, by=ALICE)
    assert created and job.spec_version == 1
    [record] = await history(store, o, uuid.UUID(job.id))
    assert (record.seq, record.action, record.spec_version) == (1, ChangeAction.CREATE, 1)
    assert (record.actor, record.key_id, record.reason) == (ActorType.OWNER, "dt_alice12", "ticket OPS-1")
    shown = codec.spec_to_json(spec, redact=True)
    assert record.diff == {"": {"from": None, "to": shown}}
    assert shown["target"]["headers"] == {"X-Secret": "<redacted>"}
    assert "s3cret" not in repr(record.diff)
    assert record.at == job.created_at


async def test_every_owner_action_is_one_record_numbered_from_one_newest_first(store: Store) -> None:
    o = new_owner()
    spec = cron("0 0 1 1 *", overlap=Overlap.SKIP)
    job, _ = await store.create_job(o, spec, by=ALICE)
    jid = uuid.UUID(job.id)

    await store.pause_job(o, jid, by=BOB)
    await store.pause_job(o, jid, by=BOB)  # paused already: nothing changes, nothing is written
    await store.resume_job(o, jid, by=ALICE)
    await store.trigger_job(o, jid, by=BOB)
    start = now() - timedelta(days=800)
    queued = await store.backfill_job(
        o, jid, start, start + timedelta(days=400), max_occurrences=10, pace_per_s=10, by=ALICE
    )
    assert queued.queued == 1
    await store.backfill_job(  # a window with no occurrence queues nothing: not a change
        o, jid, start, start + timedelta(days=1), max_occurrences=10, pace_per_s=10, by=ALICE
    )
    await store.cancel_job(o, jid, by=BOB)
    await store.cancel_job(o, jid, by=BOB)  # repeating a cancel is harmless, and unrecorded

    records = await history(store, o, jid)
    assert actions(records) == [
        (6, ChangeAction.CANCEL, 1),
        (5, ChangeAction.BACKFILL, 1),
        (4, ChangeAction.TRIGGER, 1),
        (3, ChangeAction.RESUME, 1),
        (2, ChangeAction.PAUSE, 1),
        (1, ChangeAction.CREATE, 1),
    ]
    assert all(r.diff == {} for r in records[:-1])
    assert [(r.key_id, r.reason) for r in records[:4]] == [
        ("dt_bob4567", None),
        ("dt_alice12", "ticket OPS-1"),
        ("dt_bob4567", None),
        ("dt_alice12", "ticket OPS-1"),
    ]
    assert all(r.actor is ActorType.OWNER for r in records)
    assert [r.at for r in records] == sorted((r.at for r in records), reverse=True)
    # Each job numbers its own records.
    other, _ = await store.create_job(o, spec)
    assert actions(await history(store, o, uuid.UUID(other.id))) == [(1, ChangeAction.CREATE, 1)]


async def test_an_update_records_its_diff_and_moves_the_spec_version(store: Store) -> None:
    o = new_owner()
    job, _ = await store.create_job(o, cron("0 * * * *", labels={"a/b": "1"}))
    jid = uuid.UUID(job.id)
    current = job.spec
    updated = await store.update_job(
        o, jid, replace(current, schedule=CronSchedule(cron="5 * * * *", timezone="UTC")), by=ALICE
    )
    assert updated.spec_version == 2 and (await store.get_job(o, jid)).spec_version == 2
    # The same spec again alters nothing: no record, no new version.
    same = await store.update_job(o, jid, updated.spec, by=BOB)
    assert same.spec_version == 2
    secret = WebhookTarget(url="https://example.com/hook", headers={"X-Secret": "new-secret"})
    third = await store.update_job(
        o, jid, replace(updated.spec, target=secret, labels={"a/b": "2"}, payload={"n": 1}), by=BOB
    )
    assert third.spec_version == 3

    newest, second, first = await history(store, o, jid)
    assert (second.seq, second.action, second.spec_version) == (2, ChangeAction.UPDATE, 2)
    assert second.diff == {"/schedule/cron": {"from": "0 * * * *", "to": "5 * * * *"}}
    assert (second.key_id, second.reason) == ("dt_alice12", "ticket OPS-1")
    assert (newest.seq, newest.action, newest.spec_version) == (3, ChangeAction.UPDATE, 3)
    assert newest.diff == {
        "/labels/a~1b": {"from": "1", "to": "2"},  # a "/" in a key is "~1" in a pointer
        "/target/headers/X-Secret": {"from": None, "to": "<redacted>"},
        "/payload": {"from": None, "to": {"n": 1}},
    }
    assert "new-secret" not in repr(newest.diff)
    assert first.action is ChangeAction.CREATE


async def test_put_by_name_records_create_then_replace_and_nothing_when_unchanged(store: Store) -> None:
    o = new_owner()
    name = "nightly-" + o
    spec = cron("0 3 * * *", name=name)
    job, created = await store.apply_job(o, spec, expected_id=None, by=ALICE)
    assert created
    again, _ = await store.apply_job(o, spec, expected_id=job.id, by=BOB)
    assert again.updated_at == job.updated_at
    changed, created_again = await store.apply_job(o, replace(spec, jitter_s=30), expected_id=job.id, by=BOB)
    assert not created_again and changed.spec_version == 2
    records = await history(store, o, uuid.UUID(job.id))
    assert actions(records) == [(2, ChangeAction.REPLACE, 2), (1, ChangeAction.CREATE, 1)]
    assert records[0].diff == {"/jitter_s": {"from": 0, "to": 30}}
    assert records[0].key_id == "dt_bob4567"


async def test_a_create_replayed_by_its_idempotency_key_is_recorded_once(store: Store) -> None:
    o = new_owner()
    key = IdempotencyRequest("k-1", b"h" * 32)
    spec = one_off(now() + timedelta(hours=1))
    first, _ = await store.create_job(o, spec, idempotency=key, by=ALICE)
    again, created = await store.create_job(o, spec, idempotency=key, by=BOB)
    assert not created and again.id == first.id
    [record] = await history(store, o, uuid.UUID(first.id))
    assert record.action is ChangeAction.CREATE and record.key_id == "dt_alice12"


async def test_bulk_calls_record_each_job_they_changed(store: Store) -> None:
    o = new_owner()
    team = {"team": "t-" + o}
    ids = [uuid.UUID((await store.create_job(o, cron("0 0 1 1 *", labels=team)))[0].id) for _ in range(5)]
    await store.pause_job(o, ids[0])  # paused already: the bulk pause does not change it
    result = await store.bulk_action(o, "pause", team, state=None, max_jobs=100, by=ALICE)
    assert (result.matched, result.changed) == (4, 4)
    for jid in ids[1:]:
        newest, _ = await history(store, o, jid)
        assert (newest.seq, newest.action, newest.reason, newest.key_id) == (
            2,
            ChangeAction.PAUSE,
            "ticket OPS-1",
            "dt_alice12",
        )
    assert [r.key_id for r in await history(store, o, ids[0])] == [None, None]
    await store.bulk_action(o, "cancel", team, state=None, max_jobs=100, by=BOB)
    assert actions(await history(store, o, ids[1])) == [
        (3, ChangeAction.CANCEL, 1),
        (2, ChangeAction.PAUSE, 1),
        (1, ChangeAction.CREATE, 1),
    ]


async def test_replays_are_recorded(store: Store) -> None:
    o, e = new_owner(), engine_id()
    dead, _ = await store.create_job(o, one_off(now(), retry=RetryPolicy(max_attempts=1)))
    did = uuid.UUID(dead.id)
    [run] = await fence(store, (await claim(store, e, [did])).values())
    await store.complete_runs([report(run, Outcome.FAILED)])
    assert (await store.get_job(o, did)).state is JobState.DEAD
    await store.replay_job(o, did, by=ALICE)
    assert actions(await history(store, o, did)) == [(2, ChangeAction.REPLAY, 1), (1, ChangeAction.CREATE, 1)]

    job, _ = await store.create_job(o, cron("0 0 1 1 *", overlap=Overlap.SKIP))
    jid = uuid.UUID(job.id)
    await store.trigger_job(o, jid)
    [run] = await fence(store, (await claim(store, e, [jid])).values())
    await store.complete_runs([report(run, Outcome.FAILED)])
    await store.replay_occurrence(o, jid, run.scheduled_for, by=BOB)
    records = await history(store, o, jid)
    assert actions(records)[0] == (3, ChangeAction.REPLAY, 1) and records[0].key_id == "dt_bob4567"


async def test_pages_go_back_to_the_first_record_and_other_owners_see_nothing(store: Store) -> None:
    o = new_owner()
    job, _ = await store.create_job(o, cron("0 0 1 1 *"))
    jid = uuid.UUID(job.id)
    for _ in range(3):
        await store.pause_job(o, jid)
        await store.resume_job(o, jid)
    first = await store.list_changes(o, jid, limit=4, cursor=None)
    assert [c.seq for c in first.items] == [7, 6, 5, 4] and first.next_cursor is not None
    rest = await store.list_changes(o, jid, limit=4, cursor=first.next_cursor)
    assert [c.seq for c in rest.items] == [3, 2, 1] and rest.next_cursor is None
    exact = await store.list_changes(o, jid, limit=7, cursor=None)
    assert len(exact.items) == 7 and exact.next_cursor is None
    with pytest.raises(NotFound):
        await store.list_changes(new_owner(), jid, limit=10, cursor=None)
    with pytest.raises(NotFound):
        await store.list_changes(o, uuid.uuid4(), limit=10, cursor=None)
    with pytest.raises(InvalidRequest) as err:
        await store.list_changes(o, jid, limit=10, cursor="!!")
    assert err.value.code == "invalid_cursor"


async def test_pause_after_failures_is_recorded_as_an_auto_pause_by_duetime(store: Store) -> None:
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("0 0 1 1 *", overlap=Overlap.SKIP, pause_after_failures=2))
    jid = uuid.UUID(job.id)
    for _ in range(2):
        await store.trigger_job(o, jid, by=ALICE)
        [run] = await fence(store, (await claim(store, e, [jid])).values())
        await store.complete_runs([report(run, Outcome.FAILED)])
    assert (await store.get_job(o, jid)).state is JobState.PAUSED
    newest, *_ = records = await history(store, o, jid)
    assert actions(records) == [
        (4, ChangeAction.AUTO_PAUSE, 1),
        (3, ChangeAction.TRIGGER, 1),
        (2, ChangeAction.TRIGGER, 1),
        (1, ChangeAction.CREATE, 1),
    ]
    assert (newest.actor, newest.key_id, newest.diff) == (ActorType.DUETIME, None, {})
    assert newest.reason == "paused by pause_after_failures after 2 consecutive failed occurrences"
    await store.resume_job(o, jid, by=BOB)
    assert actions(await history(store, o, jid))[0] == (5, ChangeAction.RESUME, 1)


@pytest.mark.parametrize("outcome", [Outcome.SUCCEEDED, Outcome.FAILED])
async def test_a_run_carries_the_spec_version_it_ran_under(store: Store, outcome: Outcome) -> None:
    """A PATCH while a run is in flight gives the job a new version; the run keeps the one it was
    fenced under, in the history and as the job's last run, on the completion's one statement (a
    success the worker parsed) and on its general path alike."""
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("* * * * * *", overlap=Overlap.SKIP))
    jid = uuid.UUID(job.id)
    [run] = await fence(store, (await claim(store, e, [jid])).values())
    assert run.spec.parsed.payload is None  # parsed, as a worker does: the one statement may take it
    patched = await store.update_job(o, jid, replace(job.spec, payload={"v": 2}))
    assert patched.spec_version == 2
    await store.complete_runs([report(run, outcome)])
    [ran] = (await store.list_runs(o, jid, limit=10, cursor=None)).items
    assert (ran.outcome, ran.spec_version) == (outcome, 1)
    last = (await store.get_job(o, jid)).last_run
    assert last is not None and last.spec_version == 1

    [second] = await fence(store, (await claim(store, e, [jid])).values())
    await store.complete_runs([report(second, Outcome.SUCCEEDED)])
    newest = (await store.list_runs(o, jid, limit=10, cursor=None)).items[0]
    assert newest.spec_version == 2
    owner_runs = (await store.list_owner_runs(o, outcome=None, since=None, limit=10, cursor=None)).items
    assert [r.run.spec_version for r in owner_runs] == [2, 1]
