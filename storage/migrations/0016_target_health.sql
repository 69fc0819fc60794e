-- Target health (issue 28): what each worker sees of the hosts it calls, per owner, for
-- GET /v1/targets. Used on the home database only (beside owners and api_keys); the table exists
-- on every database because every database gets the full schema.
--
-- A worker writes its view of every (owner, host) it called lately every few seconds, one upsert
-- of arrays (storage/sql/target_health.sql); the list adds up the rows reported in the last two
-- minutes by host (storage/target_rules.py). A worker deletes its own rows it has not repeated
-- for ten minutes at each report; the maintenance service deletes every row older than an hour
-- (workers that never come back).
--
-- host is compared byte by byte (COLLATE "C"): the list's keyset pagination then follows the
-- primary key's order whatever the database's collation, and the same order as the in-memory
-- store's. reported_at is the database's clock, never a worker's, and no index reads it, so the
-- upsert that rewrites a row every few seconds can stay a HOT update (fillfactor leaves room).
-- Numbered 0016: 0015 is flow control's; the runner applies whatever is missing by number, so
-- either may reach a database first.
CREATE TABLE target_health (
    owner             text NOT NULL,
    host              text COLLATE "C" NOT NULL,  -- host:port
    worker            text NOT NULL,
    state             text NOT NULL CHECK (state IN ('healthy', 'degraded', 'backing_off')),
    concurrency_limit integer NOT NULL,
    backoff_until     timestamptz,
    calls_5m          integer NOT NULL,
    timeouts_5m       integer NOT NULL,
    errors_5m         integer NOT NULL,
    reported_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner, host, worker)
) WITH (fillfactor = 70);
-- A worker's own rows, for the delete of those it stopped reporting.
CREATE INDEX target_health_worker ON target_health (worker);
