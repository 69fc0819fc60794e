"""The RunStore port's contract (what the engine and workers rely on), for every store: leases
and their tokens, exclusive claims, the fence, fenced completion that rejects stale tokens, the
janitor, the NATS run queue's leases, and the wake-up of a shard's engines."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from duetime.core.errors import Conflict, InvalidRequest
from duetime.core.ids import shard_of
from duetime.core.model import JobState, Outcome, Overlap, RetryPolicy
from duetime.core.runpath import Verdict
from duetime.storage.memory import MemoryStore
from duetime.storage.ports import (
    AttemptReport,
    Claim,
    FencedRun,
    Lease,
    PublishedRun,
    Skip,
)
from tests.contract.conftest import Store, cron, engine_id, new_owner, now, one_off

SOON = timedelta(seconds=1)


async def claim(
    store: Store, engine: str, ids: Iterable[uuid.UUID], *, lease_s: float = 30.0
) -> dict[uuid.UUID, Claim]:
    """Claim on the shards of ``ids``; the rows of ``ids`` that this claim got."""
    wanted = set(ids)
    out: dict[uuid.UUID, Claim] = {}
    for shard in sorted({shard_of(i) for i in wanted}):
        rows = await store.claim_due(shard, engine, lookahead_s=60, lease_s=lease_s, limit=500)
        out.update((r.job_id, r) for r in rows if r.job_id in wanted)
    return out


async def fence(store: Store, rows: Iterable[Claim], *, lease_s: float = 30.0) -> list[FencedRun]:
    return await store.fence_runs(list(rows), lease_s=lease_s)


def lease(r: Claim | FencedRun) -> Lease:
    return Lease(r.job_id, r.shard, r.lease_token)


def report(run: FencedRun, outcome: Outcome, *, retryable: bool = False) -> AttemptReport:
    t = now()
    verdict = Verdict(outcome, retryable, 200 if outcome is Outcome.SUCCEEDED else 500)
    return AttemptReport(run, verdict, started_at=t, finished_at=t)


async def due_job(store: Store, owner: str, **kw: object) -> uuid.UUID:
    job, _ = await store.create_job(owner, one_off(now() + SOON, **kw))
    return uuid.UUID(job.id)


@pytest.mark.parametrize(
    "occurrence",
    [
        datetime(2026, 12, 3, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(2999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(9998, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
    ],
)
async def test_the_fence_keeps_the_occurrence_it_is_given_to_the_microsecond(
    store: Store, occurrence: datetime
) -> None:
    """The fence records the occurrence its item names (a misfire's run_once moves it), exactly:
    the PostgreSQL fence sends it as µs since the epoch and turns it back in the statement."""
    o, e = new_owner(), engine_id()
    jid = await due_job(store, o)
    row = (await claim(store, e, [jid]))[jid]
    [run] = await fence(store, [replace(row, scheduled_for=occurrence)])
    assert run.scheduled_for == occurrence  # the row as the fence wrote it (RETURNING)


async def test_claim_fence_complete_a_one_off(store: Store) -> None:
    o, e = new_owner(), engine_id()
    jid = await due_job(store, o)
    claimed = await claim(store, e, [jid])
    row = claimed[jid]
    assert row.attempt == 0 and row.run_kind == "scheduled" and row.owner == o and row.misfire_spec is None
    assert row.lease_token >= 1 and row.due_at == row.scheduled_for
    assert await claim(store, engine_id(), [jid]) == {}, "a claimed row is not claimed again"
    [run] = await fence(store, [row])
    assert (run.job_id, run.owner, run.attempt, run.lease_token) == (jid, o, 1, row.lease_token)
    assert run.spec.parsed.target.url == "https://example.com/hook" and run.parent_id is None  # type: ignore[union-attr]
    assert run.public_id == jid
    assert await fence(store, [row]) == [], "a run passes the fence once"
    stats = await store.complete_runs([report(run, Outcome.SUCCEEDED)])
    assert (stats.applied, stats.stale, stats.history) == (1, 0, 1)
    job = await store.get_job(o, jid)
    assert job.state is JobState.COMPLETED and job.next_run_at is None
    assert job.last_run is not None and job.last_run.outcome is Outcome.SUCCEEDED
    runs = await store.list_runs(o, jid, limit=10, cursor=None)
    assert [(r.attempt, r.outcome, r.status_code) for r in runs.items] == [(1, Outcome.SUCCEEDED, 200)]
    assert runs.items[0].lateness_ms is not None


async def test_a_fenced_run_never_called_is_given_back_unused(store: Store) -> None:
    """A worker that stops while runs wait for a host that backs off gives them back: the row is
    claimable at once, the same occurrence with its attempt unused, and no history is written."""
    o, e = new_owner(), engine_id()
    jid = await due_job(store, o)
    row = (await claim(store, e, [jid]))[jid]
    [run] = await fence(store, [row])
    assert await store.return_unstarted([lease(run)]) == 1
    assert await store.return_unstarted([lease(run)]) == 0, "given back once"
    assert (await store.complete_runs([report(run, Outcome.SUCCEEDED)])).applied == 0, "its token is stale"
    again = (await claim(store, engine_id(), [jid]))[jid]
    assert again.lease_token > run.lease_token, "a new lease: the old token is fenced out"
    assert (again.scheduled_for, again.attempt, again.run_kind) == (row.scheduled_for, 0, "scheduled")
    assert (await store.list_runs(o, jid, limit=10, cursor=None)).items == [], "no attempt recorded"
    [rerun] = await fence(store, [again])
    assert rerun.attempt == 1


async def test_only_a_run_running_under_the_callers_fence_is_given_back(store: Store) -> None:
    """A claimed row (not fenced), another lease's token and an ended run are not touched."""
    o, e = new_owner(), engine_id()
    jid = await due_job(store, o)
    row = (await claim(store, e, [jid]))[jid]
    assert await store.return_unstarted([lease(row)]) == 0, "claimed, not fenced: release_claims' job"
    [run] = await fence(store, [row])
    assert await store.return_unstarted([replace(lease(run), lease_token=run.lease_token + 1)]) == 0
    stats = await store.complete_runs([report(run, Outcome.SUCCEEDED)])
    assert stats.applied == 1, "still running under its own token until then"
    assert await store.return_unstarted([lease(run)]) == 0, "an ended run is not given back"


async def test_a_run_given_back_after_an_owners_edit_follows_the_new_plan(store: Store) -> None:
    """An edit while the run waited wrote its plan onto the row; given back, the row is that
    plan, not the occurrence that was fenced."""
    o, e = new_owner(), engine_id()
    jid = await due_job(store, o)
    [run] = await fence(store, (await claim(store, e, [jid])).values())
    later = now() + timedelta(hours=1)
    await store.update_job(o, jid, one_off(later))
    assert await store.return_unstarted([lease(run)]) == 1
    assert await claim(store, engine_id(), [jid]) == {}, "not due until the new time"
    job = await store.get_job(o, jid)
    assert job.next_run_at == later and job.state is JobState.SCHEDULED


async def test_claims_are_exclusive_between_concurrent_claimers(store: Store) -> None:
    o = new_owner()
    ids = [await due_job(store, o) for _ in range(12)]
    engines = [engine_id() for _ in range(3)]
    got = await asyncio.gather(*(claim(store, e, ids) for e in engines))
    claimed = [i for rows in got for i in rows]
    assert sorted(claimed) == sorted(ids), "every due row claimed, none twice"


async def test_the_claim_leaves_rows_not_due_and_paused_jobs(store: Store) -> None:
    o, e = new_owner(), engine_id()
    later, _ = await store.create_job(o, one_off(now() + timedelta(hours=1)))
    paused = await due_job(store, o)
    await store.pause_job(o, paused)
    assert await claim(store, e, [uuid.UUID(later.id), paused]) == {}
    await store.resume_job(o, paused)
    assert set(await claim(store, e, [paused])) == {paused}


async def test_every_lease_gets_a_larger_token_and_an_old_token_is_fenced_out(store: Store) -> None:
    o, e = new_owner(), engine_id()
    jid = await due_job(store, o)
    first = (await claim(store, e, [jid]))[jid]
    assert await store.release_claims([lease(first)]) == 1
    assert await store.release_claims([lease(first)]) == 0, "released once"
    second = (await claim(store, e, [jid]))[jid]
    assert second.lease_token > first.lease_token
    [retaken] = [r for r in await store.retake_claims(e, [second.shard], lease_s=30) if r.job_id == jid]
    assert retaken.lease_token > second.lease_token
    assert await fence(store, [second]) == [], "the token before the retake is stale"
    assert await store.extend_leases([lease(second)], lease_s=30) == set()
    assert [r.job_id for r in await fence(store, [retaken])] == [jid]


async def test_owner_actions_revoke_a_claim_before_the_fence(store: Store) -> None:
    o, e = new_owner(), engine_id()
    paused, cancelled = await due_job(store, o), await due_job(store, o)
    claimed = await claim(store, e, [paused, cancelled])
    await store.pause_job(o, paused)
    await store.cancel_job(o, cancelled)
    assert await fence(store, claimed.values()) == []


async def test_a_stale_completion_changes_nothing(store: Store) -> None:
    o, e = new_owner(), engine_id()
    jid = await due_job(store, o)
    [run] = await fence(store, (await claim(store, e, [jid])).values())
    forged = report(replace(run, lease_token=run.lease_token + 7), Outcome.SUCCEEDED)
    stats = await store.complete_runs([forged])
    assert (stats.applied, stats.stale, stats.history) == (0, 1, 0)
    assert (await store.get_job(o, jid)).state is JobState.SCHEDULED
    assert (await store.list_runs(o, jid, limit=10, cursor=None)).items == []
    assert await store.extend_leases([lease(run)], lease_s=30) == {jid}, "the real lease still holds"
    done = await store.complete_runs([report(run, Outcome.SUCCEEDED), report(run, Outcome.FAILED)])
    assert (done.applied, done.stale) == (1, 1), "one outcome per lease"
    assert await store.extend_leases([lease(run)], lease_s=30) == set(), "a finished run holds no lease"


async def test_a_failure_is_retried_by_policy_then_dead_then_replayed(store: Store) -> None:
    o, e = new_owner(), engine_id()
    retry = RetryPolicy(max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.01)
    jid = await due_job(store, o, retry=retry)
    [run] = await fence(store, (await claim(store, e, [jid])).values())
    await store.complete_runs([report(run, Outcome.FAILED, retryable=True)])
    job = await store.get_job(o, jid)
    assert job.state is JobState.SCHEDULED and job.attempt == 1
    await asyncio.sleep(0.05)
    [again] = await fence(store, (await claim(store, e, [jid])).values())
    assert again.attempt == 2 and again.scheduled_for == run.scheduled_for
    await store.complete_runs([report(again, Outcome.FAILED, retryable=True)])
    assert (await store.get_job(o, jid)).state is JobState.DEAD
    replayed = await store.replay_job(o, jid)
    assert replayed.state is JobState.SCHEDULED and replayed.attempt == 0
    history = (await store.list_runs(o, jid, limit=10, cursor=None)).items
    assert [(r.attempt, r.outcome) for r in history] == [(2, Outcome.FAILED), (1, Outcome.FAILED)]
    page = await store.list_runs(o, jid, limit=1, cursor=None)
    assert page.next_cursor is not None
    rest = await store.list_runs(o, jid, limit=1, cursor=page.next_cursor)
    assert [r.attempt for r in page.items + rest.items] == [2, 1] and rest.next_cursor is None


async def test_a_recurring_job_moves_to_its_next_occurrence(store: Store) -> None:
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("* * * * * *", overlap=Overlap.SKIP))
    jid = uuid.UUID(job.id)
    [run] = await fence(store, (await claim(store, e, [jid])).values())
    await store.complete_runs([report(run, Outcome.SUCCEEDED)])
    after = await store.get_job(o, jid)
    assert after.state is JobState.SCHEDULED and after.next_run_at is not None
    assert after.next_run_at > run.scheduled_for and after.attempt == 0


async def _rescued(store: Store, owner: str, jid: uuid.UUID) -> bool:
    """One janitor round on the job's shard (other tests' rows may share it): whether the job's
    run was recorded as lease_expired by now."""
    await store.rescue_expired(shard_of(jid), limit=500)
    runs = (await store.list_runs(owner, jid, limit=10, cursor=None)).items
    assert all(r.outcome is Outcome.LEASE_EXPIRED and r.attempt == 1 for r in runs), runs
    return bool(runs)


async def test_a_run_lives_by_its_own_lease_once_its_claims_has_lapsed(store: Store) -> None:
    """A running row's lease is the one its fence set and its heartbeats extend, kept apart from
    its claim's (migration 0010: the fence and the heartbeats then write no index entry): a run
    whose claim's lease has lapsed is left alone while its own holds, a heartbeat keeps it past
    the fence's lease, and once that lapses too the janitor records it as lease_expired."""
    o, e = new_owner(), engine_id()
    jid = await due_job(store, o)
    await asyncio.sleep(SOON.total_seconds())  # due: the claim's lease runs from now
    claimed = await claim(store, e, [jid], lease_s=0.2)
    [run] = await fence(store, [claimed[jid]], lease_s=1.0)
    await asyncio.sleep(0.5)
    assert not await _rescued(store, o, jid), "the claim's lease lapsed; the run's holds"
    assert await store.extend_leases([lease(run)], lease_s=2.0) == {jid}
    await asyncio.sleep(1.0)
    assert not await _rescued(store, o, jid), "past the fence's lease, inside the heartbeat's"
    await asyncio.sleep(1.5)  # no more heartbeats: the run's lease lapses
    assert await _rescued(store, o, jid)


async def test_a_run_is_rescued_when_the_later_of_its_leases_lapses(store: Store) -> None:
    """The other side of keeping the run's lease apart: the janitor finds rows by their claim's
    lease (the lease index's key), so a run fenced well before its claim expected (a burst's claim
    lasts until the fencer was expected to reach it) is rescued when that lapses, not sooner.
    Documented in docs/guarantees.md ("Leases"); the fake keeps the same rule."""
    o, e = new_owner(), engine_id()
    jid = await due_job(store, o)
    await asyncio.sleep(SOON.total_seconds())
    claimed = await claim(store, e, [jid], lease_s=2.0)
    await fence(store, [claimed[jid]], lease_s=0.2)
    await asyncio.sleep(0.6)
    assert not await _rescued(store, o, jid), "the run's lease lapsed, its claim's holds"
    await asyncio.sleep(2.0)
    assert await _rescued(store, o, jid)


async def test_the_janitor_releases_lapsed_claims_and_expires_lapsed_runs(store: Store) -> None:
    o, e = new_owner(), engine_id()
    waiting, calling = await due_job(store, o), await due_job(store, o)
    # The lease of a claim runs from its due time: claim rows that are due already.
    await asyncio.sleep(SOON.total_seconds())
    claimed = await claim(store, e, [waiting, calling], lease_s=0.2)
    [run] = await fence(store, [claimed[calling]], lease_s=0.2)
    await asyncio.sleep(0.5)
    rescued = 0
    for shard in {shard_of(waiting), shard_of(calling)}:
        rescued += (await store.rescue_expired(shard, limit=500)).applied
    assert rescued >= 2
    assert (await store.list_runs(o, waiting, limit=10, cursor=None)).items == [], "a claim is no attempt"
    [lapsed] = (await store.list_runs(o, calling, limit=10, cursor=None)).items
    assert (lapsed.outcome, lapsed.attempt, lapsed.started_at) == (Outcome.LEASE_EXPIRED, 1, None)
    stale = await store.complete_runs([report(run, Outcome.SUCCEEDED)])
    assert stale.stale == 1, "the outcome that arrives after the janitor is rejected"
    assert (await store.get_job(o, calling)).attempt == 1
    again = await claim(store, e, [waiting])
    assert again[waiting].lease_token > claimed[waiting].lease_token


async def test_a_restarted_engine_expires_what_it_had_in_flight(store: Store) -> None:
    o, e = new_owner(), engine_id()
    jid = await due_job(store, o)
    [run] = await fence(store, (await claim(store, e, [jid])).values())
    stats = await store.expire_running_of(e, [run.shard])
    assert stats.applied == 1 and stats.history == 1
    [lapsed] = (await store.list_runs(o, jid, limit=10, cursor=None)).items
    assert lapsed.outcome is Outcome.LEASE_EXPIRED
    assert (await store.expire_running_of(e, [run.shard])).applied == 0


async def test_heartbeats_extend_held_leases_and_waiting_claims(store: Store) -> None:
    o, e = new_owner(), engine_id()
    a, b = await due_job(store, o), await due_job(store, o)
    claimed = await claim(store, e, [a, b], lease_s=1)
    [run] = await fence(store, [claimed[a]])
    assert await store.extend_leases([lease(run), lease(claimed[b])], lease_s=30) == {a, b}
    kept = await store.keep_waiting_claims(claimed[b].shard, e, within_s=3600, extend_s=600, limit=5000)
    assert kept >= 1
    assert await store.keep_waiting_claims(claimed[b].shard, e, within_s=1, extend_s=600, limit=5000) == 0


async def test_missed_occurrences_are_skipped_under_the_claim(store: Store) -> None:
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("0 * * * *"))
    jid = uuid.UUID(job.id)
    assert job.next_run_at is not None
    await store.trigger_job(o, jid)  # due now: the claim takes it
    row = (await claim(store, e, [jid]))[jid]
    missed = Skip(jid, row.shard, row.lease_token, (row.scheduled_for,), job.next_run_at.astimezone(UTC))
    stats = await store.skip_missed([missed])
    assert (stats.applied, stats.history) == (1, 1)
    assert (await store.skip_missed([missed])).stale == 1, "the claim is gone: a second skip is stale"
    [skipped] = (await store.list_runs(o, jid, limit=10, cursor=None)).items
    assert skipped.outcome is Outcome.SKIPPED and skipped.attempt == 0
    assert (await store.get_job(o, jid)).next_run_at == job.next_run_at


async def test_a_catch_up_hands_its_backlog_to_rows_of_their_own(store: Store) -> None:
    """overlap=allow: every backlog occurrence is due at once, each in a row of its own; the job's
    row moves on to its next occurrence under the same write."""
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("0 * * * *"))
    jid = uuid.UUID(job.id)
    assert job.next_run_at is not None
    await store.trigger_job(o, jid)
    row = (await claim(store, e, [jid]))[jid]
    base = now().replace(microsecond=0)
    backlog = tuple(base - timedelta(seconds=s) for s in (3, 2, 1))
    item = Skip(jid, row.shard, row.lease_token, (), job.next_run_at, catch_up=backlog)
    assert (await store.skip_missed([item])).applied == 1
    got = [
        r for r in await store.claim_due(row.shard, e, lookahead_s=0, lease_s=30, limit=500) if r.owner == o
    ]
    assert sorted(r.scheduled_for for r in got) == list(backlog)
    assert all(r.misfire_spec is None for r in got), "occurrence rows are never judged again"
    runs = await fence(store, got)
    assert {r.public_id for r in runs} == {jid}
    await store.complete_runs([report(r, Outcome.SUCCEEDED) for r in runs])
    history = (await store.list_runs(o, jid, limit=10, cursor=None)).items
    assert sorted(r.scheduled_for for r in history) == list(backlog)
    assert (await store.get_job(o, jid)).next_run_at == job.next_run_at


async def test_a_chained_catch_up_goes_back_to_back(store: Store) -> None:
    """overlap=skip/buffer_one: one backlog row at a time, the next released when it ends."""
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("0 * * * *", overlap=Overlap.SKIP))
    jid = uuid.UUID(job.id)
    assert job.next_run_at is not None
    await store.trigger_job(o, jid)
    row = (await claim(store, e, [jid]))[jid]
    base = now().replace(microsecond=0)
    backlog = tuple(base - timedelta(seconds=s) for s in (3, 2, 1))
    item = Skip(jid, row.shard, row.lease_token, (), job.next_run_at, catch_up=backlog, chained=True)
    assert (await store.skip_missed([item])).applied == 1
    seen = []
    for _ in backlog:
        got = [
            r
            for r in await store.claim_due(row.shard, e, lookahead_s=0, lease_s=30, limit=500)
            if r.owner == o
        ]
        assert len(got) == 1, "one at a time"
        seen.append(got[0].scheduled_for)
        [run] = await fence(store, got)
        await store.complete_runs([report(run, Outcome.SUCCEEDED)])
    assert seen == list(backlog), "oldest first"
    assert [
        r for r in await store.claim_due(row.shard, e, lookahead_s=0, lease_s=30, limit=500) if r.owner == o
    ] == []


async def test_a_failed_occurrence_is_replayed_in_a_row_of_its_own(store: Store) -> None:
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("0 * * * *"))
    jid = uuid.UUID(job.id)
    await store.trigger_job(o, jid)  # a run due now, failing for good (not retried)
    [run] = await fence(store, (await claim(store, e, [jid])).values())
    await store.complete_runs([report(run, Outcome.FAILED, retryable=False)])
    with pytest.raises(Conflict) as caught:
        await store.replay_occurrence(o, jid, run.scheduled_for + timedelta(seconds=1))
    assert caught.value.code == "occurrence_not_failed"
    replayed = await store.replay_occurrence(o, jid, run.scheduled_for)
    assert replayed.id == job.id
    due_now = await store.claim_due(run.shard, e, lookahead_s=0, lease_s=30, limit=500)
    [again] = await fence(store, [r for r in due_now if r.owner == o])
    assert (again.public_id, again.scheduled_for) == (jid, run.scheduled_for)
    await store.complete_runs([report(again, Outcome.SUCCEEDED)])
    with pytest.raises(Conflict) as caught:
        await store.replay_occurrence(o, jid, run.scheduled_for)  # it succeeded now
    assert caught.value.code == "occurrence_not_failed"
    one_off_id = await due_job(store, o)
    with pytest.raises(InvalidRequest):
        await store.replay_occurrence(o, one_off_id, now())


async def test_an_owners_runs_across_jobs_newest_first(store: Store) -> None:
    o, other, e = new_owner(), new_owner(), engine_id()
    ids = [await due_job(store, o) for _ in range(3)] + [await due_job(store, other)]
    await asyncio.sleep(1.1)
    claimed = await claim(store, e, ids)
    runs = await fence(store, claimed.values())
    by_id = {r.job_id: r for r in runs}
    outcomes = [Outcome.SUCCEEDED, Outcome.FAILED, Outcome.FAILED, Outcome.FAILED]
    for job_id, outcome in zip(ids, outcomes, strict=True):
        await store.complete_runs([report(by_id[job_id], outcome)])  # one after another: ordered
    page = await store.list_owner_runs(o, outcome=None, since=None, limit=10, cursor=None)
    assert [r.job_id for r in page.items] == list(reversed(ids[:3])), "newest first, only the owner's"
    assert page.next_cursor is None
    failed = await store.list_owner_runs(o, outcome="failed", since=None, limit=10, cursor=None)
    assert [r.job_id for r in failed.items] == [ids[2], ids[1]]
    assert all(r.run.outcome is Outcome.FAILED for r in failed.items)
    later = await store.list_owner_runs(
        o, outcome=None, since=now() + timedelta(seconds=5), limit=10, cursor=None
    )
    assert later.items == []
    seen, cursor = [], None
    while True:
        one = await store.list_owner_runs(o, outcome=None, since=None, limit=1, cursor=cursor)
        seen += [r.job_id for r in one.items]
        cursor = one.next_cursor
        if cursor is None:
            break
    assert seen == list(reversed(ids[:3])), "following next_cursor lists each run once"


async def test_the_nats_queue_leases_pass_from_engine_to_one_worker(store: Store) -> None:
    o, e = new_owner(), engine_id()
    taken_id, left_id = await due_job(store, o), await due_job(store, o)
    fenced = {r.job_id: r for r in await fence(store, (await claim(store, e, [taken_id, left_id])).values())}
    assert await store.extend_published([lease(r) for r in fenced.values()], holder=e, lease_s=30) == {
        taken_id,
        left_id,
    }
    t = fenced[taken_id]
    message = PublishedRun(t.job_id, t.shard, t.lease_token, e)
    forged = PublishedRun(t.job_id, t.shard, t.lease_token, "someone-else")
    assert await store.take_runs([forged], holder="w1", lease_s=30) == set()
    assert await store.take_runs([message], holder="w1", lease_s=30) == {lease(t)}
    assert await store.take_runs([message], holder="w2", lease_s=30) == set(), "taken once"
    assert await store.extend_published([lease(t)], holder=e, lease_s=30) == set()
    assert await store.extend_leases([lease(t)], lease_s=30) == {taken_id}
    shards = sorted({r.shard for r in fenced.values()})
    assert await store.expire_published_of(e, shards) == 1
    [lapsed] = (await store.list_runs(o, left_id, limit=10, cursor=None)).items
    assert lapsed.outcome is Outcome.LEASE_EXPIRED
    # The engine's own restart step (expire_running_of, after expire_published_of) leaves the run
    # a worker took to that worker, which then records its outcome.
    assert (await store.expire_running_of(e, shards)).applied == 0
    assert (await store.list_runs(o, taken_id, limit=10, cursor=None)).items == []
    assert (await store.complete_runs([report(t, Outcome.SUCCEEDED)])).applied == 1
    [done] = (await store.list_runs(o, taken_id, limit=10, cursor=None)).items
    assert (done.outcome, done.attempt) == (Outcome.SUCCEEDED, t.attempt)


async def running_with_occurrences(
    store: Store, owner: str, engine: str, jid: uuid.UUID
) -> tuple[FencedRun, list[Claim]]:
    """``jid`` (an every-second cron, overlap=allow) fenced and running past its next occurrence:
    the split hands those occurrences to rows of their own, claimed here by ``engine``."""
    [run] = await fence(store, (await claim(store, engine, [jid])).values())
    await asyncio.sleep(1.1)
    assert await store.split_overlapping(run.shard, horizon_s=5) >= 1
    occurrences = [
        r
        for r in await store.claim_due(run.shard, engine, lookahead_s=60, lease_s=30, limit=500)
        if r.owner == owner and r.job_id != jid
    ]
    return run, occurrences


async def test_overlap_allow_hands_the_next_occurrence_to_a_row_of_its_own(store: Store) -> None:
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("* * * * * *"))  # overlap=allow is the default
    jid = uuid.UUID(job.id)
    run, occurrences = await running_with_occurrences(store, o, e, jid)
    assert occurrences and all(r.scheduled_for > run.scheduled_for for r in occurrences)
    [occ] = await fence(store, occurrences[:1])
    assert occ.parent_id == jid and occ.public_id == jid
    await store.complete_runs([report(occ, Outcome.SUCCEEDED)])
    history = (await store.list_runs(o, jid, limit=10, cursor=None)).items
    assert [r.scheduled_for for r in history] == [occ.scheduled_for], "history goes under the job"
    assert (await store.get_job(o, jid)).last_run is not None


# ---------------------------------------------------------------------- an owner's edit racing a death

RETRY_AT_ONCE = RetryPolicy(max_attempts=5, backoff_initial_s=0.01, backoff_max_s=0.01)
EXPIRIES = ("restart", "nats_restart", "janitor")


def hours_ahead(hours: int = 3) -> str:
    """A daily cron whose first occurrence is a couple of hours from now."""
    at = now() + timedelta(hours=hours)
    return f"{at.minute} {at.hour} * * *"


async def attempt_in_flight(
    store: Store, owner: str, engine: str, *, lease_s: float = 30.0, name: str | None = None
) -> tuple[uuid.UUID, FencedRun]:
    """An every-second cron (overlap skip) whose second attempt of an occurrence is in flight: the
    first failed, so what the fence fenced is not what a new schedule writes (attempt 0)."""
    spec = cron("* * * * * *", overlap=Overlap.SKIP, retry=RETRY_AT_ONCE, name=name)
    job, _ = await store.create_job(owner, spec)
    jid = uuid.UUID(job.id)
    [first] = await fence(store, (await claim(store, engine, [jid])).values())
    await store.complete_runs([report(first, Outcome.FAILED, retryable=True)])
    await asyncio.sleep(0.05)  # the retry's backoff
    [run] = await fence(store, (await claim(store, engine, [jid], lease_s=lease_s)).values(), lease_s=lease_s)
    assert (run.scheduled_for, run.attempt) == (first.scheduled_for, 2)
    return jid, run


async def expire(store: Store, engine: str, run: FencedRun, how: str) -> None:
    """The run's holder is gone: its engine restarts (in-process workers, or the NATS run queue
    with the run published and not taken), or its lease lapses and the janitor comes."""
    if how == "restart":
        assert (await store.expire_running_of(engine, [run.shard])).applied == 1
    elif how == "nats_restart":
        assert await store.expire_published_of(engine, [run.shard]) == 1
    else:
        await asyncio.sleep(0.7)  # past the run's lease (0.3 s) and its claim's
        assert (await store.rescue_expired(run.shard, limit=500)).applied >= 1


async def lapsed_as_fenced(store: Store, owner: str, jid: uuid.UUID, run: FencedRun) -> None:
    """The history's newest row is the fenced attempt, finished as lease_expired."""
    lapsed = (await store.list_runs(owner, jid, limit=10, cursor=None)).items[0]
    assert (lapsed.scheduled_for, lapsed.attempt, lapsed.outcome, lapsed.started_at) == (
        run.scheduled_for,
        run.attempt,
        Outcome.LEASE_EXPIRED,
        None,
    ), lapsed


@pytest.mark.parametrize("how", EXPIRIES)
@pytest.mark.parametrize("edit", ["patch", "put"])
async def test_a_new_schedule_racing_a_death_keeps_the_fenced_attempt_and_the_owners_plan(
    store: Store, edit: str, how: str
) -> None:
    """Issue 27, observation 3: a PATCH (or PUT by name) replaces the schedule of a job whose call
    is in flight, and the call's holder dies. The lapsed attempt is recorded for the occurrence
    and attempt that were fenced (not for the new schedule's first occurrence, which never ran),
    and the owner's new plan stands: nothing of it is due before its first occurrence."""
    o, e = new_owner(), engine_id()
    name = "edited-" + o
    jid, run = await attempt_in_flight(store, o, e, lease_s=0.3 if how == "janitor" else 30.0, name=name)
    new_spec = cron(hours_ahead(), overlap=Overlap.SKIP, retry=RETRY_AT_ONCE, name=name)
    if edit == "patch":
        edited = await store.update_job(o, jid, new_spec)
    else:
        edited, created = await store.apply_job(o, new_spec, expected_id=str(jid))
        assert not created and edited.id == str(jid)
    first = edited.next_run_at
    assert first is not None and first > now() + timedelta(hours=1)
    await expire(store, e, run, how)
    await lapsed_as_fenced(store, o, jid, run)
    history = (await store.list_runs(o, jid, limit=10, cursor=None)).items
    assert [(r.scheduled_for, r.attempt, r.outcome) for r in history] == [
        (run.scheduled_for, 2, Outcome.LEASE_EXPIRED),
        (run.scheduled_for, 1, Outcome.FAILED),
    ], "the new schedule's occurrence has no history: it never ran"
    after = await store.get_job(o, jid)
    assert (after.state, after.next_run_at, after.attempt) == (JobState.SCHEDULED, first, 0)
    assert after.spec.schedule == new_spec.schedule
    assert await claim(store, engine_id(), [jid]) == {}, "nothing is due before the new first occurrence"


@pytest.mark.parametrize("how", EXPIRIES)
@pytest.mark.parametrize("action", ["pause", "cancel"])
async def test_a_pause_or_cancel_racing_a_death_records_the_fenced_attempt(
    store: Store, action: str, how: str
) -> None:
    """A pause or cancel lands while the call is in flight and its holder dies: the job stays
    paused (its lapsed attempt retried only once resumed) or cancelled, and the history has the
    attempt that was fenced."""
    o, e = new_owner(), engine_id()
    jid, run = await attempt_in_flight(store, o, e, lease_s=0.3 if how == "janitor" else 30.0)
    if action == "pause":
        await store.pause_job(o, jid)
    else:
        await store.cancel_job(o, jid)
    await expire(store, e, run, how)
    await lapsed_as_fenced(store, o, jid, run)
    after = await store.get_job(o, jid)
    if action == "pause":
        assert (after.state, after.attempt) == (JobState.PAUSED, 2), "the retry waits for a resume"
        await store.resume_job(o, jid)
        [retried] = await fence(store, (await claim(store, e, [jid])).values())
        assert (retried.scheduled_for, retried.attempt) == (run.scheduled_for, 3)
    else:
        assert (after.state, after.next_run_at) == (JobState.CANCELLED, None)
        assert await claim(store, e, [jid]) == {}


async def test_a_new_schedule_racing_the_death_of_a_triggered_run(store: Store) -> None:
    """A manual run (a trigger) is in flight when the schedule is replaced (which makes the row's
    run kind "scheduled" again): its lapse is recorded for the trigger's instant."""
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("0 * * * *", retry=RETRY_AT_ONCE))
    jid = uuid.UUID(job.id)
    await store.trigger_job(o, jid)
    [run] = await fence(store, (await claim(store, e, [jid])).values())
    assert (run.run_kind, run.attempt) == ("manual", 1)
    edited = await store.update_job(o, jid, cron(hours_ahead(), retry=RETRY_AT_ONCE))
    await expire(store, e, run, "restart")
    await lapsed_as_fenced(store, o, jid, run)
    after = await store.get_job(o, jid)
    assert (after.next_run_at, after.attempt) == (edited.next_run_at, 0)
    assert await claim(store, e, [jid]) == {}


async def test_a_new_schedule_racing_the_death_of_overlapping_runs(store: Store) -> None:
    """overlap=allow: the job's own row and an occurrence row it handed out are both in flight when
    the schedule is replaced and their engine dies. Each lapse is recorded for its own occurrence
    under the job's id; the job's row takes the new plan; the occurrence row, a run of the old
    schedule that had started, is retried by policy, as a failed report of it would be (an
    occurrence row's schedule is its own: the new schedule writes nothing onto it)."""
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("* * * * * *"))
    jid = uuid.UUID(job.id)
    run, occurrences = await running_with_occurrences(store, o, e, jid)
    [occ] = await fence(store, occurrences[:1])
    edited = await store.update_job(o, jid, cron(hours_ahead()))
    assert (await store.expire_running_of(e, [run.shard])).applied == 2
    history = (await store.list_runs(o, jid, limit=10, cursor=None)).items
    assert sorted((r.scheduled_for, r.attempt, r.outcome) for r in history) == [
        (run.scheduled_for, 1, Outcome.LEASE_EXPIRED),
        (occ.scheduled_for, 1, Outcome.LEASE_EXPIRED),
    ]
    assert (await store.get_job(o, jid)).next_run_at == edited.next_run_at
    due = [
        r for r in await store.claim_due(run.shard, e, lookahead_s=60, lease_s=30, limit=500) if r.owner == o
    ]
    assert [(r.job_id, r.scheduled_for, r.attempt) for r in due] == [(occ.job_id, occ.scheduled_for, 1)], (
        "only the started occurrence's retry; the ones not started were withdrawn with the schedule"
    )


async def test_engines_of_a_shard_are_woken_when_a_row_becomes_due(store: Store) -> None:
    woken: asyncio.Queue[int] = asyncio.Queue()
    shards = list(range(16))
    listener = await store.listen_due(shards, woken.put_nowait)
    try:
        jid = await due_job(store, new_owner())
        deadline = asyncio.get_running_loop().time() + 5
        seen: set[int] = set()
        while shard_of(jid) not in seen:
            seen.add(await asyncio.wait_for(woken.get(), deadline - asyncio.get_running_loop().time()))
    finally:
        await listener.close()


async def test_the_store_clock_is_the_lease_clock(store: Store) -> None:
    before = now()
    at = await store.db_now(0)
    assert before - timedelta(seconds=5) <= at <= now() + timedelta(seconds=5)
    await store.purge_idempotency_keys(3600)
    for shard in (0, 15):
        assert await store.complete_drained_jobs(shard) >= 0
        assert await store.release_stalled_backfills(shard) >= 0


# ---------------------------------------------------------------------- the fake's own clock


class Clock:
    def __init__(self) -> None:
        self.t = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.t


async def test_the_memory_store_lapses_leases_by_its_injected_clock() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, one_off(clock.t + timedelta(seconds=120)))
    jid = uuid.UUID(job.id)
    assert await claim(store, e, [jid]) == {}, "due beyond the lookahead of the claim"
    clock.t += timedelta(seconds=120)
    [run] = await fence(store, (await claim(store, e, [jid], lease_s=30)).values())
    clock.t += timedelta(seconds=29)
    assert (await store.rescue_expired(run.shard, limit=10)).applied == 0, "the lease still holds"
    clock.t += timedelta(seconds=2)
    assert (await store.rescue_expired(run.shard, limit=10)).applied == 1
    [lapsed] = (await store.list_runs(o, jid, limit=10, cursor=None)).items
    assert lapsed.outcome is Outcome.LEASE_EXPIRED and lapsed.finished_at == clock.t


async def test_replays_wait_in_the_jobs_line_under_skip_and_are_capped(store: Store) -> None:
    """Issue 32, item 1: 1,105 replays of one failed occurrence of an ``overlap: skip`` job all
    ran at once. Replays now follow the job's overlap as backfilled runs do (one at a time, each
    released when the one before it ends) and at most ``max_pending`` wait."""
    o, e = new_owner(), engine_id()
    job, _ = await store.create_job(o, cron("0 * * * *", overlap=Overlap.SKIP))
    jid = uuid.UUID(job.id)
    await store.trigger_job(o, jid)
    [run] = await fence(store, (await claim(store, e, [jid])).values())
    await store.complete_runs([report(run, Outcome.FAILED, retryable=False)])
    for _ in range(3):
        await store.replay_occurrence(o, jid, run.scheduled_for, max_pending=3)
    with pytest.raises(Conflict) as caught:
        await store.replay_occurrence(o, jid, run.scheduled_for, max_pending=3)
    assert caught.value.code == "too_many_replays"
    for _ in range(3):
        got = [
            r
            for r in await store.claim_due(run.shard, e, lookahead_s=0, lease_s=30, limit=500)
            if r.owner == o
        ]
        assert len(got) == 1, "one replay at a time, as the job's overlap says"
        [again] = await fence(store, got)
        assert again.scheduled_for == run.scheduled_for
        await store.complete_runs([report(again, Outcome.FAILED, retryable=False)])
    assert [
        r for r in await store.claim_due(run.shard, e, lookahead_s=0, lease_s=30, limit=500) if r.owner == o
    ] == []
    # the line is empty again: a replay is taken once more
    await store.replay_occurrence(o, jid, run.scheduled_for, max_pending=3)
