-- The failure events' outbox (migration 0009; storage/postgres/events.py): claimed, settled and
-- retired by the delivery service (workers/events.py). The completion writer inserts the rows
-- (insert_failure_events, completion.sql).

-- name: claim_failure_events
-- Up to $1 due events, skipping rows another process is claiming; the claim is the lease: it
-- moves next_attempt_at $2 seconds on (a holder that dies lets it come due again) and counts the
-- attempt, whose number then fences the settle.
UPDATE failure_events e SET
    next_attempt_at = now() + make_interval(secs => $2),
    attempts = e.attempts + 1
FROM (
    SELECT event_seq FROM failure_events
    WHERE gave_up_at IS NULL AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
) due
WHERE e.event_seq = due.event_seq
RETURNING e.event_seq, e.event_id, e.job_id, e.owner, e.type, e.scheduled_for, e.fencing_token,
          e.target, e.body, e.attempts;

-- name: delete_delivered_events
-- Delivered: the row goes, unless another holder took it over after our lease ran out.
DELETE FROM failure_events e
USING unnest($1::bigint[], $2::int[]) AS u(seq, attempts)
WHERE e.event_seq = u.seq AND e.attempts = u.attempts;

-- name: retry_failure_events
-- Not delivered: the next attempt at $3 (the default retry policy), or given up ($3 null).
UPDATE failure_events e SET
    next_attempt_at = COALESCE(u.next_at, e.next_attempt_at),
    gave_up_at = CASE WHEN u.next_at IS NULL THEN now() END,
    last_error = u.error
FROM unnest($1::bigint[], $2::int[], $3::timestamptz[], $4::text[]) AS u(seq, attempts, next_at, error)
WHERE e.event_seq = u.seq AND e.attempts = u.attempts;

-- name: retention_given_up_events
-- Events given up on before $1, the oldest $2 of them.
DELETE FROM failure_events WHERE event_seq IN (
    SELECT event_seq FROM failure_events
    WHERE gave_up_at IS NOT NULL AND gave_up_at < $1
    ORDER BY gave_up_at LIMIT $2
);
