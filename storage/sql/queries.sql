-- Every statement Duetime runs, by name. Loaded by storage/queries.py; prepared by asyncpg on
-- first use per connection. A statement that runs once per job is a bug at 16,000 jobs a second:
-- the run path below works on arrays of hundreds of rows at a time.

-- name: insert_job
INSERT INTO jobs (job_id, shard, owner, spec, state, next_run_at, scheduled_for, attempt, created_at, updated_at,
                  split_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10)
RETURNING *;

-- name: insert_jobs
-- Many creates in one statement: concurrent POSTs on one database are coalesced by the store.
INSERT INTO jobs (job_id, shard, owner, spec, state, next_run_at, scheduled_for, attempt, created_at, updated_at,
                  split_at)
SELECT j, s, o, sp, st, n, sf, a, c, c, sa
FROM unnest($1::uuid[], $2::smallint[], $3::text[], $4::jsonb[], $5::text[], $6::timestamptz[],
            $7::timestamptz[], $8::int[], $9::timestamptz[], $10::timestamptz[])
     AS u(j, s, o, sp, st, n, sf, a, c, sa);

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

-- name: lock_job
SELECT * FROM jobs WHERE job_id = $1 AND owner = $2 AND parent_id IS NULL FOR UPDATE;

-- name: list_jobs
SELECT * FROM jobs
WHERE owner = $1 AND job_id > $2 AND parent_id IS NULL
ORDER BY job_id
LIMIT $3;

-- name: list_jobs_by_state
SELECT * FROM jobs
WHERE owner = $1 AND state = $2 AND job_id > $3 AND parent_id IS NULL
ORDER BY job_id
LIMIT $4;

-- name: write_job
-- One owner action's result: the lifecycle, the plan, and (when revoke) the lease given back.
UPDATE jobs SET
    spec = $3, spec_version = $4, state = $5, next_run_at = $6, scheduled_for = $7,
    attempt = $8, run_kind = $9, resume_at = $10, pending_triggers = $11,
    split_at = $13, handed_upto = $14,
    phase = CASE WHEN $12::bool AND phase = 'claimed' THEN 'idle' ELSE phase END,
    claimed_by = CASE WHEN $12::bool AND phase = 'claimed' THEN NULL ELSE claimed_by END,
    leased_until = CASE WHEN $12::bool AND phase = 'claimed' THEN NULL ELSE leased_until END,
    updated_at = now()
WHERE job_id = $1 AND owner = $2
RETURNING *;

-- name: count_active_jobs
SELECT count(*) FROM jobs WHERE owner = $1 AND state IN ('scheduled', 'paused') AND parent_id IS NULL;

-- name: job_exists
SELECT 1 FROM jobs WHERE job_id = $1 AND owner = $2 AND parent_id IS NULL;

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

-- name: notify_due
SELECT pg_notify('duetime_due', s) FROM unnest($1::text[]) AS s;

-- name: claim_due
-- The claim: the next batch of idle rows due within the lookahead on one shard, skipping rows
-- another engine holds. A new lease token (the fencing token: it only grows), the claimer's id
-- and a lease that runs until the row is due plus the lease length, in one statement. The
-- misfired rows also carry their spec, so the engine can apply the job's misfire policy.
WITH due AS (
    SELECT job_id FROM jobs
    WHERE shard = $1 AND state = 'scheduled' AND phase = 'idle'
      AND next_run_at <= now() + make_interval(secs => $3)
    ORDER BY next_run_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j SET
    phase = 'claimed',
    lease_token = j.lease_token + 1,
    claimed_by = $2,
    leased_until = greatest(j.next_run_at, now()) + make_interval(secs => $5)
FROM due
WHERE j.job_id = due.job_id
RETURNING j.job_id, j.shard, j.owner, j.lease_token, j.next_run_at, j.scheduled_for, j.attempt, j.run_kind,
    CASE WHEN j.run_kind = 'scheduled' AND j.attempt = 0 AND j.parent_id IS NULL
              AND j.next_run_at < now() - make_interval(secs => (j.spec->>'misfire_grace_s')::int)
         THEN j.spec END AS misfire_spec,
    now() AS db_now;

-- name: retake_claims
-- An engine restarting under the same id takes back what it had claimed: a new token fences
-- whatever the old process may still hold.
UPDATE jobs j SET
    lease_token = j.lease_token + 1,
    leased_until = greatest(j.next_run_at, now()) + make_interval(secs => $3)
WHERE j.claimed_by = $1 AND j.phase = 'claimed' AND j.shard = ANY($2::smallint[])
RETURNING j.job_id, j.shard, j.owner, j.lease_token, j.next_run_at, j.scheduled_for, j.attempt, j.run_kind,
    CASE WHEN j.run_kind = 'scheduled' AND j.attempt = 0 AND j.parent_id IS NULL
              AND j.next_run_at < now() - make_interval(secs => (j.spec->>'misfire_grace_s')::int)
         THEN j.spec END AS misfire_spec,
    now() AS db_now;

-- name: fence_runs
-- The fence before a call: claimed → running only where the token still matches and the owner
-- has not paused, cancelled or rescheduled the job. What it returns may be called; what it does
-- not return must not be. It also returns the spec as it is now, so an update is honoured.
UPDATE jobs j SET
    phase = 'running',
    scheduled_for = u.scheduled_for,
    leased_until = now() + make_interval(secs => $3)
FROM unnest($1::uuid[], $2::bigint[], $4::timestamptz[]) AS u(job_id, token, scheduled_for)
WHERE j.job_id = u.job_id AND j.lease_token = u.token
  AND j.phase = 'claimed' AND j.state = 'scheduled'
  AND j.job_id = ANY($1::uuid[])  -- the batch by primary key, whatever the statistics say (0002)
RETURNING j.job_id, j.shard, j.owner, j.lease_token, j.scheduled_for, j.next_run_at, j.attempt,
    j.spec::text AS spec, j.spec_version, j.run_kind, j.parent_id;

-- name: extend_leases
-- Rows are locked in job id order first (as by lock_for_completion, take_runs and
-- extend_published): batches that overlap must not lock in the orders of their input arrays, or
-- they deadlock under load (see take_runs).
WITH locked AS (
    SELECT job_id FROM jobs
    WHERE job_id = ANY($1::uuid[]) AND phase <> 'idle'
    ORDER BY job_id
    FOR UPDATE
)
UPDATE jobs j SET leased_until = now() + make_interval(secs => $3)
FROM locked, unnest($1::uuid[], $2::bigint[]) AS u(job_id, token)
WHERE j.job_id = locked.job_id AND u.job_id = locked.job_id AND j.lease_token = u.token
  AND j.phase <> 'idle'
RETURNING j.job_id;

-- name: keep_waiting_claims
-- An engine keeps the claims it still holds in its wheel from lapsing while a burst drains: rows
-- it claimed (same holder, still 'claimed', token untouched) whose lease would lapse within $3
-- seconds get $4 more seconds. Only rows that outlast their lease waiting are written, once per
-- $4 seconds; a dead engine stops doing this, so its claims lapse and the janitor rescues them.
WITH held AS (
    SELECT job_id FROM jobs
    WHERE shard = $1 AND leased_until IS NOT NULL
      AND leased_until < now() + make_interval(secs => $3)
      AND phase = 'claimed' AND claimed_by = $2
    ORDER BY leased_until
    LIMIT $5
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j SET leased_until = now() + make_interval(secs => $4)
FROM held
WHERE j.job_id = held.job_id;

-- name: release_claims
-- Give back rows that were claimed but not fired (shutdown): they become claimable at once.
UPDATE jobs j SET phase = 'idle', claimed_by = NULL, leased_until = NULL
FROM unnest($1::uuid[], $2::bigint[]) AS u(job_id, token)
WHERE j.job_id = u.job_id AND j.lease_token = u.token AND j.phase = 'claimed'
  AND j.job_id = ANY($1::uuid[])
RETURNING j.job_id;

-- name: lock_for_completion
-- Completion reads the rows it is about to finish under lock, in the same transaction as the
-- write, so "what comes next" is computed from the row as it is (a pause, cancel or PATCH that
-- landed while the call was in flight is seen).
-- The spec comes as its text: a completion compares it with the text its fence read and reuses
-- the spec the worker parsed when they are equal (the common case), instead of decoding it again.
SELECT job_id, shard, owner, spec::text AS spec, spec_version, state, phase, lease_token,
       scheduled_for, next_run_at, attempt, run_kind, resume_at, pending_triggers, parent_id,
       handed_upto, split_at, backfill_seq
FROM jobs WHERE job_id = ANY($1::uuid[])
ORDER BY job_id
FOR UPDATE;

-- name: apply_plans
-- hold: a recurring job whose schedule has ended is not completed while runs of it still wait
-- in occurrence rows (overlap=allow, backfill): it keeps its state, with no next run, until the
-- last of them is over (complete_drained_jobs).
UPDATE jobs j SET
    state = CASE WHEN u.hold AND EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = j.job_id)
                 THEN j.state ELSE u.state END,
    next_run_at = u.next_run_at, scheduled_for = u.scheduled_for,
    attempt = u.attempt, run_kind = u.run_kind, resume_at = u.resume_at,
    pending_triggers = CASE WHEN u.triggers_changed THEN
        COALESCE((SELECT array_agg(t ORDER BY t) FROM unnest(j.pending_triggers) t
                  WHERE t > u.consumed_trigger_at), '{}') ELSE j.pending_triggers END,
    split_at = u.split_at, handed_upto = u.handed_upto,
    phase = 'idle', claimed_by = NULL, leased_until = NULL,
    last_run = COALESCE(u.last_run, j.last_run),
    updated_at = now()
FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::int[], $6::text[],
            $7::timestamptz[], $8::bool[], $9::timestamptz[], $10::jsonb[], $11::timestamptz[],
            $12::timestamptz[], $13::bool[])
     AS u(job_id, state, next_run_at, scheduled_for, attempt, run_kind, resume_at,
          triggers_changed, consumed_trigger_at, last_run, split_at, handed_upto, hold)
WHERE j.job_id = u.job_id;

-- name: insert_runs
INSERT INTO runs (job_id, shard, scheduled_for, attempt, started_at, finished_at, outcome,
                  status_code, error, lateness_ms, fencing_token)
SELECT * FROM unnest($1::uuid[], $2::smallint[], $3::timestamptz[], $4::int[], $5::timestamptz[],
                     $6::timestamptz[], $7::text[], $8::int[], $9::text[], $10::bigint[], $11::bigint[]);

-- name: expired_leases
-- The janitor's batch: leases that lapsed on one shard, from the lease index, skipping rows
-- someone else is already finishing.
SELECT job_id FROM jobs
WHERE shard = $1 AND phase <> 'idle' AND leased_until < now()
ORDER BY leased_until
LIMIT $2
FOR UPDATE SKIP LOCKED;

-- name: running_of_engine
SELECT job_id FROM jobs
WHERE claimed_by = $1 AND phase = 'running' AND shard = ANY($2::smallint[]);

-- name: db_now
SELECT now();

-- name: purge_idempotency_keys
DELETE FROM idempotency_keys WHERE created_at < now() - make_interval(secs => $1);

-- name: take_runs
-- DUETIME_RUN_QUEUE=nats: a worker takes over runs an engine fenced and published. The row must
-- still be running under the same token and be held by the engine that published it; from here
-- the worker holds the lease. A second delivery of the same message (broker redelivery, another
-- worker) finds the holder changed and takes nothing, so a message is called at most once per token.
--
-- The rows are locked in job id order before the update, by primary key. An engine's
-- extend_published runs on the same rows at the same time; when each locked in the order of its
-- own array (message order here, fence order there) the two deadlocked in a 20,000-run burst:
-- both waited deadlock_timeout, one was aborted, and an aborted heartbeat let published leases
-- lapse (thousands of runs retried as lease_expired).
-- "claimed_by IS NOT DISTINCT FROM" (the publisher is never NULL) rather than "=": "=" implies
-- the holder index's predicate (claimed_by IS NOT NULL), and with statistics from before a burst
-- the planner then scans every row the engine holds once per locked row (seconds per batch).
WITH locked AS (
    SELECT job_id FROM jobs
    WHERE job_id = ANY($1::uuid[]) AND phase = 'running'
    ORDER BY job_id
    FOR UPDATE
)
UPDATE jobs j SET claimed_by = $4, leased_until = now() + make_interval(secs => $5)
FROM locked, unnest($1::uuid[], $2::bigint[], $3::text[]) AS u(job_id, token, publisher)
WHERE j.job_id = locked.job_id AND u.job_id = locked.job_id AND j.lease_token = u.token
  AND j.phase = 'running' AND j.claimed_by IS NOT DISTINCT FROM u.publisher
RETURNING j.job_id, j.lease_token;

-- name: extend_published
-- An engine keeps the leases of runs it published alive until a worker takes them (the holder
-- changes) or they are finished; what this does not return is no longer the engine's to keep.
-- Locked in job id order first, by primary key (see take_runs), and updated by primary key.
WITH locked AS (
    SELECT job_id FROM jobs
    WHERE job_id = ANY($1::uuid[]) AND phase = 'running'
    ORDER BY job_id
    FOR UPDATE
)
UPDATE jobs j SET leased_until = now() + make_interval(secs => $4)
FROM locked, unnest($1::uuid[], $2::bigint[]) AS u(job_id, token)
WHERE j.job_id = locked.job_id AND u.job_id = locked.job_id AND j.lease_token = u.token
  AND j.phase = 'running' AND j.claimed_by IS NOT DISTINCT FROM $3
RETURNING j.job_id;

-- name: shard_rows
-- Moving a logical shard: how many rows it has, and how many are in the run path right now.
SELECT count(*) AS total, count(*) FILTER (WHERE phase <> 'idle') AS busy FROM jobs WHERE shard = $1;

-- name: shard_runs_count
SELECT count(*) FROM runs WHERE shard = $1;

-- name: lock_for_shard_move
-- Writes wait while a shard is copied away (reads go on): the copy is the shard as it is.
LOCK TABLE jobs, runs, idempotency_keys IN EXCLUSIVE MODE;

-- name: copy_out_jobs
SELECT * FROM jobs WHERE shard = $1;

-- name: copy_out_runs
-- The target numbers the history anew (run ids are per database); the order is kept.
SELECT job_id, shard, scheduled_for, attempt, started_at, finished_at, outcome, status_code, error,
       lateness_ms, fencing_token
FROM runs WHERE shard = $1 ORDER BY run_id;

-- name: copy_out_idempotency_keys
SELECT k.owner, k.key, k.body_hash, k.job_id, k.created_at
FROM idempotency_keys k JOIN jobs j ON j.job_id = k.job_id WHERE j.shard = $1;

-- name: delete_shard_idempotency_keys
DELETE FROM idempotency_keys k USING jobs j WHERE j.job_id = k.job_id AND j.shard = $1;

-- name: delete_shard_runs
DELETE FROM runs WHERE shard = $1;

-- name: delete_shard_jobs
DELETE FROM jobs WHERE shard = $1;

-- name: published_of_engine
-- A restarted engine (DUETIME_RUN_QUEUE=nats) finishes the runs its previous life fenced and no
-- worker has taken yet. Locked as they are selected: a row a worker takes at the same moment
-- either is skipped (its take holds the lock) or no longer matches (its holder changed).
SELECT job_id FROM jobs
WHERE claimed_by = $1 AND phase = 'running' AND shard = ANY($2::smallint[])
FOR UPDATE SKIP LOCKED;

-- ---------------------------------------------------------------------- overlap and backfill (0003)

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

-- name: insert_occurrences
-- Occurrence rows: one occurrence of a recurring job, in a row of its own (overlap=allow, or a
-- backfill). next_run_at is null for a backfilled run that waits for the one before it.
INSERT INTO jobs (job_id, shard, owner, spec, spec_version, state, next_run_at, scheduled_for, attempt,
                  parent_id, backfill_seq)
SELECT j, s, o, sp, 1, 'scheduled', n, sf, 0, p, q
FROM unnest($1::uuid[], $2::smallint[], $3::text[], $4::jsonb[], $5::timestamptz[],
            $6::timestamptz[], $7::uuid[], $8::bigint[]) AS u(j, s, o, sp, n, sf, p, q);

-- name: occurrences_of
-- A job's occurrence rows that have not run to the end yet (a bound on backfills in progress),
-- and the last backfill position handed out.
SELECT count(*) AS pending, COALESCE(max(backfill_seq), 0) AS last_seq FROM jobs WHERE parent_id = $1;

-- name: delete_occurrences
DELETE FROM jobs WHERE job_id = ANY($1::uuid[]) AND parent_id IS NOT NULL;

-- name: release_next_backfill
-- skip/buffer_one: a backfilled run ended, so the next waiting one of the same job may start,
-- unless another of its runs is already on its way (the janitor may have been first).
UPDATE jobs j SET next_run_at = now()
FROM (
    SELECT DISTINCT ON (w.parent_id) w.job_id FROM jobs w
    WHERE w.parent_id = ANY($1::uuid[]) AND w.next_run_at IS NULL AND w.state <> 'cancelled'
      AND NOT EXISTS (SELECT 1 FROM jobs a WHERE a.parent_id = w.parent_id AND a.next_run_at IS NOT NULL)
    ORDER BY w.parent_id, w.backfill_seq
) nxt
WHERE j.job_id = nxt.job_id
RETURNING j.shard;

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

-- name: parent_last_run
-- An occurrence row's attempt is the job's latest run too. Its own statement after the
-- completion commits: taking the parent's lock inside it could deadlock with an owner action,
-- which locks the parent first and its occurrence rows second.
UPDATE jobs j SET last_run = u.last_run, updated_at = now()
FROM unnest($1::uuid[], $2::jsonb[]) AS u(job_id, last_run)
WHERE j.job_id = u.job_id
  AND (j.last_run IS NULL
       OR (j.last_run->>'finished_at')::timestamptz <= (u.last_run->>'finished_at')::timestamptz);

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
UPDATE jobs SET spec = jsonb_set($2::jsonb, '{schedule}', spec->'schedule'), updated_at = now()
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

-- name: complete_drained_jobs
-- The other half of apply_plans' hold: a recurring job with no next run and no occurrence row
-- left is completed; run for the jobs whose occurrence rows just finished. State 'scheduled'
-- only: a paused job whose schedule ended stays paused, as before.
UPDATE jobs p SET state = 'completed', updated_at = now()
WHERE p.job_id = ANY($1::uuid[]) AND p.state = 'scheduled' AND p.next_run_at IS NULL
  AND p.phase = 'idle' AND p.parent_id IS NULL AND p.spec->'schedule' ? 'cron'
  AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = p.job_id)
RETURNING p.job_id;

-- name: complete_drained_jobs_of_shard
-- The same, by the janitor per shard (from the due index: idle, scheduled, no next run), for a
-- statement above lost to a crash.
UPDATE jobs p SET state = 'completed', updated_at = now()
WHERE p.shard = $1 AND p.state = 'scheduled' AND p.next_run_at IS NULL
  AND p.phase = 'idle' AND p.parent_id IS NULL AND p.spec->'schedule' ? 'cron'
  AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = p.job_id)
RETURNING p.job_id;

-- name: oldest_unclaimed_due
-- For each shard of $1, how many seconds the earliest row that is due, scheduled and claimed by
-- no engine has been waiting (0 when none waits). One probe of the jobs_due index per shard
-- (its leading columns are shard, next_run_at, partial on exactly this predicate): cheap enough
-- to sample every few seconds. A growing value means due runs nobody fires: no engine serves
-- the shard, or its engines cannot keep up.
SELECT s.shard,
       coalesce(extract(epoch FROM now() - d.next_run_at), 0)::float8 AS age_s
FROM unnest($1::smallint[]) AS s(shard)
LEFT JOIN LATERAL (
    SELECT next_run_at FROM jobs
    WHERE jobs.shard = s.shard AND state = 'scheduled' AND phase = 'idle' AND next_run_at <= now()
    ORDER BY next_run_at
    LIMIT 1
) d ON true;
