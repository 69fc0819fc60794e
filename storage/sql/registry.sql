-- What the API's registry runs (storage/postgres/registry.py): jobs, owner actions, backfill,
-- run history, owners, API keys and idempotency keys.
-- Loaded by name by storage/queries.py; names are unique across storage/sql/*.sql.

-- name: insert_job
-- A create, with its change record (seq 1, spec_version 1: migration 0018) in the same statement.
-- $11 key id, $12 reason, $13 the diff (the whole spec, secrets redacted: core/changes.py).
WITH created AS (
    INSERT INTO jobs (job_id, shard, owner, spec, state, next_run_at, scheduled_for, attempt, created_at,
                      updated_at, split_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10)
    RETURNING *
), recorded AS (
    INSERT INTO job_changes (job_id, seq, shard, at, actor, key_id, action, reason, spec_version, diff)
    SELECT job_id, 1, shard, created_at, 'owner', $11, 'create', $12, 1, $13 FROM created
)
SELECT * FROM created;

-- name: insert_jobs
-- Many creates in one statement: concurrent POSTs on one database are coalesced by the store.
-- Each with its change record, as insert_job: $11 key ids, $12 reasons, $13 diffs.
WITH created AS (
    INSERT INTO jobs (job_id, shard, owner, spec, state, next_run_at, scheduled_for, attempt, created_at,
                      updated_at, split_at)
    SELECT j, s, o, sp, st, n, sf, a, c, c, sa
    FROM unnest($1::uuid[], $2::smallint[], $3::text[], $4::jsonb[], $5::text[], $6::timestamptz[],
                $7::timestamptz[], $8::int[], $9::timestamptz[], $10::timestamptz[])
         AS u(j, s, o, sp, st, n, sf, a, c, sa)
)
INSERT INTO job_changes (job_id, seq, shard, at, actor, key_id, action, reason, spec_version, diff)
SELECT j, 1, s, c, 'owner', k, 'create', r, 1, d
FROM unnest($1::uuid[], $2::smallint[], $9::timestamptz[], $11::text[], $12::text[], $13::jsonb[])
     AS u(j, s, c, k, r, d);

-- name: insert_idempotency_key
INSERT INTO idempotency_keys (owner, key, body_hash, job_id)
VALUES ($1, $2, $3, $4)
ON CONFLICT (owner, key) DO NOTHING
RETURNING job_id;

-- name: get_idempotency_key
SELECT body_hash, job_id FROM idempotency_keys WHERE owner = $1 AND key = $2;

-- Occurrence rows (parent_id set, migration 0003) are internal: no owner-facing statement
-- returns, lists or counts them.

-- name: get_job
SELECT * FROM jobs WHERE job_id = $1 AND owner = $2 AND parent_id IS NULL;

-- name: lock_family
-- An owner action locks the job's row and its occurrence rows together, in job id order, before
-- it touches any of them: the order fence_runs, lock_for_completion, take_runs and the heartbeats
-- lock in. Locking the job's row first and its occurrence rows later (cascade_state, cascade_spec)
-- while an engine's batch held an occurrence row and waited for the job's row was a deadlock.
-- It runs twice (lock_job repeats it): occurrence rows inserted by a transaction this one waited
-- for (a backfill) are not in the first statement's snapshot; once the job's row is held nobody
-- can insert more, so the second statement locks them all, still in id order.
SELECT count(*) FROM (
    SELECT job_id FROM jobs
    WHERE owner = $2 AND (job_id = $1 OR parent_id = $1)
    ORDER BY job_id
    FOR UPDATE
) family;

-- name: lock_job
WITH family AS (
    SELECT job_id FROM jobs
    WHERE owner = $2 AND (job_id = $1 OR parent_id = $1)
    ORDER BY job_id
    FOR UPDATE
)
SELECT j.* FROM jobs j
WHERE j.job_id = $1 AND j.owner = $2 AND j.parent_id IS NULL
  AND (SELECT count(*) FROM family) > 0;

-- name: list_jobs
-- Every state, in job id order: the merge of one range of jobs_owner_state per state (a Merge
-- Append of five index scans, each read only as far as the page needs; tests/database/
-- test_owner_lists.py holds the plan). There is no (owner, job_id) index: every run's claim and
-- completion wrote an entry into it (migration 0011). The states are core.model.JobState's.
SELECT * FROM (
    (SELECT * FROM jobs WHERE owner = $1 AND state = 'scheduled' AND job_id > $2 AND parent_id IS NULL
     ORDER BY job_id LIMIT $3)
    UNION ALL
    (SELECT * FROM jobs WHERE owner = $1 AND state = 'paused' AND job_id > $2 AND parent_id IS NULL
     ORDER BY job_id LIMIT $3)
    UNION ALL
    (SELECT * FROM jobs WHERE owner = $1 AND state = 'completed' AND job_id > $2 AND parent_id IS NULL
     ORDER BY job_id LIMIT $3)
    UNION ALL
    (SELECT * FROM jobs WHERE owner = $1 AND state = 'cancelled' AND job_id > $2 AND parent_id IS NULL
     ORDER BY job_id LIMIT $3)
    UNION ALL
    (SELECT * FROM jobs WHERE owner = $1 AND state = 'dead' AND job_id > $2 AND parent_id IS NULL
     ORDER BY job_id LIMIT $3)
) j
ORDER BY job_id
LIMIT $3;

-- name: list_jobs_by_state
SELECT * FROM jobs
WHERE owner = $1 AND state = $2 AND job_id > $3 AND parent_id IS NULL
ORDER BY job_id
LIMIT $4;

-- name: write_job
-- One owner action's result: the lifecycle, the plan, and (when revoke) the lease given back.
-- $15: the spec's version as the API shows it (spec_revision, 0018). $16..$18: what a pause says
-- (note, until, the key's id; 0020), kept while the job stays paused and cleared when it leaves
-- paused (a PATCH of a paused job keeps them, a resume or cancel clears them).
UPDATE jobs SET
    paused_at = CASE WHEN $5 <> 'paused' THEN NULL WHEN state = 'paused' THEN paused_at ELSE now() END,
    pause_note = CASE WHEN $5 <> 'paused' THEN NULL WHEN state = 'paused' THEN pause_note ELSE $16 END,
    paused_until = CASE WHEN $5 <> 'paused' THEN NULL WHEN state = 'paused' THEN paused_until ELSE $17 END,
    paused_by = CASE WHEN $5 <> 'paused' THEN NULL WHEN state = 'paused' THEN paused_by ELSE 'owner' END,
    paused_key_id = CASE WHEN $5 <> 'paused' THEN NULL WHEN state = 'paused' THEN paused_key_id ELSE $18 END,
    spec = $3, spec_version = $4, spec_revision = $15, state = $5, next_run_at = $6, scheduled_for = $7,
    attempt = $8, run_kind = $9, resume_at = $10, pending_triggers = $11,
    split_at = $13, handed_upto = $14,
    -- A resume (paused -> scheduled) starts the failure count over (pause_after_failures).
    consecutive_failures = CASE WHEN state = 'paused' AND $5 = 'scheduled' THEN 0
                                ELSE consecutive_failures END,
    phase = CASE WHEN $12::bool AND phase = 'claimed' THEN 'idle' ELSE phase END,
    claimed_by = CASE WHEN $12::bool AND phase = 'claimed' THEN NULL ELSE claimed_by END,
    leased_until = CASE WHEN $12::bool AND phase = 'claimed' THEN NULL ELSE leased_until END,
    updated_at = now()
WHERE job_id = $1 AND owner = $2
RETURNING *;

-- name: count_active_jobs
SELECT count(*) FROM jobs WHERE owner = $1 AND state IN ('scheduled', 'paused') AND parent_id IS NULL;

-- name: active_job_bytes
-- pg_column_size reads a TOASTed spec's stored (compressed) size from its pointer, without
-- fetching or decompressing the value: the sum costs a pass over the owner's rows, not their data.
SELECT COALESCE(sum(pg_column_size(spec)), 0)::bigint FROM jobs
WHERE owner = $1 AND state IN ('scheduled', 'paused') AND parent_id IS NULL;

-- name: job_exists
SELECT 1 FROM jobs WHERE job_id = $1 AND owner = $2 AND parent_id IS NULL;

-- name: final_outcome_of_occurrence
-- The outcome of an occurrence's last attempt (replay of one occurrence takes only a failed one).
SELECT outcome FROM runs WHERE job_id = $1 AND scheduled_for = $2 AND attempt > 0
ORDER BY attempt DESC, run_id DESC LIMIT 1;

-- name: list_owner_runs
-- GET /v1/runs: an owner's runs across jobs, newest first, one database's share; the caller
-- merges the databases by the same key. Runs are written under the job's (parent's) id.
SELECT r.*, r.job_id AS public_job_id FROM runs r
JOIN jobs j ON j.job_id = r.job_id
WHERE j.owner = $1 AND j.parent_id IS NULL
  AND ($2::text IS NULL OR r.outcome = $2)
  AND ($3::timestamptz IS NULL OR r.finished_at >= $3)
  AND ($4::timestamptz IS NULL OR (r.finished_at, r.job_id, r.run_id) < ($4, $5::uuid, $6::bigint))
ORDER BY r.finished_at DESC, r.job_id DESC, r.run_id DESC
LIMIT $7;

-- name: list_runs
SELECT * FROM runs WHERE job_id = $1 AND run_id < $2 ORDER BY run_id DESC LIMIT $3;

-- name: insert_owner
INSERT INTO owners (owner, signing_secret) VALUES ($1, $2) ON CONFLICT (owner) DO NOTHING;

-- name: insert_api_key
INSERT INTO api_keys (key_hash, key_prefix, owner) VALUES ($1, $2, $3);

-- name: owner_for_key
SELECT owner FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL;

-- name: revoke_api_key
UPDATE api_keys SET revoked_at = now()
WHERE (key_hash = $1 OR key_prefix = $2) AND revoked_at IS NULL;

-- name: signing_secret
SELECT signing_secret FROM owners WHERE owner = $1;

-- name: insert_occurrences
-- Occurrence rows: one occurrence of a recurring job, in a row of its own (overlap=allow, or a
-- backfill). next_run_at is null for a backfilled run that waits for the one before it. The row
-- runs under its job's spec version, both counters (spec_revision: 0018; a target is told it:
-- Duetime-Spec-Version).
INSERT INTO jobs (job_id, shard, owner, spec, spec_version, spec_revision, state, next_run_at,
                  scheduled_for, attempt, parent_id, backfill_seq)
SELECT u.j, u.s, u.o, u.sp, p.spec_version, p.spec_revision, 'scheduled', u.n, u.sf, 0, u.p, u.q
FROM unnest($1::uuid[], $2::smallint[], $3::text[], $4::jsonb[], $5::timestamptz[],
            $6::timestamptz[], $7::uuid[], $8::bigint[]) AS u(j, s, o, sp, n, sf, p, q)
JOIN jobs p ON p.job_id = u.p;

-- name: occurrences_of
-- A job's occurrence rows that have not run to the end yet (a bound on backfills in progress),
-- and the last backfill position handed out.
SELECT count(*) AS pending, COALESCE(max(backfill_seq), 0) AS last_seq FROM jobs WHERE parent_id = $1;

-- name: cascade_state
-- An owner's pause, resume or cancel reaches the job's occurrence rows; a claimed one gives its
-- lease back (as the job's own row does), a running one finishes and is recorded.
UPDATE jobs SET
    state = $2,
    phase = CASE WHEN phase = 'claimed' THEN 'idle' ELSE phase END,
    claimed_by = CASE WHEN phase = 'claimed' THEN NULL ELSE claimed_by END,
    leased_until = CASE WHEN phase = 'claimed' THEN NULL ELSE leased_until END,
    updated_at = now()
WHERE parent_id = $1 AND state <> 'cancelled'
RETURNING shard;

-- name: cascade_spec
-- A PATCH reaches the occurrence rows too (target, payload, retry); their schedule is their own.
-- Their spec_revision follows the job's ($3): what their runs ran under.
UPDATE jobs SET spec = jsonb_set($2::jsonb, '{schedule}', spec->'schedule'), spec_revision = $3,
                updated_at = now()
WHERE parent_id = $1;

-- name: drop_idle_occurrences
-- A cancel: occurrence rows that are not in flight will never run; they go (history says nothing
-- ran for them). One in flight finishes and is deleted by its completion.
DELETE FROM jobs WHERE parent_id = $1 AND phase = 'idle'
RETURNING scheduled_for;

-- name: drop_split_occurrences
-- A schedule PATCH: occurrences of the old schedule that overlap=allow handed to rows of their
-- own and that have not started yet are withdrawn with the schedule (a claimed one's fence then
-- finds nothing). Backfilled runs stay: they were asked for by date, not by the schedule.
DELETE FROM jobs WHERE parent_id = $1 AND backfill_seq IS NULL AND phase <> 'running';
