-- The fence remembers what it fenced (issue 27, observation 3).
--
-- A run in flight stays "running" under its lease while the owner edits the job: a PATCH or PUT
-- that replaces the schedule writes the new plan onto the row at once (the next occurrence,
-- its due time, attempt 0, run kind "scheduled", a new spec_version), and a cancel clears
-- next_run_at. A worker's report carries the run its fence returned, so its completion sees the
-- new spec_version and lets the owner's new plan stand. An attempt whose holder died (the
-- engine's restart, the janitor, the NATS engine's restart) has no report: its expiry built the
-- attempt from the row as the edit had left it, recorded lease_expired for the new schedule's
-- first occurrence, which never ran, and retried that occurrence at once, hours before it was due.
--
-- The fence now writes, in its one UPDATE, the fields of its answer an owner action can change
-- while the row runs, and expiry builds the lapsed attempt from them:
--   fenced_for      the occurrence (scheduled_for as fenced)
--   fenced_due      its due time (next_run_at at the fence)
--   fenced_attempt  the attempts before this one (attempt at the fence)
--   fenced_version  the spec_version the attempt runs under
--   fenced_kind     scheduled or manual (run_kind at the fence: a new schedule resets it)
--   fenced_token    the lease these describe (lease_token at the fence)
-- Not kept: the ids, owner, shard and lease token never change while a row runs; the spec's
-- text is read from the row by every completion, a worker's too (the version tells whether it is
-- the one the attempt ran under); the rest of the row (state, triggers, split point) is the plan
-- the completion goes on from, which must be the row as it is now.
--
-- fenced_token ties the values to their lease: they are this run's only where it equals
-- lease_token, and every lease is a new token (a claim or a retake adds one, and only a claimed row
-- is fenced), so the values an earlier run left are never read. The statements that end a run
-- (apply_plans, finish_ordinary; an occurrence row is deleted) therefore leave them as they are:
-- clearing them would not be enough anyway, since a process of the previous release ends runs
-- without clearing and fences without writing them. With the token, a run fenced before this
-- migration (NULL) or by a process of the previous release (an earlier run's token, if any) is
-- expired from the row's own columns, as before.
--
-- No index reads these columns, so the fence stays a HOT update (migration 0010). Adding
-- nullable columns without a default rewrites no row and reads none.
ALTER TABLE jobs
    ADD COLUMN fenced_token bigint,
    ADD COLUMN fenced_for timestamptz,
    ADD COLUMN fenced_due timestamptz,
    ADD COLUMN fenced_attempt integer,
    ADD COLUMN fenced_version integer,
    ADD COLUMN fenced_kind text;
