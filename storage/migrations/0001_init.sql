-- Duetime schema, version 1. Applied to every database named in the shard map; owners and API keys
-- are read from the home database only (the first DSN). Never edit this file after it lands:
-- add 0002_… instead.

CREATE TABLE owners (
    owner           text PRIMARY KEY,
    signing_secret  text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- API keys are stored as SHA-256 of the key: a key is 128+ random bits, so a fast hash is enough
-- and lookups stay a single index probe. The clear key is shown once, at creation.
CREATE TABLE api_keys (
    key_hash    bytea PRIMARY KEY,
    key_prefix  text NOT NULL,
    owner       text NOT NULL REFERENCES owners(owner),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_owner ON api_keys (owner);

-- One row per job. The row is also the job's current run: next_run_at says when it is due,
-- scheduled_for which occurrence it is (the Idempotency-Key), attempt how many tries it has had.
-- state is the owner's lifecycle; phase is where the run is in the run path (idle → claimed →
-- running → idle). lease_token is the fencing token: it only grows, one step per lease.
CREATE TABLE jobs (
    job_id          uuid PRIMARY KEY,
    shard           smallint NOT NULL CHECK (shard >= 0 AND shard < 16),
    owner           text NOT NULL,
    spec            jsonb NOT NULL,
    spec_version    integer NOT NULL DEFAULT 1,
    state           text NOT NULL CHECK (state IN ('scheduled','paused','completed','cancelled','dead')),
    phase           text NOT NULL DEFAULT 'idle' CHECK (phase IN ('idle','claimed','running')),
    next_run_at     timestamptz,
    scheduled_for   timestamptz,
    run_kind        text NOT NULL DEFAULT 'scheduled' CHECK (run_kind IN ('scheduled','manual')),
    resume_at       timestamptz,
    pending_triggers timestamptz[] NOT NULL DEFAULT '{}',
    attempt         integer NOT NULL DEFAULT 0,
    lease_token     bigint NOT NULL DEFAULT 0,
    claimed_by      text,
    leased_until    timestamptz,
    last_run        jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 80);

-- "What is due" for one shard: a short range scan over the idle, scheduled rows only.
CREATE INDEX jobs_due ON jobs (shard, next_run_at) WHERE state = 'scheduled' AND phase = 'idle';
-- The janitor's view: leases held, by expiry.
CREATE INDEX jobs_leases ON jobs (shard, leased_until) WHERE phase <> 'idle';
-- An engine's own claims, for the rebuild after a restart.
CREATE INDEX jobs_claimed_by ON jobs (claimed_by) WHERE phase <> 'idle';
-- Listing an owner's jobs in a stable order (UUIDv7 ids are time-ordered).
CREATE INDEX jobs_owner ON jobs (owner, job_id);
CREATE INDEX jobs_owner_state ON jobs (owner, state, job_id);

-- Run history: one row per attempt (and per skipped occurrence). Append-only, written in batches.
CREATE TABLE runs (
    run_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id          uuid NOT NULL,
    shard           smallint NOT NULL,
    scheduled_for   timestamptz NOT NULL,
    attempt         integer NOT NULL,
    started_at      timestamptz,
    finished_at     timestamptz,
    outcome         text NOT NULL CHECK (outcome IN ('succeeded','failed','timed_out','lease_expired','skipped')),
    status_code     integer,
    error           text,
    lateness_ms     bigint,
    fencing_token   bigint
);
CREATE INDEX runs_job ON runs (job_id, run_id DESC);

-- Idempotency-Key records live in the same database as the job they name (the job id is drawn on
-- the key's shard), so the key and the job are written in one transaction.
CREATE TABLE idempotency_keys (
    owner       text NOT NULL,
    key         text NOT NULL,
    body_hash   bytea NOT NULL,
    job_id      uuid NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner, key)
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
