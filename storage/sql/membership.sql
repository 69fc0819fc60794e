-- Membership of the engines (migration 0004), on the home database. Loaded by storage/queries.py
-- with the other named statements; used by storage/postgres/membership.py. All times are database time.

-- name: join_engine
-- A (re)start: the same id is the same member, with a new incarnation and started_at.
INSERT INTO engines (engine_id, host, allowed, serving, lease_s, replicas, incarnation, started_at, heartbeat_at)
VALUES ($1, $2, $3, '{}', $4, $5, $6, now(), now())
ON CONFLICT (engine_id) DO UPDATE
SET host = EXCLUDED.host, allowed = EXCLUDED.allowed, serving = '{}', lease_s = EXCLUDED.lease_s,
    replicas = EXCLUDED.replicas, incarnation = EXCLUDED.incarnation, started_at = now(),
    heartbeat_at = now();

-- name: heartbeat_engine
-- Only this process's own row: a row another process took over (same id) is not refreshed.
UPDATE engines SET heartbeat_at = now(), serving = $3
WHERE engine_id = $1 AND incarnation = $2
RETURNING engine_id;

-- name: set_engine_serving
UPDATE engines SET serving = $3 WHERE engine_id = $1 AND incarnation = $2;

-- name: leave_engine
DELETE FROM engines WHERE engine_id = $1 AND incarnation = $2;

-- name: list_engines
-- Every member, live or not, with its heartbeat's age by the database's clock.
SELECT engine_id, host, allowed, serving, lease_s, replicas, incarnation, started_at, heartbeat_at,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_s,
       heartbeat_at > now() - make_interval(secs => lease_s) AS live
FROM engines
ORDER BY engine_id;

-- name: forget_dead_engines
-- Members silent for longer than $1 seconds and than their own lease (so dead) are forgotten
-- (they re-join if they ever come back).
DELETE FROM engines WHERE heartbeat_at < now() - make_interval(secs => greatest(lease_s, $1::float8));

-- name: lock_engine_id
-- One live process per engine id: a session-level advisory lock on the home database, taken at
-- start on a connection of its own and held for the process's life. It goes with the session: at
-- once when the process dies (its socket is closed by the kernel), after the keepalives when its
-- host or network vanished; never while the process lives, even frozen.
SELECT pg_try_advisory_lock(hashtextextended('duetime-engine:' || $1, 0));

-- name: unlock_engine_id
SELECT pg_advisory_unlock(hashtextextended('duetime-engine:' || $1, 0));

-- name: engine_id_lock_alive
-- The lock's connection still answers (so its session, and the lock, live).
SELECT 1;
