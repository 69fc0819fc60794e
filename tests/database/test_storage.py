"""The Postgres store on a real database: registry rules and the run path's fenced transitions.

Every case runs twice: all 16 shards on one database, and shards 0-7 / 8-15 on two databases.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from duetime.core.errors import Conflict, InvalidRequest, NotFound
from duetime.core.ids import shard_of
from duetime.core.model import (
    CronSchedule,
    JobSpec,
    JobState,
    OneOffSchedule,
    Outcome,
    RetryPolicy,
    WebhookTarget,
)
from duetime.core.runpath import AttemptReport, Claim, FencedRun, Verdict
from duetime.storage.base import IdempotencyRequest
from duetime.storage.postgres import PostgresStore
from duetime.storage.queries import Q
from duetime.storage.shardmap import ShardMap

ENGINE = "test-engine"


@pytest.fixture(params=["one-db", "two-dbs"])
async def store(
    request: pytest.FixtureRequest, pg_dsn: str, pg_dsn_pair: tuple[str, str]
) -> AsyncIterator[PostgresStore]:
    if request.param == "one-db":
        shard_map = ShardMap.single(pg_dsn)
    else:
        a, b = pg_dsn_pair
        shard_map = ShardMap.from_dsns([a] * 8 + [b] * 8)
    s = await PostgresStore.open(shard_map, pool_size=4)
    yield s
    await s.close()


def owner() -> str:
    return "o_" + uuid.uuid4().hex[:10]


def now() -> datetime:
    return datetime.now(UTC)


def one_off(at: datetime, **kw: object) -> JobSpec:
    return JobSpec(
        target=WebhookTarget(url="https://example.com/hook", headers={"X-Secret": "s3cret"}),
        schedule=OneOffSchedule(run_at=at),
        **kw,  # type: ignore[arg-type]
    )


def cron(expr: str, **kw: object) -> JobSpec:
    return JobSpec(
        target=WebhookTarget(url="https://example.com/hook"),
        schedule=CronSchedule(cron=expr, timezone="UTC"),
        **kw,  # type: ignore[arg-type]
    )


async def claim_all(store: PostgresStore, job_id: uuid.UUID, lease_s: float = 30.0) -> list[Claim]:
    rows = await store.claim_due(shard_of(job_id), ENGINE, lookahead_s=60, lease_s=lease_s, limit=500)
    return [r for r in rows if r.job_id == job_id]


async def fence(store: PostgresStore, claimed: list[Claim], lease_s: float = 30.0) -> list[FencedRun]:
    return await store.fence_runs(claimed, lease_s=lease_s)


def report(
    run: FencedRun, outcome: Outcome, retryable: bool = False, status: int | None = 200
) -> AttemptReport:
    t = now()
    return AttemptReport(run, Verdict(outcome, retryable, status), started_at=t, finished_at=t)


async def test_create_get_and_owner_isolation(store: PostgresStore) -> None:
    o = owner()
    job, created = await store.create_job(o, one_off(now() + timedelta(hours=1)))
    assert created
    got = await store.get_job(o, uuid.UUID(job.id))
    assert got.id == job.id and got.state is JobState.SCHEDULED
    assert got.spec.target.headers == {"X-Secret": "s3cret"}  # type: ignore[union-attr]
    with pytest.raises(NotFound):
        await store.get_job(owner(), uuid.UUID(job.id))
    with pytest.raises(NotFound):
        await store.cancel_job(owner(), uuid.UUID(job.id))


async def test_idempotency_key_same_body_and_different_body(store: PostgresStore) -> None:
    o = owner()
    spec = one_off(now() + timedelta(hours=1))
    key = IdempotencyRequest("k-1", b"h" * 32)
    first, created = await store.create_job(o, spec, idempotency=key)
    again, created_again = await store.create_job(o, spec, idempotency=key)
    assert created and not created_again and again.id == first.id
    with pytest.raises(InvalidRequest) as err:
        await store.create_job(o, spec, idempotency=IdempotencyRequest("k-1", b"x" * 32))
    assert err.value.code == "idempotency_key_reused"
    page = await store.list_jobs(o, state=None, limit=10, cursor=None)
    assert [j.id for j in page.items] == [first.id]


async def test_concurrent_same_idempotency_key_makes_one_job(store: PostgresStore) -> None:
    o = owner()
    spec = one_off(now() + timedelta(hours=1))
    key = IdempotencyRequest("race", b"h" * 32)
    results = await asyncio.gather(*(store.create_job(o, spec, idempotency=key) for _ in range(8)))
    assert len({j.id for j, _ in results}) == 1
    assert sum(1 for _, created in results if created) == 1


async def test_pagination_lists_every_job_once(store: PostgresStore) -> None:
    o = owner()
    ids = set()
    for _ in range(23):
        job, _ = await store.create_job(o, one_off(now() + timedelta(hours=1)))
        ids.add(job.id)
    seen: list[str] = []
    cursor = None
    while True:
        page = await store.list_jobs(o, state=None, limit=5, cursor=cursor)
        seen.extend(j.id for j in page.items)
        # a job made mid-listing must not disturb the order of those already listed
        if cursor is None:
            extra, _ = await store.create_job(o, one_off(now() + timedelta(hours=1)))
            ids.add(extra.id)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == len(ids)
    assert set(seen) == ids
    with pytest.raises(InvalidRequest) as err:
        await store.list_jobs(o, state=None, limit=5, cursor="!!not-a-cursor")
    assert err.value.code == "invalid_cursor"


async def test_claim_fence_complete_one_off(store: PostgresStore) -> None:
    o = owner()
    job, _ = await store.create_job(o, one_off(now() - timedelta(seconds=1)))
    jid = uuid.UUID(job.id)
    claimed = await claim_all(store, jid)
    assert len(claimed) == 1 and claimed[0].misfire_spec is None
    assert await claim_all(store, jid) == []  # a claimed row is not claimable again
    fenced = await fence(store, claimed)
    assert len(fenced) == 1 and fenced[0].attempt == 1 and fenced[0].owner == o
    stats = await store.complete_runs([report(fenced[0], Outcome.SUCCEEDED)])
    assert stats.applied == 1 and stats.stale == 0
    done = await store.get_job(o, jid)
    assert done.state is JobState.COMPLETED and done.next_run_at is None
    assert done.last_run is not None and done.last_run.outcome is Outcome.SUCCEEDED
    runs = await store.list_runs(o, jid, limit=10, cursor=None)
    assert [r.outcome for r in runs.items] == [Outcome.SUCCEEDED]
    # the same completion again is stale: the row is idle, its lease is gone
    again = await store.complete_runs([report(fenced[0], Outcome.SUCCEEDED)])
    assert again.applied == 0 and again.stale == 1


async def test_fencing_token_grows_with_every_lease(store: PostgresStore) -> None:
    o = owner()
    job, _ = await store.create_job(
        o,
        one_off(
            now() - timedelta(seconds=1),
            retry=RetryPolicy(max_attempts=3, backoff_initial_s=0.01, backoff_max_s=0.01),
        ),
    )
    jid = uuid.UUID(job.id)
    tokens = []
    for _ in range(2):
        for _ in range(50):
            claimed = await claim_all(store, jid)
            if claimed:
                break
            await asyncio.sleep(0.02)
        fenced = await fence(store, claimed)
        tokens.append(fenced[0].lease_token)
        await store.complete_runs([report(fenced[0], Outcome.FAILED, retryable=True, status=503)])
    assert tokens[1] > tokens[0]
    state = await store.get_job(o, jid)
    assert state.attempt == 2 and state.state is JobState.SCHEDULED


async def test_cancel_before_fire_is_honoured_by_the_fence(store: PostgresStore) -> None:
    o = owner()
    job, _ = await store.create_job(o, one_off(now() + timedelta(seconds=5)))
    jid = uuid.UUID(job.id)
    claimed = await claim_all(store, jid)
    assert len(claimed) == 1
    await store.cancel_job(o, jid)
    assert await fence(store, claimed) == []
    assert (await store.get_job(o, jid)).state is JobState.CANCELLED
    # and pause likewise
    job2, _ = await store.create_job(o, one_off(now() + timedelta(seconds=5)))
    j2 = uuid.UUID(job2.id)
    claimed2 = await claim_all(store, j2)
    await store.pause_job(o, j2)
    assert await fence(store, claimed2) == []


async def test_pause_during_call_keeps_history_and_state(store: PostgresStore) -> None:
    o = owner()
    job, _ = await store.create_job(o, cron("* * * * * *"))
    jid = uuid.UUID(job.id)
    for _ in range(100):
        claimed = await claim_all(store, jid)
        if claimed:
            break
        await asyncio.sleep(0.02)
    fenced = await fence(store, claimed)
    await store.pause_job(o, jid)
    stats = await store.complete_runs([report(fenced[0], Outcome.SUCCEEDED)])
    assert stats.applied == 1
    after = await store.get_job(o, jid)
    assert after.state is JobState.PAUSED
    assert after.next_run_at is not None and after.next_run_at > fenced[0].scheduled_for
    assert after.last_run is not None and after.last_run.outcome is Outcome.SUCCEEDED


async def test_retry_then_dead_then_replay(store: PostgresStore) -> None:
    o = owner()
    policy = RetryPolicy(max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.01)
    job, _ = await store.create_job(o, one_off(now() - timedelta(seconds=1), retry=policy))
    jid = uuid.UUID(job.id)
    for expected_attempt in (1, 2):
        for _ in range(100):
            claimed = await claim_all(store, jid)
            if claimed:
                break
            await asyncio.sleep(0.02)
        fenced = await fence(store, claimed)
        assert fenced[0].attempt == expected_attempt
        await store.complete_runs([report(fenced[0], Outcome.FAILED, retryable=True, status=500)])
    dead = await store.get_job(o, jid)
    assert dead.state is JobState.DEAD and dead.attempt == 2
    keys = {r.scheduled_for for r in (await store.list_runs(o, jid, limit=10, cursor=None)).items}
    assert len(keys) == 1  # every attempt carried the same occurrence (Idempotency-Key)
    with pytest.raises(Conflict):
        await store.pause_job(o, jid)
    replayed = await store.replay_job(o, jid)
    assert replayed.state is JobState.SCHEDULED and replayed.attempt == 0
    with pytest.raises(Conflict):
        await store.replay_job(o, jid)


async def test_non_retryable_failure_dead_letters_at_once(store: PostgresStore) -> None:
    o = owner()
    job, _ = await store.create_job(o, one_off(now() - timedelta(seconds=1)))
    jid = uuid.UUID(job.id)
    fenced = await fence(store, await claim_all(store, jid))
    await store.complete_runs([report(fenced[0], Outcome.FAILED, retryable=False, status=400)])
    assert (await store.get_job(o, jid)).state is JobState.DEAD


async def test_recurring_next_occurrence_from_scheduled_time(store: PostgresStore) -> None:
    o = owner()
    job, _ = await store.create_job(o, cron("0 0 1 1 *"))  # yearly, far away: force-claim via SQL
    jid = uuid.UUID(job.id)
    pool = store.pool_for_shard(shard_of(jid))
    sched = datetime(2026, 1, 1, tzinfo=UTC)
    await pool.execute("UPDATE jobs SET next_run_at = $2, scheduled_for = $2 WHERE job_id = $1", jid, sched)
    claimed = await claim_all(store, jid)
    assert claimed and claimed[0].misfire_spec is not None  # very late: the engine applies policy
    fenced = await fence(store, claimed)
    await store.complete_runs([report(fenced[0], Outcome.SUCCEEDED)])
    after = await store.get_job(o, jid)
    # next from the scheduled time (2026-01-01), never from the time it finished
    assert after.next_run_at == datetime(2027, 1, 1, tzinfo=UTC)


async def test_the_janitor_carries_the_lease_key_of_a_run_outliving_its_claim(store: PostgresStore) -> None:
    """A running row stays in the lease index under its claim's lease (leased_until: the fence
    leaves it, so that it writes no index entry). Once that lapses while the run's own lease
    (run_until) holds, the janitor's round moves leased_until up to run_until: the janitor's scan,
    which walks the index from its oldest key, would otherwise pass the same live run on every
    round until the run ended."""
    o = owner()
    job, _ = await store.create_job(o, one_off(now() - timedelta(seconds=1)))
    jid = uuid.UUID(job.id)
    [run] = await fence(store, await claim_all(store, jid, lease_s=0.05), lease_s=30)
    pool = store.pool_for_shard(shard_of(jid))
    read = "SELECT phase, leased_until, run_until FROM jobs WHERE job_id = $1"
    fenced = await pool.fetchrow(read, jid)
    assert fenced["run_until"] > fenced["leased_until"]
    await asyncio.sleep(0.2)
    await store.rescue_expired(shard_of(jid), limit=500)
    carried = await pool.fetchrow(read, jid)
    assert carried["phase"] == "running"
    assert carried["leased_until"] == carried["run_until"] == fenced["run_until"]
    assert (await store.list_runs(o, jid, limit=10, cursor=None)).items == []
    assert (await store.complete_runs([report(run, Outcome.SUCCEEDED)])).applied == 1


async def test_stale_completion_after_janitor_rescue(store: PostgresStore) -> None:
    o = owner()
    job, _ = await store.create_job(o, one_off(now() - timedelta(seconds=1)))
    jid = uuid.UUID(job.id)
    fenced = await fence(store, await claim_all(store, jid, lease_s=0.05), lease_s=0.05)
    await asyncio.sleep(0.2)
    rescued = await store.rescue_expired(shard_of(jid), limit=500)
    assert rescued.applied >= 1
    runs = (await store.list_runs(o, jid, limit=10, cursor=None)).items
    assert runs[0].outcome is Outcome.LEASE_EXPIRED
    # the worker that stalled comes back: its completion is rejected and changes nothing
    stats = await store.complete_runs([report(fenced[0], Outcome.SUCCEEDED)])
    assert stats.stale == 1 and stats.applied == 0
    again = await store.get_job(o, jid)
    assert again.state is JobState.SCHEDULED and again.attempt == 1


async def test_trigger_runs_once_then_schedule_resumes(store: PostgresStore) -> None:
    o = owner()
    at = now() + timedelta(hours=2)
    job, _ = await store.create_job(o, one_off(at))
    jid = uuid.UUID(job.id)
    await store.trigger_job(o, jid)
    fenced = await fence(store, await claim_all(store, jid))
    assert len(fenced) == 1 and fenced[0].run_kind == "manual"
    await store.complete_runs([report(fenced[0], Outcome.SUCCEEDED)])
    after = await store.get_job(o, jid)
    assert after.state is JobState.SCHEDULED and after.next_run_at == at


async def test_claim_query_uses_the_due_index(store: PostgresStore) -> None:
    pool = store.pool_for_shard(0)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")  # small tables: ask what it *can* do
        plan = await conn.fetch("EXPLAIN " + Q["claim_due"], 0, ENGINE, 60.0, 500, 30.0)
        text = "\n".join(r[0] for r in plan)
        await conn.execute("SET LOCAL enable_seqscan = on")
        assert "jobs_due" in text, text
        assert "Seq Scan on jobs" not in text, text
        plan = await conn.fetch("EXPLAIN " + Q["expired_leases"], 0, 500)
        assert "jobs_leases" in "\n".join(r[0] for r in plan)


async def test_claim_plan_without_hints_at_scale(pg_dsn: str) -> None:
    """With a realistic table the planner picks the due index on its own."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        async with conn.transaction():
            await conn.execute(
                "INSERT INTO jobs (job_id, shard, owner, spec, state, next_run_at, scheduled_for) "
                "SELECT gen_random_uuid(), (g % 16), 'bulk', '{}'::jsonb, 'scheduled', "
                "now() + make_interval(secs => g), now() + make_interval(secs => g) "
                "FROM generate_series(1, 50000) g"
            )
            await conn.execute("ANALYZE jobs")
            plan = await conn.fetch("EXPLAIN " + Q["claim_due"], 3, ENGINE, 60.0, 500, 30.0)
            text = "\n".join(r[0] for r in plan)
            assert "jobs_due" in text and "Seq Scan on jobs" not in text, text
            raise _Rollback
    except _Rollback:
        pass
    finally:
        await conn.close()


class _Rollback(Exception):
    pass


async def test_a_forged_runs_cursor_beyond_any_run_id_is_refused(store: PostgresStore) -> None:
    """Regression: an 8-byte cursor above int64 reached PostgreSQL and answered 500."""
    o = owner()
    job, _ = await store.create_job(o, one_off(now() + timedelta(hours=1)))
    with pytest.raises(InvalidRequest) as err:
        await store.list_runs(o, uuid.UUID(job.id), limit=10, cursor="__________8")
    assert err.value.code == "invalid_cursor"


async def test_concurrent_creates_are_coalesced_and_every_one_lands(store: PostgresStore) -> None:
    o = owner()
    jobs = await asyncio.gather(
        *(store.create_job(o, one_off(now() + timedelta(hours=1))) for _ in range(300))
    )
    ids = {j.id for j, created in jobs if created}
    assert len(ids) == 300
    listed: set[str] = set()
    cursor = None
    while True:
        page = await store.list_jobs(o, state=None, limit=1000, cursor=cursor)
        listed.update(j.id for j in page.items)
        if not (cursor := page.next_cursor):
            break
    assert listed == ids
    fetched = await store.get_job(o, uuid.UUID(next(iter(ids))))
    assert fetched.spec.target.headers == {"X-Secret": "s3cret"}  # type: ignore[union-attr]
