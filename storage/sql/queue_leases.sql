-- DUETIME_RUN_QUEUE=nats: leases of published runs (storage/postgres/queue_leases.py).
-- Loaded by name by storage/queries.py; names are unique across storage/sql/*.sql.

-- name: take_runs
-- DUETIME_RUN_QUEUE=nats: a worker takes over runs an engine fenced and published. The row must
-- still be running under the same token, held by the engine that published it and taken by no
-- worker; from here the worker holds the lease. A second delivery of the same message (broker
-- redelivery, another worker) finds it taken and takes nothing, so a message is called at most
-- once per token. The taker goes to taken_by, which no index reads, and claimed_by keeps the
-- publisher: the take is a HOT update, as the fence is (migration 0012; it set claimed_by, read by
-- two indexes, and wrote an entry into every index of the row).
--
-- The rows are locked in job id order before the update, by primary key. An engine's
-- extend_published runs on the same rows at the same time; when each locked in the order of its
-- own array (message order here, fence order there) the two deadlocked in a 20,000-run burst:
-- both waited deadlock_timeout, one was aborted, and an aborted heartbeat let published leases
-- lapse (thousands of runs retried as lease_expired).
-- "claimed_by IS NOT DISTINCT FROM" (the publisher is never NULL) rather than "=": "=" implies
-- the holder index's predicate (claimed_by IS NOT NULL), and with statistics from before a burst
-- the planner then scans every row the engine holds once per locked row (seconds per batch).
-- The whole batch is locked behind the gate of fence_runs (storage/sql/runpath.sql), and the
-- guards are read from the rows as locked, as there: put on "jobs" in the update, statistics from
-- before a burst made the planner compare every job with every run of the batch.
WITH locked AS MATERIALIZED (
    SELECT j.job_id, j.lease_token, j.phase, j.claimed_by, j.taken_by, u.token, u.publisher
    FROM unnest($1::uuid[], $2::bigint[], $3::text[]) AS u(job_id, token, publisher)
    JOIN jobs j ON j.job_id = u.job_id
    ORDER BY j.job_id
    FOR UPDATE OF j
)
UPDATE jobs j SET taken_by = $4, run_until = now() + make_interval(secs => $5)
FROM locked l
WHERE (SELECT count(*) FROM locked) >= 0  -- the gate: all of the batch locked first
  AND j.job_id = l.job_id AND l.lease_token = l.token
  AND l.phase = 'running' AND l.claimed_by IS NOT DISTINCT FROM l.publisher AND l.taken_by IS NULL
RETURNING j.job_id, j.lease_token;

-- name: extend_published
-- An engine keeps the leases of runs it published alive until a worker takes them (taken_by is
-- set) or they are finished; what this does not return is no longer the engine's to keep.
-- Locked in job id order first, by primary key (see take_runs), behind the gate of fence_runs,
-- and updated by primary key; the guards are read from the rows as locked, as in fence_runs.
-- A running row's lease is run_until (migration 0010): this is a HOT update.
WITH locked AS MATERIALIZED (
    SELECT j.job_id, j.lease_token, j.phase, j.claimed_by, j.taken_by, u.token
    FROM unnest($1::uuid[], $2::bigint[]) AS u(job_id, token)
    JOIN jobs j ON j.job_id = u.job_id
    ORDER BY j.job_id
    FOR UPDATE OF j
)
UPDATE jobs j SET run_until = now() + make_interval(secs => $4)
FROM locked l
WHERE (SELECT count(*) FROM locked) >= 0  -- the gate: all of the batch locked first
  AND j.job_id = l.job_id AND l.lease_token = l.token
  AND l.phase = 'running' AND l.claimed_by IS NOT DISTINCT FROM $3 AND l.taken_by IS NULL
RETURNING j.job_id;

-- name: published_of_engine
-- A restarted engine (DUETIME_RUN_QUEUE=nats) finishes the runs its previous life fenced and no
-- worker has taken yet. Locked as they are selected: a row a worker takes at the same moment
-- either is skipped (its take holds the lock) or no longer matches (taken_by is set).
SELECT job_id FROM jobs
WHERE claimed_by = $1 AND phase = 'running' AND shard = ANY($2::smallint[]) AND taken_by IS NULL
FOR UPDATE SKIP LOCKED;
