-- Pause with a note, until a time (issue 30, item 3).
--
-- What the pause of a paused job said, shown as the Job's "paused" object: when it paused, the
-- owner's note, until when, and who paused it (an owner's key, or Duetime itself for
-- pause_after_failures). Set by the statements that pause a job (write_job, bulk_write_state,
-- pause_failing_jobs), cleared by those of an owner that take it out of paused; shown only while
-- the job is paused, so a value a completion left behind is never read. Only a job's own row has
-- them. A job paused before this migration shows "at": null and an owner as its actor. No
-- statement of the run path writes these columns (its updates stay HOT, 0010); nullable columns
-- without a default rewrite no row and read none.
ALTER TABLE jobs
    ADD COLUMN paused_at timestamptz,
    ADD COLUMN pause_note text,
    ADD COLUMN paused_until timestamptz,
    ADD COLUMN paused_by text CHECK (paused_by IN ('owner', 'duetime')),
    ADD COLUMN paused_key_id text;

-- When a pause ends: one row per pause given an "until", on the job's database, written in the
-- pause's transaction. The engines serving a shard read its ended ones in time order
-- (end_pauses, storage/sql/pauses.sql) and resume the jobs still paused until then; the row is
-- only a wake-up, the job's own row says whether its pause really ended (a resume, or a new pause,
-- may have come since), and each row is deleted in the transaction that looked at it, whatever
-- became of its job (one resumed, cancelled or deleted by retention meanwhile included). A shard
-- move moves them. A table of
-- its own rather than an index on jobs: it holds only pauses with an end, and this migration
-- builds nothing over the jobs table, however large.
CREATE TABLE pause_ends (
    shard  smallint NOT NULL,
    until  timestamptz NOT NULL,
    job_id uuid NOT NULL,
    PRIMARY KEY (shard, until, job_id)
);
