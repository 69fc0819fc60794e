-- The completion writer (storage/postgres/completion.py): attempts finished and missed
-- occurrences skipped under their leases, one statement per kind of write for a whole batch.
-- Loaded by name by storage/queries.py; names are unique across storage/sql/*.sql.

-- name: lock_for_completion
-- Completion reads the rows it is about to finish under lock, in the same transaction as the
-- write, so "what comes next" is computed from the row as it is (a pause, cancel or PATCH that
-- landed while the call was in flight is seen).
-- The spec comes as its text: a completion compares it with the text its fence read and reuses
-- the spec the worker parsed when they are equal (the common case), instead of decoding it again.
-- $2: the jobs whose failure count an occurrence row of the batch may change (core/failures.py),
-- locked here with the rest, in the one job id order every writer of these rows locks in.
-- The fenced_* columns (migration 0013): the attempt a running row's fence started, which an
-- expiry finishes when its holder is gone (completion.py, _running); fenced_revision and
-- spec_revision (0018): the spec version a history row records (completion.py, _ran_under).
SELECT job_id, shard, owner, spec::text AS spec, spec_version, state, phase, lease_token,
       scheduled_for, next_run_at, attempt, run_kind, resume_at, pending_triggers, parent_id,
       handed_upto, split_at, backfill_seq, consecutive_failures, failing,
       fenced_token, fenced_for, fenced_due, fenced_attempt, fenced_version, fenced_kind,
       spec_revision, fenced_revision
FROM jobs WHERE job_id = ANY($1::uuid[] || $2::uuid[])
ORDER BY job_id
FOR UPDATE;

-- name: apply_plans
-- hold: a recurring job whose schedule has ended is not completed while runs of it still wait
-- in occurrence rows (overlap=allow, backfill): it keeps its state, with no next run, until the
-- last of them is over (complete_drained_jobs).
-- succeeded_for: the occurrence of an attempt that succeeded (its job's row only), kept as the
-- job's last success unless a later one is kept already (migration 0019).
UPDATE jobs j SET
    state = CASE WHEN u.hold AND EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = j.job_id)
                 THEN j.state ELSE u.state END,
    next_run_at = u.next_run_at, scheduled_for = u.scheduled_for,
    attempt = u.attempt, run_kind = u.run_kind, resume_at = u.resume_at,
    pending_triggers = CASE WHEN u.triggers_changed THEN
        COALESCE((SELECT array_agg(t ORDER BY t) FROM unnest(j.pending_triggers) t
                  WHERE t > u.consumed_trigger_at), '{}') ELSE j.pending_triggers END,
    split_at = u.split_at, handed_upto = u.handed_upto,
    phase = 'idle', claimed_by = NULL, taken_by = NULL, leased_until = NULL, run_until = NULL,
    last_run = COALESCE(u.last_run, j.last_run),
    last_success_for = GREATEST(j.last_success_for, u.succeeded_for),
    updated_at = now()
FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::int[], $6::text[],
            $7::timestamptz[], $8::bool[], $9::timestamptz[], $10::jsonb[], $11::timestamptz[],
            $12::timestamptz[], $13::bool[], $14::timestamptz[])
     AS u(job_id, state, next_run_at, scheduled_for, attempt, run_kind, resume_at,
          triggers_changed, consumed_trigger_at, last_run, split_at, handed_upto, hold, succeeded_for)
WHERE j.job_id = u.job_id;

-- name: insert_runs
INSERT INTO runs (job_id, shard, scheduled_for, attempt, started_at, finished_at, outcome,
                  status_code, error, lateness_ms, fencing_token, spec_version)
SELECT * FROM unnest($1::uuid[], $2::smallint[], $3::timestamptz[], $4::int[], $5::timestamptz[],
                     $6::timestamptz[], $7::text[], $8::int[], $9::text[], $10::bigint[], $11::bigint[],
                     $12::int[]);

-- name: delete_occurrences
DELETE FROM jobs WHERE job_id = ANY($1::uuid[]) AND parent_id IS NOT NULL;

-- name: insert_catch_up
-- A catch-up (core/misfire.py): occurrences that are already due, each in an occurrence row
-- copied from its job's row. Under overlap=allow ($4 null) all are due now; under skip and
-- buffer_one they wait in line after whatever backfill of the job already waits ($4 is their
-- place in the line) and release_next_backfill lets the first one go after the commit. Each runs
-- under its job's spec version, as insert_occurrences' rows do (both counters: 0018).
INSERT INTO jobs (job_id, shard, owner, spec, spec_version, spec_revision, state, next_run_at,
                  scheduled_for, attempt, parent_id, backfill_seq)
SELECT u.j, p.shard, p.owner, p.spec, p.spec_version, p.spec_revision, 'scheduled',
       CASE WHEN u.q IS NULL THEN now() END, u.sf, 0, p.job_id,
       CASE WHEN u.q IS NOT NULL THEN
           (SELECT COALESCE(max(c.backfill_seq), 0) FROM jobs c WHERE c.parent_id = p.job_id) + u.q
       END
FROM unnest($1::uuid[], $2::uuid[], $3::timestamptz[], $4::bigint[]) AS u(j, parent, sf, q)
JOIN jobs p ON p.job_id = u.parent;

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

-- name: parent_last_run
-- An occurrence row's attempt is the job's latest run too, and its success the job's last
-- success (succeeded_for, as in apply_plans). Its own statement after the completion commits:
-- taking the parent's lock inside it could deadlock with an owner action, which locks the parent
-- first and its occurrence rows second.
UPDATE jobs j SET
    last_run = CASE WHEN j.last_run IS NULL
                         OR (j.last_run->>'finished_at')::timestamptz <= (u.last_run->>'finished_at')::timestamptz
                    THEN u.last_run ELSE j.last_run END,
    last_success_for = GREATEST(j.last_success_for, u.succeeded_for),
    updated_at = now()
FROM unnest($1::uuid[], $2::jsonb[], $3::timestamptz[]) AS u(job_id, last_run, succeeded_for)
WHERE j.job_id = u.job_id
  AND (j.last_run IS NULL
       OR (j.last_run->>'finished_at')::timestamptz <= (u.last_run->>'finished_at')::timestamptz
       OR u.succeeded_for > j.last_success_for
       OR (j.last_success_for IS NULL AND u.succeeded_for IS NOT NULL));

-- name: complete_drained_jobs
-- The other half of apply_plans' hold: a recurring job with no next run and no occurrence row
-- left is completed; run for the jobs whose occurrence rows just finished. State 'scheduled'
-- only: a paused job whose schedule ended stays paused, as before.
UPDATE jobs p SET state = 'completed', updated_at = now()
WHERE p.job_id = ANY($1::uuid[]) AND p.state = 'scheduled' AND p.next_run_at IS NULL
  AND p.phase = 'idle' AND p.parent_id IS NULL AND p.spec->'schedule' ?| array['cron', 'every']
  AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = p.job_id)
RETURNING p.job_id;

-- name: apply_failure_counts
-- Failure handling (core/failures.py): the consecutive failed occurrences of the jobs whose
-- occurrences ended in this batch, and whether each sent job.failing. Only for jobs that count
-- (on_failure or pause_after_failures) and whose count changed: a batch of other jobs runs none.
UPDATE jobs j SET consecutive_failures = u.consecutive_failures, failing = u.failing
FROM unnest($1::uuid[], $2::int[], $3::bool[]) AS u(job_id, consecutive_failures, failing)
WHERE j.job_id = u.job_id;

-- name: pause_failing_jobs
-- pause_after_failures reached: the job pauses as an owner's pause does (write_job): no
-- overlap split point, a claimed row's lease given back (its fence then fails), no claim while
-- paused. Its occurrence rows follow after the commit (cascade_failure_pause). Answers the jobs
-- it paused with their count (apply_failure_counts wrote it just before), for their auto_pause
-- records (record_changes, in the same transaction).
UPDATE jobs SET
    state = 'paused',
    split_at = NULL,
    -- The Job's "paused" object (0020): by Duetime, no note, until a resume.
    paused_at = now(), pause_note = NULL, paused_until = NULL, paused_by = 'duetime',
    paused_key_id = NULL,
    phase = CASE WHEN phase = 'claimed' THEN 'idle' ELSE phase END,
    claimed_by = CASE WHEN phase = 'claimed' THEN NULL ELSE claimed_by END,
    leased_until = CASE WHEN phase = 'claimed' THEN NULL ELSE leased_until END,
    updated_at = now()
WHERE job_id = ANY($1::uuid[]) AND state = 'scheduled'
RETURNING job_id, consecutive_failures;

-- name: cascade_failure_pause
-- A job paused for failing: its occurrence rows follow, as cascade_state does for an owner's
-- pause. Its own statement after the completion commits, for the lock order of parent_last_run;
-- only while the job is still paused (an owner may have resumed it in between).
UPDATE jobs SET
    state = 'paused',
    phase = CASE WHEN phase = 'claimed' THEN 'idle' ELSE phase END,
    claimed_by = CASE WHEN phase = 'claimed' THEN NULL ELSE claimed_by END,
    leased_until = CASE WHEN phase = 'claimed' THEN NULL ELSE leased_until END,
    updated_at = now()
WHERE parent_id = ANY($1::uuid[]) AND state = 'scheduled'
  AND EXISTS (SELECT 1 FROM jobs p WHERE p.job_id = jobs.parent_id AND p.state = 'paused');

-- name: insert_failure_events
-- The outbox (migration 0009): the events of this batch's ended occurrences, in its transaction.
INSERT INTO failure_events (event_id, job_id, shard, owner, type, scheduled_for, fencing_token,
                            target, body)
SELECT * FROM unnest($1::text[], $2::uuid[], $3::smallint[], $4::text[], $5::text[],
                     $6::timestamptz[], $7::bigint[], $8::jsonb[], $9::jsonb[]);

-- name: finish_ordinary
-- The common completion in one statement (storage/postgres/completion.py, OrdinaryBatch): an
-- attempt that succeeded, of a job's own row run on its schedule. The node computed what the
-- row becomes (core.lifecycle.after_attempt) from the row as its fence left it; the update
-- applies that only where the row still is so under lock (plain, and the same lease, spec
-- version, overlap policy, occurrence and attempt): running, scheduled, no trigger waiting, no
-- failure counted. Any other row is left as it is for the general path (lock_for_completion,
-- apply_plans), in the same transaction: its decisions are then made from the row as locked.
-- Two kinds of rows, each with its own update: a recurring job's ($3..$20, with what its row
-- becomes) and a one-off's ($21..$31), whose row always becomes the same (completed, no next
-- run, its occurrence and attempt kept: core.lifecycle.ends_one_off), written here as constants.
-- Every row of the batch ($1: the reports not offered here; $2: the failure counts' jobs; and
-- the offered ones) is locked first, in job id order, as lock_for_completion does, and the
-- guards are read from the rows as locked (the latest version); the updates then find each row
-- by its primary key (guards on jobs itself made the planner scan jobs by state). The history
-- row of each updated one is written by the same statement. Returns the offered ids it did not
-- finish (left to the general path; usually none). Every attempt here succeeded: its occurrence
-- is the job's last success unless a later one is kept already (migration 0019).
WITH locked AS MATERIALIZED (
    SELECT job_id, lease_token, spec_version, scheduled_for, attempt, spec->>'overlap' AS overlap,
           -- The spec_version the API shows that the attempt ran under (completion.py, _ran_under).
           CASE WHEN fenced_token = lease_token AND fenced_revision IS NOT NULL THEN fenced_revision
                ELSE spec_revision END AS ran_under,
           (phase = 'running' AND state = 'scheduled' AND parent_id IS NULL AND run_kind = 'scheduled'
            AND resume_at IS NULL AND handed_upto IS NULL AND cardinality(pending_triggers) = 0
            AND consecutive_failures = 0 AND NOT failing) AS plain
    FROM jobs
    WHERE job_id = ANY($1::uuid[] || $2::uuid[] || $3::uuid[] || $21::uuid[])
    ORDER BY job_id
    FOR UPDATE
),
done AS (
    UPDATE jobs j SET
        state = u.state, next_run_at = u.next_run_at, scheduled_for = u.next_for,
        attempt = u.next_attempt, split_at = u.split_at, handed_upto = u.handed_upto,
        phase = 'idle', claimed_by = NULL, taken_by = NULL, leased_until = NULL, run_until = NULL,
        last_run = u.last_run::jsonb || jsonb_build_object('spec_version', l.ran_under),
        last_success_for = GREATEST(j.last_success_for, u.ran_for),
        updated_at = now()
    FROM locked l
    JOIN unnest($3::uuid[], $4::bigint[], $5::int[], $6::timestamptz[], $7::int[], $8::text[],
                $9::timestamptz[], $10::timestamptz[], $11::int[], $12::text[], $13::bigint[],
                $14::text[], $15::text[], $16::timestamptz[], $17::timestamptz[], $18::int[],
                $19::timestamptz[], $20::timestamptz[])
         AS u(job_id, token, spec_version, ran_for, attempt, last_run, started_at, finished_at,
              status_code, error, lateness_ms, overlap, state, next_run_at, next_for, next_attempt,
              split_at, handed_upto)
      ON u.job_id = l.job_id
    WHERE j.job_id = l.job_id AND l.plain AND l.lease_token = u.token
      AND l.spec_version = u.spec_version AND l.scheduled_for = u.ran_for
      AND l.attempt = u.attempt - 1 AND (u.overlap IS NULL OR l.overlap = u.overlap)
    RETURNING j.job_id, j.shard, u.ran_for, u.attempt, u.started_at, u.finished_at, u.status_code,
              u.error, u.lateness_ms, u.token, l.ran_under
),
done_once AS (
    UPDATE jobs j SET
        state = 'completed', next_run_at = NULL, attempt = u.attempt, split_at = NULL,
        handed_upto = NULL, phase = 'idle', claimed_by = NULL, taken_by = NULL, leased_until = NULL,
        run_until = NULL,
        last_run = u.last_run::jsonb || jsonb_build_object('spec_version', l.ran_under),
        last_success_for = GREATEST(j.last_success_for, u.ran_for),
        updated_at = now()
    FROM locked l
    JOIN unnest($21::uuid[], $22::bigint[], $23::int[], $24::timestamptz[], $25::int[], $26::text[],
                $27::timestamptz[], $28::timestamptz[], $29::int[], $30::text[], $31::bigint[])
         AS u(job_id, token, spec_version, ran_for, attempt, last_run, started_at, finished_at,
              status_code, error, lateness_ms)
      ON u.job_id = l.job_id
    WHERE j.job_id = l.job_id AND l.plain AND l.lease_token = u.token
      AND l.spec_version = u.spec_version AND l.scheduled_for = u.ran_for
      AND l.attempt = u.attempt - 1
    RETURNING j.job_id, j.shard, u.ran_for, u.attempt, u.started_at, u.finished_at, u.status_code,
              u.error, u.lateness_ms, u.token, l.ran_under
),
finished AS (
    SELECT * FROM done UNION ALL SELECT * FROM done_once
),
history AS (
    INSERT INTO runs (job_id, shard, scheduled_for, attempt, started_at, finished_at, outcome,
                      status_code, error, lateness_ms, fencing_token, spec_version)
    SELECT job_id, shard, ran_for, attempt, started_at, finished_at, 'succeeded', status_code, error,
           lateness_ms, token, ran_under
    FROM finished
)
SELECT ARRAY(SELECT o.job_id FROM unnest($3::uuid[] || $21::uuid[]) o(job_id)
             WHERE o.job_id NOT IN (SELECT job_id FROM finished)) AS left_over,
       (SELECT count(*) FROM locked) AS locked;
