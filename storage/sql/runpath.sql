-- The run path up to the call (storage/postgres/runpath.py): claim, fence, heartbeats, release.
-- A statement that runs once per job is a bug at 16,000 jobs a second: these work on arrays of
-- hundreds of rows at a time.
-- Loaded by name by storage/queries.py; names are unique across storage/sql/*.sql.

-- name: claim_due
-- The claim: the next batch of idle rows due within the lookahead on one shard, skipping rows
-- another engine holds. "claimed_by IS NULL" is what lets the planner use jobs_due (its predicate,
-- since migration 0010); the table keeps it equal to "phase = 'idle'" (a check constraint). A new
-- lease token (the fencing token: it only grows, across failovers too: migration 0014), the claimer's id
-- and a lease that runs until the row is due plus the lease length, in one statement. The
-- late rows also carry their spec, so the engine can apply the job's misfire policy or start a
-- catch-up: rows past their grace, and recurring rows a second or more behind their due time.
WITH due AS (
    SELECT job_id FROM jobs
    WHERE shard = $1 AND state = 'scheduled' AND claimed_by IS NULL AND phase = 'idle'
      AND next_run_at <= now() + make_interval(secs => $3)
    ORDER BY next_run_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j SET
    phase = 'claimed',
    lease_token = greatest(j.lease_token + 1, (SELECT duetime_token_floor())),
    claimed_by = $2,
    leased_until = greatest(j.next_run_at, now()) + make_interval(secs => $5)
FROM due
WHERE j.job_id = due.job_id
RETURNING j.job_id, j.shard, j.owner, j.lease_token, j.next_run_at, j.scheduled_for, j.attempt, j.run_kind,
    CASE WHEN j.run_kind = 'scheduled' AND j.attempt = 0 AND j.parent_id IS NULL
              AND (j.next_run_at < now() - make_interval(secs => (j.spec->>'misfire_grace_s')::int)
                   OR (j.next_run_at <= now() - interval '1 second'
                       AND COALESCE(j.spec->'schedule' ?| array['cron', 'every'], false)))
         THEN j.spec END AS misfire_spec,
    now() AS db_now;

-- name: retake_claims
-- An engine restarting under the same id takes back what it had claimed: a new token fences
-- whatever the old process may still hold.
WITH locked AS (
    SELECT job_id FROM jobs
    WHERE claimed_by = $1 AND phase = 'claimed' AND shard = ANY($2::smallint[])
    ORDER BY job_id
    FOR UPDATE
)
UPDATE jobs j SET
    lease_token = greatest(j.lease_token + 1, (SELECT duetime_token_floor())),
    leased_until = greatest(j.next_run_at, now()) + make_interval(secs => $3)
FROM locked
WHERE j.job_id = locked.job_id AND j.claimed_by = $1 AND j.phase = 'claimed'
RETURNING j.job_id, j.shard, j.owner, j.lease_token, j.next_run_at, j.scheduled_for, j.attempt, j.run_kind,
    CASE WHEN j.run_kind = 'scheduled' AND j.attempt = 0 AND j.parent_id IS NULL
              AND (j.next_run_at < now() - make_interval(secs => (j.spec->>'misfire_grace_s')::int)
                   OR (j.next_run_at <= now() - interval '1 second'
                       AND COALESCE(j.spec->'schedule' ?| array['cron', 'every'], false)))
         THEN j.spec END AS misfire_spec,
    now() AS db_now;

-- name: fence_runs
-- The fence before a call: claimed → running only where the token still matches and the owner
-- has not paused, cancelled or rescheduled the job. What it returns may be called; what it does
-- not return must not be. It also returns the spec as it is now, so an update is honoured.
-- Rows are locked in job id order first, as every other statement on these rows does: a batch
-- holds the rows of many jobs (and a job's occurrence rows beside its own), and locking them in
-- the order of its input deadlocked with owner actions (issue 17).
-- The lock is a gate, not a join: "(SELECT count(*) FROM locked) >= 0" is computed once, before
-- the first row is written (a one-time filter), and reads the whole CTE, so every row of the
-- batch is locked in id order before the update touches any.
-- The guards (token, phase, state) are read from the rows as locked, never put on "jobs" in the
-- update: the planner, whose statistics say almost no row is claimed (taken before the burst, or
-- at any quiet moment), estimated one claimed row from them. On a table of 100,000 rows or more it
-- then still probed by primary key; on one of a few thousand it scanned the table for that row and
-- put the batch's unnest inside a nested loop: every job compared with every run of the batch,
-- 2.5 million comparisons and 300-750 ms per 500-row fence of a 5,000-job table, where a fence
-- takes ~15 ms. Here "jobs" is reached only by its primary key (from the batch in the CTE, and
-- from the CTE in the update) and nothing restricts it, so no plan can rescan the batch per job
-- (tests/database/test_bulk.py, test_run_path_statements_stay_linear_on_a_small_table). Joined
-- the other way (the update on the guards, the CTE by id), the CTE was rescanned once per row:
-- ~150 ms of a 500-row fence (docs/performance.md, fifth session).
-- The same shape is in extend_leases, release_claims, take_runs and extend_published.
-- The update is HOT (a new row version on the same page, no index entry): it sets no column an
-- index reads. The running lease goes to run_until; leased_until keeps the claim's lease, which
-- the janitor's index is keyed on (migration 0010; expired_leases, carry_run_leases).
-- The fenced_* columns keep what this returns that an owner's edit can change while the row
-- runs (its occurrence, due time, attempt, spec version, run kind) under this lease's token:
-- an expiry then finishes the attempt that was fenced, not the row as a PATCH left it
-- (migration 0013, lock_for_completion). fenced_revision (0018): the spec_version the API shows
-- that the run runs under, which its history row records.
-- $4: each occurrence as µs since the epoch (a bigint: exact, and cheaper for the node to send
-- than a timestamptz), turned back in whole seconds and the µs left over, each exact as a float8:
-- "us * interval '1 microsecond'" goes through a float8 too and lost µs past the year 2255
-- (tests/contract, test_the_fence_keeps_the_occurrence_it_is_given_to_the_microsecond).
-- The run's context (migration 0019) comes with the row: when the job was made, its last
-- success, and what run_once folded. An occurrence it is given later than the row's own is a
-- fold (only run_once's FireNow moves it): the row's occurrence was the oldest one missed, kept
-- in folded_from (or the oldest of an earlier fold into that occurrence, a run given back
-- unused and folded again) with folded_into, so that every attempt of the run returns it.
-- An occurrence row's context is its job's row's, read apart (job_context).
WITH locked AS MATERIALIZED (
    SELECT j.job_id, j.lease_token, j.phase, j.state, u.token, j.scheduled_for AS was_for,
           j.folded_from, j.folded_into,
           to_timestamp(u.scheduled_us / 1000000) + (u.scheduled_us % 1000000) * interval '1 microsecond'
               AS scheduled_for
    FROM unnest($1::uuid[], $2::bigint[], $4::bigint[]) AS u(job_id, token, scheduled_us)
    JOIN jobs j ON j.job_id = u.job_id
    ORDER BY j.job_id
    FOR UPDATE OF j
)
UPDATE jobs j SET
    phase = 'running',
    scheduled_for = l.scheduled_for,
    run_until = now() + make_interval(secs => $3),
    fenced_token = j.lease_token, fenced_for = l.scheduled_for, fenced_due = j.next_run_at,
    fenced_attempt = j.attempt, fenced_version = j.spec_version, fenced_kind = j.run_kind,
    fenced_revision = j.spec_revision,
    folded_from = CASE WHEN l.scheduled_for > l.was_for
                       THEN CASE WHEN l.folded_into = l.was_for THEN l.folded_from ELSE l.was_for END
                       ELSE l.folded_from END,
    folded_into = CASE WHEN l.scheduled_for > l.was_for THEN l.scheduled_for ELSE l.folded_into END
FROM locked l
WHERE (SELECT count(*) FROM locked) >= 0  -- the gate: all of the batch locked first
  AND j.job_id = l.job_id
  AND l.lease_token = l.token AND l.phase = 'claimed' AND l.state = 'scheduled'
RETURNING j.job_id, j.shard, j.owner, j.lease_token, j.scheduled_for, j.next_run_at, j.attempt,
    j.spec::text AS spec, j.spec_version, j.run_kind, j.parent_id, j.created_at, j.last_success_for,
    CASE WHEN j.folded_into = j.scheduled_for THEN j.folded_from END AS folded_from, j.spec_revision;

-- name: job_context
-- The run context of occurrence rows the fence returned (overlap=allow, backfill, catch-up): their
-- job's, from the job's own row (when it was made, its last success). Read apart from the fence,
-- and only for a batch that holds such rows: the job's row is not locked by it, and a join in
-- the fence would be one more probe per run of every batch. Not locked: a success recorded at
-- this moment may or may not be seen, as for a run fenced a moment earlier.
SELECT job_id, created_at, last_success_for FROM jobs WHERE job_id = ANY($1::uuid[]);

-- name: extend_leases
-- Rows are locked in job id order first (as by lock_for_completion, take_runs and
-- extend_published): batches that overlap must not lock in the orders of their input arrays, or
-- they deadlock under load (see take_runs). The whole batch is locked, behind the gate of
-- fence_runs, so no row the update writes is locked out of that order; the guards are read from
-- the rows as locked, as in fence_runs. A running row's lease is run_until, which no index reads:
-- its heartbeat is a HOT update, as its fence was.
WITH locked AS MATERIALIZED (
    SELECT j.job_id, j.lease_token, j.phase, u.token
    FROM unnest($1::uuid[], $2::bigint[]) AS u(job_id, token)
    JOIN jobs j ON j.job_id = u.job_id
    ORDER BY j.job_id
    FOR UPDATE OF j
)
UPDATE jobs j SET
    leased_until = CASE WHEN l.phase = 'claimed' THEN now() + make_interval(secs => $3) ELSE j.leased_until END,
    run_until = CASE WHEN l.phase = 'running' THEN now() + make_interval(secs => $3) ELSE j.run_until END
FROM locked l
WHERE (SELECT count(*) FROM locked) >= 0  -- the gate: all of the batch locked first
  AND j.job_id = l.job_id AND l.lease_token = l.token AND l.phase <> 'idle'
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

-- name: return_unstarted
-- Give back runs that were fenced but never called (a worker stops while they wait for a host
-- that backs off, issue 28): the row is as its claim's release leaves it, idle and claimable at
-- once, its attempt unused. Only a row still running under the fence's own token (fenced_token:
-- an owner's edit since has written its plan onto the row, which stands) is returned. Locked in
-- job id order first, behind the gate, as release_claims.
WITH locked AS MATERIALIZED (
    SELECT j.job_id, j.lease_token, j.phase, j.fenced_token, u.token
    FROM unnest($1::uuid[], $2::bigint[]) AS u(job_id, token)
    JOIN jobs j ON j.job_id = u.job_id
    ORDER BY j.job_id
    FOR UPDATE OF j
)
UPDATE jobs j SET phase = 'idle', claimed_by = NULL, leased_until = NULL, run_until = NULL,
    taken_by = NULL
FROM locked l
WHERE (SELECT count(*) FROM locked) >= 0  -- the gate: all of the batch locked first
  AND j.job_id = l.job_id AND l.lease_token = l.token AND l.phase = 'running'
  AND l.fenced_token = l.token
RETURNING j.job_id;

-- name: release_claims
-- Give back rows that were claimed but not fired (shutdown): they become claimable at once.
-- Locked in job id order first, behind the gate of fence_runs; the guards are read from the rows
-- as locked, as in fence_runs.
WITH locked AS MATERIALIZED (
    SELECT j.job_id, j.lease_token, j.phase, u.token
    FROM unnest($1::uuid[], $2::bigint[]) AS u(job_id, token)
    JOIN jobs j ON j.job_id = u.job_id
    ORDER BY j.job_id
    FOR UPDATE OF j
)
UPDATE jobs j SET phase = 'idle', claimed_by = NULL, leased_until = NULL
FROM locked l
WHERE (SELECT count(*) FROM locked) >= 0  -- the gate: all of the batch locked first
  AND j.job_id = l.job_id AND l.lease_token = l.token AND l.phase = 'claimed'
RETURNING j.job_id;
