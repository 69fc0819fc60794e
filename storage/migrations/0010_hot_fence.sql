-- The fence and the heartbeats as HOT updates (issue 16).
--
-- PostgreSQL can update a row "HOT" (heap-only: a new version on the same page, no index entry)
-- only when the update changes no column that any index reads, in its key or its predicate.
-- The fence (claimed -> running) set "phase", read by the predicates of jobs_due and jobs_split,
-- and "leased_until", the key of jobs_leases; every fence and every heartbeat therefore wrote a
-- new entry in all six indexes of the row (jobs_pkey, jobs_owner, jobs_owner_state, jobs_leases,
-- jobs_claimed_by, and jobs_due or jobs_split where the row was in them): ~24 us of a fence's
-- ~33 us per row, and 7 WAL records (docs/performance.md, eighth session).
--
-- 1. The lease of a running run gets a column of its own that no index reads: run_until. The
--    fence and the heartbeats of running rows set it and leave leased_until as the claim set it
--    (the row's due time plus the lease). leased_until stays the janitor's index key: a running
--    row whose leased_until has passed is looked at, and rescued only if run_until has passed
--    too. A run that outlives its claim's lease (a slow target) has its leased_until carried up
--    to its run_until by the janitor (carry_run_leases), once per lease period, so the janitor's
--    scan does not walk the same live runs again and again: a write per long run per lease
--    period, where every heartbeat of every run was one before.
ALTER TABLE jobs ADD COLUMN run_until timestamptz;
-- Rows running at the upgrade keep the lease they hold.
UPDATE jobs SET run_until = leased_until WHERE phase = 'running';

-- 2. "Idle" for the indexes is "held by nobody": a row is idle exactly when claimed_by is null
--    (every statement that sets one sets the other; the constraint makes that a rule the
--    database keeps, so an index predicate can stand in for the phase).
ALTER TABLE jobs ADD CONSTRAINT jobs_idle_iff_unheld CHECK ((phase = 'idle') = (claimed_by IS NULL));

-- 3. The two indexes whose predicates read the phase, on columns the fence does not set.
--    jobs_due: the same rows as before (scheduled and idle). jobs_split: every overlap=allow cron
--    row rather than only the busy ones; the engine's overlap scan (overlap_due) keeps its phase
--    test, and an idle row's split_at is an occurrence after its next due one, so the scan's
--    range ("split_at <= now + horizon") meets it only when that row is late anyway.
DROP INDEX jobs_due;
CREATE INDEX jobs_due ON jobs (shard, next_run_at) WHERE state = 'scheduled' AND claimed_by IS NULL;
DROP INDEX jobs_split;
CREATE INDEX jobs_split ON jobs (shard, split_at) WHERE split_at IS NOT NULL;
