-- Retention (0006): what the maintenance service deletes, in small batches, each its own short
-- transaction. Nothing here touches a row the run path holds: finished jobs are idle by
-- definition, and locked ones are skipped.

-- name: retention_lock
-- One maintenance service per database at a time (several engines may run one each): the first to
-- take this in a batch's transaction does the batch; the others skip the round.
SELECT pg_try_advisory_xact_lock($1::int, $2::int);

-- name: retention_lock_held
-- The same lock for a whole batch of finished jobs, which spans several transactions (their
-- history goes in statements of its own): held by the session until retention_unlock. Session
-- and transaction advisory locks on one key exclude each other across sessions.
SELECT pg_try_advisory_lock($1::int, $2::int);

-- name: retention_unlock
SELECT pg_advisory_unlock($1::int, $2::int);

-- name: retention_old_runs
-- The oldest history rows by run_id after $3 (ids grow with time, so the primary key is the age
-- order and no index on finished_at is written per attempt), those of them that finished before
-- $1. Walks at most $2 rows of the index, from $3 on: a round's batches pass on the last id each
-- one walked, so the next does not walk again past the entries its predecessors deleted (dead
-- until VACUUM). Answers how many went and the last id walked (null: nothing after $3).
WITH head AS (SELECT run_id FROM runs WHERE run_id > $3 ORDER BY run_id LIMIT $2),
gone AS (
    DELETE FROM runs r USING head
    WHERE r.run_id = head.run_id AND coalesce(r.finished_at, r.scheduled_for) < $1
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT max(run_id) FROM head) AS walked;

-- name: retention_finished_jobs
-- Jobs finished (completed, cancelled, dead) before $1, oldest first, from jobs_finished; none
-- with a run of an occurrence row still in flight. Not locked: their history goes first, in
-- batches of its own, and retention_lock_finished checks them again under lock at the end.
SELECT j.job_id FROM jobs j
WHERE j.parent_id IS NULL AND j.state IN ('completed', 'cancelled', 'dead') AND j.updated_at < $1
  AND j.phase = 'idle'
  AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = j.job_id AND c.phase IN ('claimed', 'running'))
ORDER BY j.updated_at
LIMIT $2;

-- name: retention_lock_finished
-- The same jobs under lock, those still finished and old (a dead one may have been replayed),
-- skipping any a request holds right now (the next round takes it).
SELECT j.job_id FROM jobs j
WHERE j.job_id = ANY($2::uuid[])
  AND j.parent_id IS NULL AND j.state IN ('completed', 'cancelled', 'dead') AND j.updated_at < $1
  AND j.phase = 'idle'
  AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = j.job_id AND c.phase IN ('claimed', 'running'))
FOR UPDATE OF j SKIP LOCKED;

-- name: retention_all_runs_of_jobs
DELETE FROM runs WHERE job_id = ANY($1::uuid[]);

-- name: retention_runs_of_jobs
-- A finished job's history, at most $2 rows per statement (a cancelled every-second cron may
-- have millions); run before its job row goes, in batches of their own.
DELETE FROM runs WHERE run_id IN (
    SELECT run_id FROM runs WHERE job_id = ANY($1::uuid[]) LIMIT $2
);

-- name: retention_changes_of_jobs
-- A job's change history lives as long as the job (migration 0018).
DELETE FROM job_changes WHERE job_id = ANY($1::uuid[]);

-- name: retention_keys_of_jobs
DELETE FROM idempotency_keys WHERE job_id = ANY($1::uuid[]);

-- name: retention_occurrences_of_jobs
DELETE FROM jobs WHERE parent_id = ANY($1::uuid[]);

-- name: retention_delete_jobs
DELETE FROM jobs WHERE job_id = ANY($1::uuid[]) AND parent_id IS NULL;
