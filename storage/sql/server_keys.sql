-- Server keys (migration 0017): the installation's own secrets, by name
-- (storage/postgres/server_keys.py). Home database only.

-- name: offer_server_key
-- $2 becomes the key named $1 unless one is there already (a concurrent first start's, or an
-- earlier one's): this process's candidate is then dropped and server_key reads the winner.
INSERT INTO server_keys (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING;

-- name: server_key
-- A statement of its own, after the insert: its snapshot is taken once a concurrent insert that
-- made ours do nothing has committed, so it sees that row (a CTE of the same statement would not).
SELECT value FROM server_keys WHERE name = $1;
