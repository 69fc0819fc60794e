-- Change history (migration 0018): the records of changes to jobs, written in the transaction of
-- the change, and read newest first (storage/postgres/changes.py, core/changes.py).
-- Loaded by name by storage/queries.py; names are unique across storage/sql/*.sql.

-- name: record_changes
-- One change record for each of the jobs $1, all made by one call (a single job's action, or a
-- bulk batch's jobs): numbered after the job's last record, at the job's spec_revision as this
-- transaction wrote it. The caller holds every job's row locked, so no other writer of a job's
-- history runs in between and max(seq) + 1 is the next number; one statement for the batch, each
-- number an index probe of the primary key.
INSERT INTO job_changes (job_id, seq, shard, actor, key_id, action, reason, spec_version, diff)
SELECT j.job_id,
       COALESCE((SELECT max(c.seq) FROM job_changes c WHERE c.job_id = j.job_id), 0) + 1,
       j.shard, $2, $3, $4, $5, j.spec_revision, $6::jsonb
FROM jobs j
WHERE j.job_id = ANY($1::uuid[]) AND j.parent_id IS NULL;

-- name: list_changes
-- A page of one job's records, newest first, before the record $2 (a cursor; the first page
-- starts before the largest integer).
SELECT seq, at, actor, key_id, action, reason, spec_version, diff FROM job_changes
WHERE job_id = $1 AND seq < $2
ORDER BY seq DESC
LIMIT $3;
