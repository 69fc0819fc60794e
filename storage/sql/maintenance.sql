-- The janitor (storage/postgres/maintenance.py).
-- Loaded by name by storage/queries.py; names are unique across storage/sql/*.sql.

-- name: expired_leases
-- The janitor's batch: leases that lapsed on one shard, from the lease index, skipping rows
-- someone else is already finishing. A claimed row's lease is leased_until; a running row's is
-- run_until (migration 0010: the fence and the heartbeats set it, and no index reads it, so they
-- are HOT updates). A running row keeps the leased_until of its claim (its due time, or in a
-- burst the time the fencer was expected to reach it, plus a lease), which is the index key:
-- the row is found once that has passed, and taken only if run_until has passed too. A run in
-- flight is therefore rescued when the later of the two lapses: its run's lease, or, where the
-- fencer reached it sooner than its claim expected, its claim's (docs/guarantees.md, "Leases").
SELECT job_id FROM jobs
WHERE shard = $1 AND phase <> 'idle' AND leased_until < now()
  AND (run_until IS NULL OR run_until < now())  -- a claimed row has none: going idle clears it
ORDER BY leased_until
LIMIT $2
FOR UPDATE SKIP LOCKED;

-- name: carry_run_leases
-- Runs that outlive their claim's lease (a slow target, heartbeats keeping run_until ahead):
-- their leased_until, the lease index's key, is moved up to run_until, so expired_leases, which
-- walks that index from its oldest key, does not walk past the same live runs on every pass. One
-- write per such run per lease period, by the janitor before expired_leases; the heartbeats
-- themselves stay HOT. Rows locked elsewhere (a completion, a heartbeat) are left to the next pass.
WITH live AS (
    SELECT job_id FROM jobs
    WHERE shard = $1 AND leased_until < now() AND phase = 'running' AND run_until >= now()
    ORDER BY leased_until
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j SET leased_until = j.run_until
FROM live
WHERE j.job_id = live.job_id;

-- name: running_of_engine
-- On an engine's restart, the runs it had in flight. A run a worker took (DUETIME_RUN_QUEUE=nats)
-- keeps its publisher in claimed_by and is the worker's (taken_by, migration 0012): not this one.
SELECT job_id FROM jobs
WHERE claimed_by = $1 AND phase = 'running' AND shard = ANY($2::smallint[]) AND taken_by IS NULL;

-- name: db_now
-- The database's clock at this instant (clock_timestamp, not the transaction's start): a clock sample.
SELECT clock_timestamp();

-- name: purge_idempotency_keys
DELETE FROM idempotency_keys WHERE created_at < now() - make_interval(secs => $1);

-- name: overlap_due
-- overlap=allow: rows whose run is in flight (or waits for a retry) while their next occurrence
-- comes due within the horizon. Locked so two engines never hand the same occurrence out twice.
SELECT job_id, shard, owner, spec, split_at, next_run_at FROM jobs
WHERE shard = $1 AND split_at IS NOT NULL AND (phase = 'running' OR attempt > 0)
  AND split_at <= now() + make_interval(secs => $2)
  AND state = 'scheduled' AND run_kind = 'scheduled' AND parent_id IS NULL
ORDER BY split_at
LIMIT $3
FOR UPDATE SKIP LOCKED;

-- name: mark_split
UPDATE jobs j SET handed_upto = u.handed_upto, split_at = u.split_at
FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[]) AS u(job_id, handed_upto, split_at)
WHERE j.job_id = u.job_id;

-- name: release_stalled_backfills
-- The janitor's safety net for the statement above (it runs after a commit, so a crash can lose
-- it): a job whose backfilled runs all wait, none on its way, gets its next one released.
UPDATE jobs j SET next_run_at = now()
FROM (
    SELECT DISTINCT ON (w.parent_id) w.job_id FROM jobs w
    WHERE w.shard = $1 AND w.parent_id IS NOT NULL AND w.next_run_at IS NULL AND w.state = 'scheduled'
      AND NOT EXISTS (SELECT 1 FROM jobs a WHERE a.parent_id = w.parent_id AND a.next_run_at IS NOT NULL)
    ORDER BY w.parent_id, w.backfill_seq
) nxt
WHERE j.job_id = nxt.job_id
RETURNING j.job_id;

-- name: complete_drained_jobs_of_shard
-- The same, by the janitor per shard (from the due index: idle, scheduled, no next run), for a
-- statement above lost to a crash.
UPDATE jobs p SET state = 'completed', updated_at = now()
WHERE p.shard = $1 AND p.state = 'scheduled' AND p.next_run_at IS NULL
  AND p.claimed_by IS NULL AND p.phase = 'idle' AND p.parent_id IS NULL AND p.spec->'schedule' ?| array['cron', 'every']
  AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = p.job_id)
RETURNING p.job_id;
