-- Owners at scale (issue 12): unique names, labels, and what retention deletes by.
--
-- Names and labels live in the spec (spec->>'name', spec->'labels'), as every other field an
-- owner sets does: the codec, the PATCH merge, occurrence rows and shard moves carry them with no
-- new column to keep in step. The name's index is on that expression; labels get a table of
-- their own, kept by triggers (section 3).

-- 1. Existing duplicate names. Until now a name was a free label, so an owner may have several
-- jobs (not cancelled) of one name. The oldest of each group (created_at, then id) keeps the
-- name; every other one is renamed to "<name>:dup-<its job id>" (the name cut to 159 characters
-- so the result stays within 200): nothing is lost, the renamed jobs still run, and the owner
-- can find them with name_prefix and rename or cancel them. Occurrence rows carry a copy of
-- their job's spec and are renamed with it. Names that do not fit the new grammar (spaces,
-- other scripts) are left as they are: they stay readable, and the next PATCH or PUT of such a
-- job has to give it a valid name.
WITH ranked AS (
    SELECT job_id,
           row_number() OVER (PARTITION BY owner, spec->>'name' ORDER BY created_at, job_id) AS n
    FROM jobs
    WHERE parent_id IS NULL AND state <> 'cancelled' AND spec->>'name' IS NOT NULL
), renamed AS (
    UPDATE jobs j
    SET spec = jsonb_set(j.spec, '{name}',
                         to_jsonb(left(j.spec->>'name', 159) || ':dup-' || j.job_id::text)),
        updated_at = now()
    FROM ranked r
    WHERE j.job_id = r.job_id AND r.n > 1
    RETURNING j.job_id, j.spec->'name' AS name
)
UPDATE jobs c SET spec = jsonb_set(c.spec, '{name}', renamed.name)
FROM renamed WHERE c.parent_id = renamed.job_id;

-- 2. A name is unique per owner among jobs that are not cancelled. Within one database this
-- index is the guarantee; across databases (DUETIME_SHARD_DSNS) the store takes a lock per
-- (owner, name) on the home database around the check and the write (docs/architecture.md).
-- It also serves GET /v1/jobs/by-name/{name}.
CREATE UNIQUE INDEX jobs_owner_name ON jobs (owner, (spec->>'name'))
    WHERE parent_id IS NULL AND state <> 'cancelled' AND spec->>'name' IS NOT NULL;

-- 3. Labels: one row per (owner, key, value, job) in job_labels, kept by triggers on jobs, so
-- "the owner's jobs with team=billing after this cursor, by id" is one range scan of its primary
-- key however many jobs the owner or the label has, and a page of 100 reads about 100 rows. A
-- GIN index on spec->'labels' was measured first and dropped: it cannot hold the owner, so a
-- label most owners use ("all=1", "env=prod") made each page read every matching row of every
-- owner into a bitmap and sort it (587 ms a page at 400,000 jobs; docs/performance.md).
-- Further pairs of a selector are checked on the job row (spec->'labels' @> …).
-- Occurrence rows (parent_id set) carry a copy of the spec and are never listed: not indexed.
CREATE TABLE job_labels (
    owner   text NOT NULL,
    key     text NOT NULL,
    value   text NOT NULL,
    job_id  uuid NOT NULL,
    PRIMARY KEY (owner, key, value, job_id)
);
INSERT INTO job_labels (owner, key, value, job_id)
SELECT j.owner, e.key, e.value, j.job_id
FROM jobs j, jsonb_each_text(j.spec->'labels') e
WHERE j.parent_id IS NULL AND jsonb_typeof(j.spec->'labels') = 'object';

-- Inserts and deletes are kept per statement, from its transition table: a batch of 500 creates
-- (or a COPY, or a shard move) costs one INSERT … SELECT here, not 500 trigger calls.
CREATE FUNCTION duetime_job_labels_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_labels (owner, key, value, job_id)
    SELECT n.owner, e.key, e.value, n.job_id
    FROM added n, jsonb_each_text(n.spec->'labels') e
    WHERE n.parent_id IS NULL AND jsonb_typeof(n.spec->'labels') = 'object'
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_labels_added AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION duetime_job_labels_added();

CREATE FUNCTION duetime_job_labels_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_labels l
    USING removed o, jsonb_each_text(o.spec->'labels') e
    WHERE o.parent_id IS NULL AND jsonb_typeof(o.spec->'labels') = 'object'
      AND l.owner = o.owner AND l.key = e.key AND l.value = e.value AND l.job_id = o.job_id;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_labels_removed AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION duetime_job_labels_removed();

-- An update changes labels only through an owner's PATCH or PUT (the run path never sets spec):
-- a row trigger on "UPDATE OF spec" that fires only when the labels differ costs the run path
-- nothing.
CREATE FUNCTION duetime_job_labels_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_labels l
    USING jsonb_each_text(OLD.spec->'labels') e
    WHERE jsonb_typeof(OLD.spec->'labels') = 'object'
      AND l.owner = OLD.owner AND l.key = e.key AND l.value = e.value AND l.job_id = OLD.job_id;
    INSERT INTO job_labels (owner, key, value, job_id)
    SELECT NEW.owner, e.key, e.value, NEW.job_id
    FROM jsonb_each_text(NEW.spec->'labels') e
    WHERE jsonb_typeof(NEW.spec->'labels') = 'object'
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_labels_changed AFTER UPDATE OF spec ON jobs FOR EACH ROW
    WHEN (OLD.parent_id IS NULL AND OLD.spec->'labels' IS DISTINCT FROM NEW.spec->'labels')
    EXECUTE FUNCTION duetime_job_labels_changed();

-- 4. Retention. Finished jobs by the time they last changed (a finished job changes no more, so
-- updated_at is when it finished); only these rows, so the index stays small and is never
-- written on the run path (a row enters it once, when it finishes).
CREATE INDEX jobs_finished ON jobs (updated_at)
    WHERE parent_id IS NULL AND state IN ('completed', 'cancelled', 'dead');
-- A deleted job's Idempotency-Keys go with it.
CREATE INDEX idempotency_keys_job ON idempotency_keys (job_id);
-- Run history is deleted oldest first in run_id order (the primary key; ids grow with time), so
-- it needs no index of its own and the run path writes no extra index entry per attempt.
