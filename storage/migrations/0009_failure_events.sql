-- Failure handling (on_failure, pause_after_failures): what a job counts, and the outbox of the
-- events it sends.
--
-- A job row counts its consecutive failed occurrences and remembers whether it sent
-- job.failing (and job.recovered not yet). Both are written by the completion writer in the
-- transaction that records an occurrence's last attempt, and only for jobs that ask for failure
-- handling (core/failures.py): the defaults cost other jobs nothing.
ALTER TABLE jobs ADD COLUMN consecutive_failures integer NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN failing boolean NOT NULL DEFAULT false;

-- The outbox: one row per event, inserted in that same transaction, so an event exists exactly
-- when the count that caused it was committed. The delivery service (workers/events.py) claims
-- due rows with SKIP LOCKED, leasing them by moving next_attempt_at past the call, delivers each
-- to its target, deletes it once delivered, and on failure sets the next attempt by the default
-- retry policy; an event whose attempts ran out keeps its row with gave_up_at set (for an
-- operator to look at) until run retention deletes it.
CREATE TABLE failure_events (
    event_seq       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        text NOT NULL,          -- <job id>:<scheduled_for>:<type>, the webhook-id
    job_id          uuid NOT NULL,
    shard           smallint NOT NULL,
    owner           text NOT NULL,
    type            text NOT NULL CHECK (type IN ('job.failing', 'job.paused', 'job.recovered')),
    scheduled_for   timestamptz NOT NULL,
    fencing_token   bigint NOT NULL DEFAULT 0,
    target          jsonb NOT NULL,
    body            jsonb NOT NULL,
    attempts        integer NOT NULL DEFAULT 0, -- delivery attempts started (the claim counts one)
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    gave_up_at      timestamptz
);
-- What is due: a short range scan over the rows still to deliver.
CREATE INDEX failure_events_due ON failure_events (next_attempt_at) WHERE gave_up_at IS NULL;
-- Retention of the rows given up on.
CREATE INDEX failure_events_gave_up ON failure_events (gave_up_at) WHERE gave_up_at IS NOT NULL;
