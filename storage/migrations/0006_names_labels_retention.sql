-- Owners at scale (issue 12): unique names, labels, and what retention deletes by.
--
-- Names and labels live in the spec (spec->>'name', spec->'labels'), as every other field an
-- owner sets does: the codec, the PATCH merge, occurrence rows and shard moves carry them with no
-- new column to keep in step. The indexes below are on those expressions.

-- 1. Existing duplicate names. Until now a name was a free label, so an owner may have several
-- jobs (not cancelled) of one name. The oldest of each group (created_at, then id) keeps the
-- name; every other one is renamed to "<name>:dup-<its job id>" (the name cut to 159 characters
-- so the result stays within 200): nothing is lost, the renamed jobs still run, and the owner
-- can find them with name_prefix and rename or cancel them. Occurrence rows carry a copy of
-- their job's spec and are renamed with it. Names that do not fit the new grammar (spaces,
-- other scripts) are left as they are: they stay readable, and the next PATCH or PUT of such a
-- job has to give it a valid name.
WITH ranked AS (
    SELECT job_id,
           row_number() OVER (PARTITION BY owner, spec->>'name' ORDER BY created_at, job_id) AS n
    FROM jobs
    WHERE parent_id IS NULL AND state <> 'cancelled' AND spec->>'name' IS NOT NULL
), renamed AS (
    UPDATE jobs j
    SET spec = jsonb_set(j.spec, '{name}',
                         to_jsonb(left(j.spec->>'name', 159) || ':dup-' || j.job_id::text)),
        updated_at = now()
    FROM ranked r
    WHERE j.job_id = r.job_id AND r.n > 1
    RETURNING j.job_id, j.spec->'name' AS name
)
UPDATE jobs c SET spec = jsonb_set(c.spec, '{name}', renamed.name)
FROM renamed WHERE c.parent_id = renamed.job_id;

-- 2. A name is unique per owner among jobs that are not cancelled. Within one database this
-- index is the guarantee; across databases (DUETIME_SHARD_DSNS) the store takes a lock per
-- (owner, name) on the home database around the check and the write (docs/architecture.md).
-- It also serves GET /v1/jobs/by-name/{name}.
CREATE UNIQUE INDEX jobs_owner_name ON jobs (owner, (spec->>'name'))
    WHERE parent_id IS NULL AND state <> 'cancelled' AND spec->>'name' IS NOT NULL;

-- 3. Labels: "jobs carrying every given label" is containment (spec->'labels' @> '{"k":"v"}'),
-- which a GIN index with jsonb_path_ops answers (one hashed entry per key/value pair, the
-- smallest GIN opclass for @>). The list pages by job id; see docs/performance.md for when the
-- planner reads this index and when it walks jobs_owner instead.
CREATE INDEX jobs_labels ON jobs USING gin ((spec->'labels') jsonb_path_ops) WHERE parent_id IS NULL;

-- 4. Retention. Finished jobs by the time they last changed (a finished job changes no more, so
-- updated_at is when it finished); only these rows, so the index stays small and is never
-- written on the run path (a row enters it once, when it finishes).
CREATE INDEX jobs_finished ON jobs (updated_at)
    WHERE parent_id IS NULL AND state IN ('completed', 'cancelled', 'dead');
-- A deleted job's Idempotency-Keys go with it.
CREATE INDEX idempotency_keys_job ON idempotency_keys (job_id);
-- Run history is deleted oldest first in run_id order (the primary key; ids grow with time), so
-- it needs no index of its own and the run path writes no extra index entry per attempt.
