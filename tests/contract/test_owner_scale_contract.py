"""Names, labels and bulk actions as the Registry port promises them, for every store (in
memory, PostgreSQL on one database, and on two)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import timedelta

import pytest

from duetime.core.errors import Conflict, NotFound
from duetime.core.model import JobState
from duetime.storage.ports import IdempotencyRequest, NameHolderChanged
from tests.contract.conftest import Store, cron, new_owner, now, one_off


async def test_a_name_is_held_once_per_owner_until_cancelled(store: Store) -> None:
    o = new_owner()
    first, _ = await store.create_job(o, cron("*/5 * * * *", name="n"))
    for _ in range(3):  # random ids land on every database of the map
        with pytest.raises(Conflict) as err:
            await store.create_job(o, cron("0 * * * *", name="n"))
        assert err.value.code == "name_taken" and first.id in err.value.message
    other, _ = await store.create_job(o, cron("*/5 * * * *", name="m"))
    with pytest.raises(Conflict) as err:
        await store.update_job(o, uuid.UUID(other.id), replace(other.spec, name="n"))
    assert err.value.code == "name_taken"
    assert (await store.get_job_by_name(o, "n")).id == first.id
    await store.cancel_job(o, uuid.UUID(first.id))
    with pytest.raises(NotFound):
        await store.get_job_by_name(o, "n")
    renamed = await store.update_job(o, uuid.UUID(other.id), replace(other.spec, name="n"))
    assert renamed.spec.name == "n"
    assert (await store.create_job(new_owner(), cron("* * * * *", name="n")))[1]


async def test_an_idempotent_replay_of_a_named_create(store: Store) -> None:
    o = new_owner()
    key = IdempotencyRequest("k", b"h" * 32)
    spec = one_off(now() + timedelta(hours=1), name="once")
    first, created = await store.create_job(o, spec, idempotency=key)
    again, created_again = await store.create_job(o, spec, idempotency=key)
    assert created and not created_again and again.id == first.id


async def test_apply_creates_updates_and_writes_nothing_for_an_equal_spec(store: Store) -> None:
    o = new_owner()
    spec = cron("*/5 * * * *", name="app", labels={"team": "a"})
    made, created = await store.apply_job(o, spec, expected_id=None)
    assert created
    with pytest.raises(NameHolderChanged):
        await store.apply_job(o, spec, expected_id=None)
    same, created = await store.apply_job(o, spec, expected_id=made.id)
    assert not created and same.updated_at == made.updated_at
    paused = await store.pause_job(o, uuid.UUID(made.id))
    changed, _ = await store.apply_job(o, replace(spec, jitter_s=3), expected_id=made.id)
    assert changed.spec.jitter_s == 3 and changed.state is JobState.PAUSED
    assert changed.updated_at > paused.updated_at


async def test_concurrent_applies_of_one_name_make_one_job(store: Store) -> None:
    o = new_owner()
    spec = cron("*/5 * * * *", name="race")
    results = await asyncio.gather(
        *(store.apply_job(o, spec, expected_id=None) for _ in range(6)), return_exceptions=True
    )
    created = [r for r in results if isinstance(r, tuple) and r[1]]
    assert len(created) == 1
    assert all(isinstance(r, NameHolderChanged) for r in results if not isinstance(r, tuple))


async def test_labels_filter_and_page_and_bulk_acts_on_them(store: Store) -> None:
    o = new_owner()
    ids = []
    for i in range(12):
        job, _ = await store.create_job(o, cron("*/5 * * * *", labels={"fleet": "f", "half": str(i % 2)}))
        ids.append(job.id)
    await store.create_job(new_owner(), cron("*/5 * * * *", labels={"fleet": "f"}))
    seen: list[str] = []
    cursor = None
    while True:
        page = await store.list_jobs(
            o, state=None, limit=5, cursor=cursor, labels={"fleet": "f", "half": "1"}
        )
        seen.extend(j.id for j in page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == sorted(ids[1::2], key=uuid.UUID)
    first = await store.bulk_action(o, "pause", {"fleet": "f"}, state=None, max_jobs=5)
    assert (first.matched, first.changed, first.more) == (5, 5, True)
    rest = await store.bulk_action(o, "pause", {"fleet": "f"}, state=None, max_jobs=100)
    assert (rest.matched, rest.changed, rest.more) == (7, 7, False)
    paused = await store.list_jobs(o, state=JobState.PAUSED, limit=100, cursor=None, labels={"fleet": "f"})
    assert len(paused.items) == 12
    gone = await store.bulk_action(o, "cancel", {"half": "0"}, state=JobState.PAUSED, max_jobs=100)
    assert gone.changed == 6
    back = await store.bulk_action(o, "resume", {"fleet": "f"}, state=None, max_jobs=100)
    assert back.changed == 6
    states = {(await store.get_job(o, uuid.UUID(i))).state for i in ids[1::2]}
    assert states == {JobState.SCHEDULED}
