-- The per-shard age of the oldest due row no engine has claimed (storage/postgres/due_age.py,
-- the DueAge port; MemoryStore reads its rows the same way).

-- name: oldest_unclaimed_due
-- For each shard of $1, how many seconds the earliest row that is due, scheduled and claimed by
-- no engine has been waiting (0 when none waits). One probe of the jobs_due index per shard
-- (its leading columns are shard, next_run_at, partial on exactly this predicate; "claimed by
-- no engine" is "claimed_by IS NULL", the same rows as phase = 'idle': migration 0010): cheap enough
-- to sample every few seconds. A growing value means due runs nobody fires: no engine serves
-- the shard, or its engines cannot keep up.
SELECT s.shard,
       coalesce(extract(epoch FROM now() - d.next_run_at), 0)::float8 AS age_s
FROM unnest($1::smallint[]) AS s(shard)
LEFT JOIN LATERAL (
    SELECT next_run_at FROM jobs
    WHERE jobs.shard = s.shard AND state = 'scheduled' AND claimed_by IS NULL AND phase = 'idle'
      AND next_run_at <= now()
    ORDER BY next_run_at
    LIMIT 1
) d ON true;
