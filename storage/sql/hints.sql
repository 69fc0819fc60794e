-- NOTIFY hints that wake a shard's engines (storage/postgres/hints.py).
-- Loaded by name by storage/queries.py; names are unique across storage/sql/*.sql.

-- name: notify_due
SELECT pg_notify('duetime_due', s) FROM unnest($1::text[]) AS s;
