-- Bulk loading for benchmarks (storage/bulk.py): never on the request path.

-- name: bulk_triggers_off
-- For the rest of this transaction only, jobs' triggers do not fire (superuser only): the loader
-- writes the job_labels rows itself, from the labels it generated, in one COPY per chunk. Other
-- connections keep their triggers.
SET LOCAL session_replication_role = replica;

-- name: bulk_label_rows_differ
-- How many job_labels rows of the jobs $1 differ from the rows the label trigger
-- (duetime_job_labels_added, migration 0006) makes from the same jobs: rows it would make that
-- are missing, plus rows present that it would not make. 0 means the loader wrote exactly the
-- trigger's rows. job_labels has no index by job alone, so "present" is looked up under the
-- (owner, key, value) the jobs carry, an index range each; a row under a pair none of them
-- carries is not seen here (compare the table's count for that).
WITH want AS (
    SELECT j.owner, e.key, e.value, j.job_id
    FROM jobs j, jsonb_each_text(j.spec->'labels') e
    WHERE j.job_id = ANY($1::uuid[]) AND j.parent_id IS NULL AND jsonb_typeof(j.spec->'labels') = 'object'
), have AS (
    SELECT l.owner, l.key, l.value, l.job_id
    FROM (SELECT DISTINCT owner, key, value FROM want) p
    JOIN job_labels l ON l.owner = p.owner AND l.key = p.key AND l.value = p.value
    WHERE l.job_id = ANY($1::uuid[])
)
SELECT (SELECT count(*) FROM (SELECT * FROM want EXCEPT SELECT * FROM have) missing)
     + (SELECT count(*) FROM (SELECT * FROM have EXCEPT SELECT * FROM want) extra);


-- name: bulk_job_triggers
-- The triggers on jobs (not the internal ones of constraints): a load with triggers off must know
-- every one it skips.
SELECT tgname FROM pg_trigger WHERE tgrelid = 'jobs'::regclass AND NOT tgisinternal ORDER BY tgname;

-- name: bulk_vacuum_jobs
VACUUM (ANALYZE) jobs;

-- name: bulk_vacuum_job_labels
VACUUM (ANALYZE) job_labels;

-- name: bulk_run_id_range
-- The history's run ids so far: a seeded range is read right after its COPY.
SELECT coalesce(min(run_id), 0) AS first, coalesce(max(run_id), 0) AS last FROM runs;

-- name: bulk_first_run_id
-- Where the oldest-first deletes of retention have got to (an index probe, cheap enough to poll
-- during a burst; a count of a multi-million range is not).
SELECT min(run_id) FROM runs;

-- name: bulk_finished_jobs_before
-- Finished jobs retention would delete at the cut-off $1 (from jobs_finished).
SELECT count(*) FROM jobs
WHERE parent_id IS NULL AND state IN ('completed', 'cancelled', 'dead') AND updated_at < $1;

-- name: bulk_vacuum_runs
VACUUM (ANALYZE) runs;

-- name: bulk_checkpoint
-- After a load of millions of rows: its dirty pages written now, not by a checkpoint spread over
-- the measurement that follows (superuser only).
CHECKPOINT;
