-- Pauses that end by themselves (migration 0020; storage/postgres/pauses.py): a job paused with
-- an "until" is resumed by the engine serving its shard once that time has come, as an owner's
-- resume would resume it, with its auto_resume change record.
-- Loaded by name by storage/queries.py; names are unique across storage/sql/*.sql.

-- name: insert_pause_ends
-- The pauses of the jobs $2 (of shard $1's database, each on its own shard $3) end at $4: one
-- wake-up each. In the pause's transaction.
INSERT INTO pause_ends (shard, until, job_id)
SELECT s, $1::timestamptz, j FROM unnest($2::uuid[], $3::smallint[]) AS u(j, s)
ON CONFLICT DO NOTHING;

-- name: pauses_ended
-- The wake-ups of shard $1 that are due, oldest first (a range of pause_ends' primary key).
SELECT job_id, until FROM pause_ends
WHERE shard = $1 AND until <= now()
ORDER BY until
LIMIT $2;

-- name: lock_families
-- The jobs $1 and their occurrence rows under lock together, in job id order, before any of them
-- is written: lock_families_of_owner's order (see there), for jobs of any owner. Run twice, as
-- that one is.
SELECT count(*) FROM (
    SELECT job_id FROM jobs
    WHERE (job_id = ANY($1::uuid[]) AND parent_id IS NULL) OR parent_id = ANY($1::uuid[])
    ORDER BY job_id
    FOR UPDATE
) family;

-- name: lock_ended_pauses
-- The jobs under lock, with whether their pause has ended by the database's clock.
SELECT *, (state = 'paused' AND paused_until <= now()) AS ended FROM jobs
WHERE job_id = ANY($1::uuid[]) AND parent_id IS NULL
ORDER BY job_id
FOR UPDATE;

-- name: end_pauses
-- Resume the jobs $1 as bulk_write_state resumes (the state, the overlap split point $2, the
-- failure count started over, the pause's fields cleared; next_run_at is left overdue for the
-- claim to apply the misfire policy). Only jobs still paused whose pause ended: a resume or a new
-- pause that landed first wins. Answers the ids it resumed, for their auto_resume records
-- (record_changes, in the same transaction).
UPDATE jobs j SET
    state = 'scheduled',
    split_at = u.split_at,
    consecutive_failures = 0,
    paused_at = NULL, pause_note = NULL, paused_until = NULL, paused_by = NULL, paused_key_id = NULL,
    updated_at = now()
FROM unnest($1::uuid[], $2::timestamptz[]) AS u(job_id, split_at)
WHERE j.job_id = u.job_id AND j.state = 'paused' AND j.paused_until <= now()
RETURNING j.job_id;

-- name: delete_pause_ends
-- The wake-ups this look has dealt with (the job resumed, or no longer paused until then).
DELETE FROM pause_ends p
USING unnest($2::uuid[], $3::timestamptz[]) AS u(job_id, until)
WHERE p.shard = $1 AND p.until = u.until AND p.job_id = u.job_id;
