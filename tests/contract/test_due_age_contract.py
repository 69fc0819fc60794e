"""The DueAge port's contract (engine/due_age.py samples it into a gauge), for every store: each
shard asked gets one reading; a due row nobody claimed counts from when it fell due, and no
longer once it is claimed.

The PostgreSQL stores share their databases between cases, and cases leave due rows behind: a
reading is at least this case's row's age, and a shard is empty once this case claimed it."""

from __future__ import annotations

import uuid
from datetime import timedelta

from duetime.core.ids import shard_of
from tests.contract.conftest import Store, engine_id, new_owner, now, one_off
from tests.support.wait import until


async def _reading(store: Store, shard: int) -> float:
    [reading] = await store.oldest_unclaimed_due([shard])
    assert reading.shard == shard
    return reading.oldest_age_s


async def _claim_all_due(store: Store, shard: int) -> None:
    while await store.claim_due(shard, engine_id(), lookahead_s=0, lease_s=300, limit=1000):
        pass


async def test_every_shard_asked_gets_one_reading(store: Store) -> None:
    readings = await store.oldest_unclaimed_due([3, *range(16)])
    assert sorted(r.shard for r in readings) == list(range(16))
    assert all(r.oldest_age_s >= 0 for r in readings)


async def test_an_unclaimed_due_row_is_measured_until_it_is_claimed(store: Store) -> None:
    job, _ = await store.create_job(new_owner(), one_off(now()))
    shard = shard_of(uuid.UUID(job.id))

    async def waited() -> bool:
        return await _reading(store, shard) >= 0.3

    await until(waited, within=10, what="the due row's age to reach 0.3 s")
    await _claim_all_due(store, shard)
    assert await _reading(store, shard) == 0.0


async def test_a_row_not_due_yet_does_not_count(store: Store) -> None:
    job, _ = await store.create_job(new_owner(), one_off(now() + timedelta(hours=1)))
    shard = shard_of(uuid.UUID(job.id))
    await _claim_all_due(store, shard)
    assert await _reading(store, shard) == 0.0
