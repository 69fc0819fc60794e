-- The worker's take as a HOT update (issue 16).
--
-- DUETIME_RUN_QUEUE=nats: a worker that takes a published run became its holder by setting
-- claimed_by from the publishing engine's id to its own. claimed_by is read by two indexes
-- (jobs_claimed_by's key, jobs_due's predicate), so every take wrote a new entry into every index
-- of the row, at random places: in a 100,000-run cluster burst the take was 28.5 us of
-- PostgreSQL's ~82 us per run and one of the three things a run costs in a cluster that it does
-- not cost in one process (docs/performance.md, eleventh session).
--
-- The worker that took a run gets a column of its own that no index reads: taken_by. claimed_by
-- stays the publishing engine's until the run is over. A published run is the engine's to keep
-- while taken_by is null (extend_published, and on its restart published_of_engine and
-- running_of_engine); a take requires it null, so a message delivered twice still takes nothing
-- the second time. Set only while running: every statement that ends a run clears it, and the
-- check below makes that a rule the database keeps.
--
-- Rows taken before the upgrade keep a worker's id in claimed_by and no taken_by: no statement
-- of this release mistakes them for published runs (those require claimed_by to be the engine's).
ALTER TABLE jobs ADD COLUMN taken_by text;
ALTER TABLE jobs ADD CONSTRAINT jobs_taken_only_running CHECK (taken_by IS NULL OR phase = 'running');
