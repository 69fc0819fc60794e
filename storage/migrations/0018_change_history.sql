-- Change history (issue 30, item 1): one record per change of a job, and the spec version each
-- run ran under.
--
-- jobs.spec_revision is the job's spec_version as the API shows it: 1 at create, one more for
-- each change that altered the spec. It is not jobs.spec_version, which is internal (it bumps
-- only when the schedule or jitter changes, and fences completions against such an edit: 0013);
-- the two count different things and neither can stand in for the other. Every job starts at 1
-- here: no history was kept before.
--
-- jobs.fenced_revision is spec_revision as the fence found it, under fenced_token like the other
-- fenced_* columns (0013): the version a run ran under, which a PATCH during the call must not
-- change. No index reads either column, so the fence stays a HOT update (0010); a constant
-- default and a nullable column rewrite no row.
ALTER TABLE jobs
    ADD COLUMN spec_revision integer NOT NULL DEFAULT 1,
    ADD COLUMN fenced_revision integer;

-- Each history row's version (what the fence recorded, or the job's version when an occurrence
-- was skipped). Rows from before read 1, the version every job has after this migration.
ALTER TABLE runs ADD COLUMN spec_version integer NOT NULL DEFAULT 1;

-- The records. Written in the transaction of the change (storage/sql/changes.sql), on the job's
-- own database, numbered per job from 1 (the job's row lock orders every writer of one job), read
-- newest first by the primary key. They live as long as their job: retention deletes them with
-- the job's other rows, a shard move moves them (shard is the job's; the move scans, as it
-- scans runs: no index is written per change for it). diff holds no secret: the
-- values of target headers are redacted before they get here (core/changes.py).
CREATE TABLE job_changes (
    job_id       uuid NOT NULL,
    seq          integer NOT NULL,
    shard        smallint NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    actor        text NOT NULL CHECK (actor IN ('owner', 'duetime')),
    key_id       text,
    action       text NOT NULL CHECK (action IN ('create', 'update', 'replace', 'pause', 'resume',
                                                 'cancel', 'trigger', 'backfill', 'replay',
                                                 'auto_pause', 'auto_resume')),
    reason       text,
    spec_version integer NOT NULL,
    diff         jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (job_id, seq)
);
