-- Change history (migration 0018): the records of changes to jobs, written in the transaction of
-- the change, and read newest first (storage/postgres/changes.py, core/changes.py).
-- Loaded by name by storage/queries.py; names are unique across storage/sql/*.sql.

-- name: record_changes
-- One change record for each of the jobs $1, all made by one call or one batch of Duetime's own
-- (an owner's single-job action, a bulk batch's jobs, the jobs a completion paused, the pauses
-- that ended), each with its reason $5: numbered after the job's last record, at the job's
-- spec_revision as this transaction wrote it. Every writer holds the jobs' rows locked (owner
-- actions, bulk batches, the completion, end_pauses), so no other writer of a job's history runs
-- in between and max(seq) + 1 is the next number; one statement for the batch, each number an
-- index probe of the primary key. The one place that numbers records (a create's is 1).
INSERT INTO job_changes (job_id, seq, shard, actor, key_id, action, reason, spec_version, diff)
SELECT j.job_id,
       COALESCE((SELECT max(c.seq) FROM job_changes c WHERE c.job_id = j.job_id), 0) + 1,
       j.shard, $2, $3, $4, u.reason, j.spec_revision, $6::jsonb
FROM unnest($1::uuid[], $5::text[]) AS u(job_id, reason)
JOIN jobs j ON j.job_id = u.job_id AND j.parent_id IS NULL;

-- name: list_changes
-- A page of one job's records, newest first, before the record $2 (a cursor; the first page
-- starts before the largest integer).
SELECT seq, at, actor, key_id, action, reason, spec_version, diff FROM job_changes
WHERE job_id = $1 AND seq < $2
ORDER BY seq DESC
LIMIT $3;
