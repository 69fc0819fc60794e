"""The Registry port's contract (what the API relies on), for every store."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import time, timedelta

import pytest

from duetime.core.errors import Conflict, InvalidRequest, NotFound
from duetime.core.jitter import spread
from duetime.core.model import JobState
from duetime.storage.ports import IdempotencyRequest
from duetime.storage.postgres import PostgresStore
from tests.contract.conftest import Store, cron, new_owner, now, one_off


async def test_create_then_get_and_another_owner_sees_nothing(store: Store) -> None:
    o = new_owner()
    at = now() + timedelta(hours=1)
    job, created = await store.create_job(o, one_off(at))
    assert created and job.state is JobState.SCHEDULED and job.next_run_at == at and job.attempt == 0
    got = await store.get_job(o, uuid.UUID(job.id))
    assert (got.id, got.owner, got.spec, got.state, got.next_run_at) == (job.id, o, job.spec, job.state, at)
    assert got.last_run is None
    with pytest.raises(NotFound):
        await store.get_job(new_owner(), uuid.UUID(job.id))
    with pytest.raises(NotFound):
        await store.pause_job(new_owner(), uuid.UUID(job.id))
    with pytest.raises(NotFound):
        await store.list_runs(new_owner(), uuid.UUID(job.id), limit=10, cursor=None)


async def test_a_one_off_in_the_past_is_due_now(store: Store) -> None:
    """Due now by the store's clock: the database's as measured (storage.dbclock), which may read
    a little apart from this process's (150-180 µs behind was seen); a day ago it is not."""
    before = now()
    job, _ = await store.create_job(new_owner(), one_off(before - timedelta(days=1)))
    skew = timedelta(seconds=1)
    assert job.next_run_at is not None and before - skew <= job.next_run_at <= now() + skew


async def test_idempotency_key_same_body_same_job_other_body_refused(store: Store) -> None:
    o = new_owner()
    spec = one_off(now() + timedelta(hours=1))
    key = IdempotencyRequest("k-1", b"h" * 32)
    first, created = await store.create_job(o, spec, idempotency=key)
    again, created_again = await store.create_job(o, spec, idempotency=key)
    assert created and not created_again and again.id == first.id
    with pytest.raises(InvalidRequest) as err:
        await store.create_job(o, spec, idempotency=IdempotencyRequest("k-1", b"x" * 32))
    assert err.value.code == "idempotency_key_reused"
    # The key is the owner's: another owner's same key makes another job.
    theirs, created_theirs = await store.create_job(new_owner(), spec, idempotency=key)
    assert created_theirs and theirs.id != first.id


async def test_concurrent_creates_with_one_key_make_one_job(store: Store) -> None:
    o = new_owner()
    key = IdempotencyRequest("race", b"h" * 32)
    spec = one_off(now() + timedelta(hours=1))
    results = await asyncio.gather(*(store.create_job(o, spec, idempotency=key) for _ in range(6)))
    assert len({j.id for j, _ in results}) == 1
    assert sum(1 for _, created in results if created) == 1


async def test_pages_list_every_job_once_in_id_order_and_filter_by_state(store: Store) -> None:
    o = new_owner()
    ids = [(await store.create_job(o, one_off(now() + timedelta(hours=1 + i))))[0].id for i in range(7)]
    await store.pause_job(o, uuid.UUID(ids[3]))
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = await store.list_jobs(o, state=None, limit=3, cursor=cursor)
        seen += [j.id for j in page.items]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == sorted(ids, key=uuid.UUID) and pages == 3
    paused = await store.list_jobs(o, state=JobState.PAUSED, limit=10, cursor=None)
    assert [j.id for j in paused.items] == [ids[3]] and paused.next_cursor is None
    for bad in ("not-a-cursor!", "AAAA"):
        with pytest.raises(InvalidRequest) as err:
            await store.list_jobs(o, state=None, limit=3, cursor=bad)
        assert err.value.code == "invalid_cursor"
    with pytest.raises(InvalidRequest):
        await store.list_runs(o, uuid.UUID(ids[0]), limit=3, cursor="__8AAAAAAAA")  # run id > 2**63-1
    for forged in ("A" * 32 + "gAAAAAAAAAA", "f_________8" + "A" * 32):
        with pytest.raises(InvalidRequest) as err:  # run id 2**63; a time past year 9999
            await store.list_owner_runs(o, outcome=None, since=None, limit=3, cursor=forged)
        assert err.value.code == "invalid_cursor"


async def test_owner_actions_follow_the_lifecycle(store: Store) -> None:
    o = new_owner()
    job, _ = await store.create_job(o, cron("*/5 * * * *"))
    jid = uuid.UUID(job.id)
    paused = await store.pause_job(o, jid)
    assert paused.state is JobState.PAUSED and paused.next_run_at == job.next_run_at
    assert (await store.pause_job(o, jid)).state is JobState.PAUSED  # again: no change, no error
    with pytest.raises(Conflict) as err:
        await store.trigger_job(o, jid)
    assert err.value.code == "job_paused"
    with pytest.raises(Conflict) as err:
        await store.replay_job(o, jid)
    assert err.value.code == "job_paused"
    assert (await store.resume_job(o, jid)).state is JobState.SCHEDULED
    assert await store.count_active_jobs(o) == 1
    cancelled = await store.cancel_job(o, jid)
    assert cancelled.state is JobState.CANCELLED and cancelled.next_run_at is None
    assert (await store.cancel_job(o, jid)).state is JobState.CANCELLED
    assert await store.count_active_jobs(o) == 0
    for action in (store.pause_job, store.resume_job, store.trigger_job):
        with pytest.raises(Conflict) as err:
            await action(o, jid)
        assert err.value.code == "job_cancelled"
    with pytest.raises(Conflict):
        await store.update_job(o, jid, cron("*/10 * * * *"))


async def test_update_replaces_the_spec_and_a_new_schedule_its_next_run(store: Store) -> None:
    o = new_owner()
    job, _ = await store.create_job(o, one_off(now() + timedelta(hours=1)))
    jid = uuid.UUID(job.id)
    renamed = await store.update_job(o, jid, one_off(now() + timedelta(hours=1), name="renamed"))
    assert renamed.spec.name == "renamed"
    at = now() + timedelta(hours=3)
    moved = await store.update_job(o, jid, one_off(at))
    assert moved.next_run_at == at and moved.spec.name is None
    assert (await store.get_job(o, jid)).next_run_at == at


async def test_a_new_spread_moves_next_run_at_and_an_unchanged_one_does_not(store: Store) -> None:
    """spread_s decides when runs are due, as jitter_s does: changing it starts the job over from
    its new timing (the first occurrence whose spread time is after now); a PATCH of something
    else, the spread included unchanged, leaves the plan alone."""
    o = new_owner()
    job, _ = await store.create_job(o, cron("0 0 * * *"))
    jid = uuid.UUID(job.id)
    assert job.next_run_at is not None and job.spec.spread_s == 0
    spread_spec = replace(job.spec, spread_s=3600)
    moved = await store.update_job(o, jid, spread_spec)
    offset = spread(jid, spread_spec)
    assert moved.spec.spread_s == 3600 and moved.next_run_at is not None
    assert now() < moved.next_run_at and (moved.next_run_at - offset).time() == time(0, 0)
    renamed = await store.update_job(o, jid, replace(spread_spec, name="renamed"))
    assert renamed.next_run_at == moved.next_run_at and renamed.spec.spread_s == 3600
    assert (await store.get_job(o, jid)).next_run_at == moved.next_run_at


async def test_trigger_runs_now_and_replay_needs_a_dead_job(store: Store) -> None:
    o = new_owner()
    job, _ = await store.create_job(o, cron("0 0 1 1 *"))
    before = now()
    triggered = await store.trigger_job(o, uuid.UUID(job.id))
    assert triggered.next_run_at is not None and before <= triggered.next_run_at <= now()
    with pytest.raises(Conflict) as err:
        await store.replay_job(o, uuid.UUID(job.id))
    assert err.value.code == "job_scheduled"


async def test_backfill_queues_occurrences_up_to_the_bound(store: Store) -> None:
    o = new_owner()
    job, _ = await store.create_job(o, cron("0 * * * *"))
    jid = uuid.UUID(job.id)
    end = now().replace(minute=0, second=0, microsecond=0)
    done = await store.backfill_job(o, jid, end - timedelta(hours=3), end, max_occurrences=5, pace_per_s=10)
    assert (
        done.queued == 3 and done.first == end - timedelta(hours=3) and done.last == end - timedelta(hours=1)
    )
    with pytest.raises(Conflict) as err:
        await store.backfill_job(
            o, jid, end - timedelta(hours=6), end - timedelta(hours=3), max_occurrences=5, pace_per_s=10
        )
    assert err.value.code == "backfill_in_progress"
    # Occurrence rows are internal: not listed, not counted.
    assert [j.id for j in (await store.list_jobs(o, state=None, limit=10, cursor=None)).items] == [job.id]
    assert await store.count_active_jobs(o) == 1


async def test_api_keys_owners_and_signing_secrets(store: Store) -> None:
    o = new_owner()
    assert await store.signing_secret(o) is None
    key, secret = await store.create_api_key(o)
    assert key.startswith("dt_") and secret
    assert await store.owner_for_key(key) == o
    assert await store.signing_secret(o) == secret
    second, same_secret = await store.create_api_key(o)
    assert same_secret == secret and await store.owner_for_key(second) == o
    assert await store.revoke_api_key(key[:10]) == 1
    assert await store.owner_for_key(key) is None and await store.owner_for_key(second) == o
    assert await store.revoke_api_key(key) == 0
    assert await store.revoke_api_key(second) == 1
    assert await store.owner_for_key("dt_never-issued") is None
    await store.ping()


async def test_queued_triggers_stop_at_the_cap_with_too_many_triggers(store: Store) -> None:
    """Each queued trigger is a later call of someone's URL (issue 17, item 2)."""
    o = new_owner()
    job, _ = await store.create_job(o, cron("0 0 1 1 *"))
    jid = uuid.UUID(job.id)
    for _ in range(3):  # the first runs now, the next two queue behind it
        await store.trigger_job(o, jid, max_pending=2)
    with pytest.raises(Conflict) as info:
        await store.trigger_job(o, jid, max_pending=2)
    assert info.value.code == "too_many_triggers"
    await store.trigger_job(o, jid)  # no cap given: accepted


async def test_the_cursor_key_is_one_stable_32_byte_key(store: Store) -> None:
    """Every API process seals cursors with it (api/cursors.py), so it must not change between
    calls, nor differ between two stores (two processes) on one installation."""
    key = await store.cursor_key()
    assert isinstance(key, bytes) and len(key) == 32
    assert await store.cursor_key() == key
    assert key != bytes(32)
    if isinstance(store, PostgresStore):
        other = await PostgresStore.open(store.shard_map, pool_size=1)
        try:
            assert await other.cursor_key() == key
        finally:
            await other.close()
