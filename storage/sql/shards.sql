-- Moving a logical shard between databases (storage/postgres/shards.py).
-- Loaded by name by storage/queries.py; names are unique across storage/sql/*.sql.

-- name: shard_rows
-- Moving a logical shard: how many rows it has, and how many are in the run path right now.
SELECT count(*) AS total, count(*) FILTER (WHERE phase <> 'idle') AS busy FROM jobs WHERE shard = $1;

-- name: shard_runs_count
SELECT count(*) FROM runs WHERE shard = $1;

-- name: lock_for_shard_move
-- Writes wait while a shard is copied away (reads go on): the copy is the shard as it is.
LOCK TABLE jobs, runs, idempotency_keys, job_changes, pause_ends IN EXCLUSIVE MODE;

-- name: copy_out_jobs
SELECT * FROM jobs WHERE shard = $1;

-- name: copy_out_runs
-- The target numbers the history anew (run ids are per database); the order is kept.
SELECT job_id, shard, scheduled_for, attempt, started_at, finished_at, outcome, status_code, error,
       lateness_ms, fencing_token, spec_version
FROM runs WHERE shard = $1 ORDER BY run_id;

-- name: copy_out_changes
-- The jobs' change history (0018) goes with them, numbers and all.
SELECT job_id, seq, shard, at, actor, key_id, action, reason, spec_version, diff
FROM job_changes WHERE shard = $1;

-- name: copy_out_idempotency_keys
SELECT k.owner, k.key, k.body_hash, k.job_id, k.created_at
FROM idempotency_keys k JOIN jobs j ON j.job_id = k.job_id WHERE j.shard = $1;

-- name: delete_shard_idempotency_keys
DELETE FROM idempotency_keys k USING jobs j WHERE j.job_id = k.job_id AND j.shard = $1;

-- name: copy_out_pause_ends
-- The ends of the jobs' pauses (0020) go with them.
SELECT shard, until, job_id FROM pause_ends WHERE shard = $1;

-- name: delete_shard_pause_ends
DELETE FROM pause_ends WHERE shard = $1;

-- name: delete_shard_changes
DELETE FROM job_changes WHERE shard = $1;

-- name: delete_shard_runs
DELETE FROM runs WHERE shard = $1;

-- name: delete_shard_jobs
DELETE FROM jobs WHERE shard = $1;

-- name: shard_idempotency_keys_count
-- `shards move --dry-run`: how many Idempotency-Key records would move with the shard's jobs.
SELECT count(*) FROM idempotency_keys k JOIN jobs j ON j.job_id = k.job_id WHERE j.shard = $1;

-- name: has_schema
-- A dry run does not migrate the target: one without the tables holds no rows of any shard.
SELECT to_regclass('jobs') IS NOT NULL AND to_regclass('runs') IS NOT NULL;
