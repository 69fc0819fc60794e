-- Target health (migration 0016): workers' reports of the hosts they call, and GET /v1/targets'
-- list of them (storage/postgres/target_health.py). Home database only. The windows ($n_s) are
-- storage/target_rules.py's, passed in so both stores share one copy.

-- name: report_target_health
-- One worker's reports ($1 the worker; $2-$9 one array per column, one element per (owner, host),
-- no pair twice), written as one upsert that stamps them with the database's clock. With $10, the
-- worker's rows older than $11 seconds are deleted in the same statement: hosts it no longer
-- calls. A row the upsert rewrites is left out of that delete (one statement must not touch a row
-- twice: which of the two changes would stand is not defined).
WITH given AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::int[], $6::timestamptz[],
                         $7::int[], $8::int[], $9::int[])
        AS g(owner, host, state, concurrency_limit, backoff_until, calls_5m, timeouts_5m, errors_5m)
),
written AS (
    INSERT INTO target_health AS t (owner, host, worker, state, concurrency_limit, backoff_until,
                                    calls_5m, timeouts_5m, errors_5m, reported_at)
    SELECT owner, host, $1, state, concurrency_limit, backoff_until, calls_5m, timeouts_5m, errors_5m,
           now()
    FROM given
    ON CONFLICT (owner, host, worker) DO UPDATE SET
        state = EXCLUDED.state,
        concurrency_limit = EXCLUDED.concurrency_limit,
        backoff_until = EXCLUDED.backoff_until,
        calls_5m = EXCLUDED.calls_5m,
        timeouts_5m = EXCLUDED.timeouts_5m,
        errors_5m = EXCLUDED.errors_5m,
        reported_at = now()
    RETURNING 1
),
stale AS (
    DELETE FROM target_health t
    WHERE $10 AND t.worker = $1 AND t.reported_at < now() - make_interval(secs => $11)
      AND NOT EXISTS (SELECT 1 FROM given g WHERE g.owner = t.owner AND g.host = t.host)
    RETURNING 1
)
SELECT (SELECT count(*) FROM written) AS written, (SELECT count(*) FROM stale) AS deleted;

-- name: list_targets
-- The owner's hosts after $2 in host order (the primary key's), from rows reported within $3
-- seconds, at most $4 of them: per host the worst state, the sum of the workers' limits, the
-- latest back-off of those backing off, the sums of the counts.
SELECT host,
       (ARRAY['healthy', 'degraded', 'backing_off'])[
           1 + max(CASE state WHEN 'backing_off' THEN 2 WHEN 'degraded' THEN 1 ELSE 0 END)
       ] AS state,
       sum(concurrency_limit) AS concurrency_limit,
       max(backoff_until) FILTER (WHERE state = 'backing_off') AS backoff_until,
       sum(calls_5m) AS calls_5m,
       sum(timeouts_5m) AS timeouts_5m,
       sum(errors_5m) AS errors_5m
FROM target_health
WHERE owner = $1 AND host > $2 AND reported_at > now() - make_interval(secs => $3)
GROUP BY host
ORDER BY host
LIMIT $4;

-- name: purge_target_health
-- Every row older than $1 seconds: workers that stopped for good (their own next report would
-- have deleted them otherwise). A small table, read whole once a maintenance round.
DELETE FROM target_health WHERE reported_at < now() - make_interval(secs => $1);
