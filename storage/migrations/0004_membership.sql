-- Membership (issue 11): the engines of the cluster and their heartbeats, so the live engines can
-- deal the 16 logical shards among themselves. Used on the home database (shard 0's) only; the
-- table exists on every database because every database gets the full schema.
CREATE TABLE engines (
    engine_id    text PRIMARY KEY,
    host         text NOT NULL,
    -- The shards this engine may serve (`--shards`; all 16 by default) and the ones it serves now.
    allowed      smallint[] NOT NULL,
    serving      smallint[] NOT NULL DEFAULT '{}',
    -- Its DUETIME_LEASE_S: it is dead once its heartbeat is older than that (database time),
    -- whatever the reader's own setting; and its DUETIME_SHARD_REPLICAS, to spot a mismatch.
    lease_s      double precision NOT NULL,
    replicas     smallint NOT NULL,
    -- A new random value per process: two live processes under one id show up as a fight over it.
    incarnation  uuid NOT NULL,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL
);
