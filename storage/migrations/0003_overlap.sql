-- Overlap policy and backfill (issue 7): runs of one recurring job beside each other.
--
-- A job row is also its current run. overlap=allow needs a second run while the first is in
-- flight, and a backfill needs many: each such run gets an *occurrence row* of its own, a row of
-- this same table with parent_id set, so it goes through the same claim, lease, fence, retry,
-- janitor and shard move as any job. Occurrence rows are internal: the API never lists, counts
-- or returns them; their history is written under the parent's id.
ALTER TABLE jobs ADD COLUMN parent_id uuid;
-- overlap=allow: when the row's current run is in flight (running, or waiting for a retry), the
-- next occurrence that must start beside it. Computed by the lifecycle whenever a plan is written.
ALTER TABLE jobs ADD COLUMN split_at timestamptz;
-- The latest occurrence already handed to an occurrence row; the schedule goes on after it.
ALTER TABLE jobs ADD COLUMN handed_upto timestamptz;
-- Backfill under skip/buffer_one: occurrence rows that wait for the one before them to end
-- (next_run_at is null until then); their order.
ALTER TABLE jobs ADD COLUMN backfill_seq bigint;

-- The engine's overlap scan: busy rows whose next occurrence is near. Holds only rows of
-- overlap=allow crons while a run is in flight or waits for a retry: small.
CREATE INDEX jobs_split ON jobs (shard, split_at)
    WHERE split_at IS NOT NULL AND (phase = 'running' OR attempt > 0);
-- A job's occurrence rows (cascading an owner action, releasing the next backfilled run).
CREATE INDEX jobs_parent ON jobs (parent_id, backfill_seq) WHERE parent_id IS NOT NULL;
-- Backfilled runs that wait for the one before them (the janitor's scan for a lost release).
CREATE INDEX jobs_backfill_waiting ON jobs (shard) WHERE parent_id IS NOT NULL AND next_run_at IS NULL;
