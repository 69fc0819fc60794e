-- Unique names per owner (0006): see storage/postgres/names.py.

-- name: lock_name
-- Taken on the home database around the holder check and the write of a create or rename;
-- transaction-scoped, so a pooled connection keeps no lock after the commit.
SELECT pg_advisory_xact_lock($1::int, $2::int);

-- name: name_holder
-- The job (not cancelled) that holds a name on this database: one probe of jobs_owner_name.
SELECT * FROM jobs
WHERE owner = $1 AND spec->>'name' = $2 AND parent_id IS NULL AND state <> 'cancelled';
