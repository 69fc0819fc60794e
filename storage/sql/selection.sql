-- Jobs selected by label or name prefix (0006): the filtered list and bulk actions.
-- One pair of the selector ($2 = $3) drives: a range scan of job_labels' primary key (owner,
-- key, value, job_id) in job id order, so a page reads about as many rows as it lists; the job
-- row must carry every pair ($5, containment), be a job (not an occurrence row) and pass the
-- other filters.

-- name: list_jobs_by_labels
SELECT j.* FROM job_labels l JOIN jobs j ON j.job_id = l.job_id
WHERE l.owner = $1 AND l.key = $2 AND l.value = $3 AND l.job_id > $4
  AND j.owner = $1 AND j.parent_id IS NULL AND j.spec->'labels' @> $5::jsonb
  AND ($6::text IS NULL OR j.state = $6)
  AND ($7::text IS NULL OR starts_with(j.spec->>'name', $7))
ORDER BY l.job_id
LIMIT $8;

-- name: list_jobs_by_name_prefix
-- In job id order, as list_jobs: one range of jobs_owner_state per state ($4, when given, leaves
-- the others out with a test on the parameter alone), merged; the name is read from each row.
SELECT * FROM (
    (SELECT * FROM jobs WHERE owner = $1 AND state = 'scheduled' AND ($4::text IS NULL OR $4 = 'scheduled')
       AND job_id > $3 AND parent_id IS NULL AND starts_with(spec->>'name', $2)
     ORDER BY job_id LIMIT $5)
    UNION ALL
    (SELECT * FROM jobs WHERE owner = $1 AND state = 'paused' AND ($4::text IS NULL OR $4 = 'paused')
       AND job_id > $3 AND parent_id IS NULL AND starts_with(spec->>'name', $2)
     ORDER BY job_id LIMIT $5)
    UNION ALL
    (SELECT * FROM jobs WHERE owner = $1 AND state = 'completed' AND ($4::text IS NULL OR $4 = 'completed')
       AND job_id > $3 AND parent_id IS NULL AND starts_with(spec->>'name', $2)
     ORDER BY job_id LIMIT $5)
    UNION ALL
    (SELECT * FROM jobs WHERE owner = $1 AND state = 'cancelled' AND ($4::text IS NULL OR $4 = 'cancelled')
       AND job_id > $3 AND parent_id IS NULL AND starts_with(spec->>'name', $2)
     ORDER BY job_id LIMIT $5)
    UNION ALL
    (SELECT * FROM jobs WHERE owner = $1 AND state = 'dead' AND ($4::text IS NULL OR $4 = 'dead')
       AND job_id > $3 AND parent_id IS NULL AND starts_with(spec->>'name', $2)
     ORDER BY job_id LIMIT $5)
) j
ORDER BY job_id
LIMIT $5;

-- name: bulk_candidates
-- The jobs a bulk action would change: carrying every label, in a state the action applies to.
SELECT l.job_id FROM job_labels l JOIN jobs j ON j.job_id = l.job_id
WHERE l.owner = $1 AND l.key = $2 AND l.value = $3
  AND j.owner = $1 AND j.parent_id IS NULL AND j.spec->'labels' @> $4::jsonb AND j.state = ANY($5::text[])
ORDER BY l.job_id
LIMIT $6;

-- name: lock_jobs_of_owner
-- A bulk batch under lock, in job id order (as lock_for_completion locks), so two batches that
-- overlap, or a batch and a completion, never wait on each other in a cycle.
SELECT * FROM jobs
WHERE job_id = ANY($1::uuid[]) AND owner = $2 AND parent_id IS NULL
ORDER BY job_id
FOR UPDATE;

-- name: lock_families_of_owner
-- A bulk batch's jobs and their occurrence rows under lock together, in job id order, before any
-- of them is written. Locking the batch's jobs first and their occurrence rows later held a later
-- job's row while waiting for an earlier job's occurrence row, which an engine's fence (locking in
-- id order) could hold while it waited for that later job: a deadlock, answered 409. It runs twice,
-- as lock_family does: occurrence rows that a backfill we waited for inserted are not in the first
-- statement's snapshot; once the jobs are held nobody can insert more.
SELECT count(*) FROM (
    SELECT job_id FROM jobs
    WHERE owner = $2
      AND ((job_id = ANY($1::uuid[]) AND parent_id IS NULL) OR parent_id = ANY($1::uuid[]))
    ORDER BY job_id
    FOR UPDATE
) family;

-- name: bulk_write_state
-- What pause ($4 revoke: true), resume (false) and cancel (true) write for each row, as
-- write_job does for one: the new state, a cancel's next run and triggers cleared, the
-- overlap split point recomputed, and a claimed row's lease given back when revoking. A pause
-- keeps what it says ($6 note, $7 until, $8 the key's id; 0020), a resume or cancel clears it.
UPDATE jobs j SET
    paused_at = CASE WHEN $2 = 'paused' THEN now() END,
    pause_note = CASE WHEN $2 = 'paused' THEN $6::text END,
    paused_until = CASE WHEN $2 = 'paused' THEN $7::timestamptz END,
    paused_by = CASE WHEN $2 = 'paused' THEN 'owner' END,
    paused_key_id = CASE WHEN $2 = 'paused' THEN $8::text END,
    state = $2,
    next_run_at = CASE WHEN $2 = 'cancelled' THEN NULL ELSE j.next_run_at END,
    pending_triggers = CASE WHEN $2 = 'cancelled' THEN '{}'::timestamptz[] ELSE j.pending_triggers END,
    split_at = u.split_at,
    -- A resume starts the failure count over, as write_job's does.
    consecutive_failures = CASE WHEN j.state = 'paused' AND $2 = 'scheduled' THEN 0
                                ELSE j.consecutive_failures END,
    phase = CASE WHEN $4::bool AND phase = 'claimed' THEN 'idle' ELSE phase END,
    claimed_by = CASE WHEN $4::bool AND phase = 'claimed' THEN NULL ELSE j.claimed_by END,
    leased_until = CASE WHEN $4::bool AND phase = 'claimed' THEN NULL ELSE j.leased_until END,
    updated_at = now()
FROM unnest($1::uuid[], $3::timestamptz[]) AS u(job_id, split_at)
WHERE j.job_id = u.job_id AND j.owner = $5 AND j.job_id = ANY($1::uuid[]);

-- name: bulk_cascade_state
-- cascade_state for a batch of jobs: their occurrence rows follow, a claimed one gives its lease back.
UPDATE jobs SET
    state = $2,
    phase = CASE WHEN phase = 'claimed' THEN 'idle' ELSE phase END,
    claimed_by = CASE WHEN phase = 'claimed' THEN NULL ELSE claimed_by END,
    leased_until = CASE WHEN phase = 'claimed' THEN NULL ELSE leased_until END,
    updated_at = now()
WHERE parent_id = ANY($1::uuid[]) AND state <> 'cancelled';

-- name: bulk_drop_idle_occurrences
DELETE FROM jobs WHERE parent_id = ANY($1::uuid[]) AND phase = 'idle';

-- name: label_pair_count
-- How many of the owner's jobs carry one pair, counted up to $4 (an index-only range of
-- job_labels): a selector of several pairs is driven by its rarest one.
SELECT count(*) FROM (
    SELECT 1 FROM job_labels WHERE owner = $1 AND key = $2 AND value = $3 LIMIT $4
) s;
