-- Flow control (issue 28, `target.flow`): the cluster-wide limits of an owner's flow keys.
--
-- Used on the home database (shard 0's, where owners and API keys are) only: every worker reaches
-- it, so every worker takes from the same bucket whatever shards its runs come from. The tables
-- exist on every database because every database gets the full schema.
--
-- flow_buckets: one token bucket per (owner, key). It refills at the key's rate by the database's
-- clock, up to a tenth of a second of that rate (at least one token: storage/flow_rules.py), so an
-- idle key never bursts much past its rate. Each call started takes one token.
CREATE TABLE flow_buckets (
    owner       text NOT NULL,
    flow_key    text NOT NULL,
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL,
    PRIMARY KEY (owner, flow_key)
);
-- The sweep of idle buckets (a bucket idle for ten minutes is full: deleting it changes nothing).
CREATE INDEX flow_buckets_refilled ON flow_buckets (refilled_at);

-- flow_holders: the slots of a key's parallelism each worker holds (its calls in flight plus what
-- it was just granted), until expires_at: a worker renews them with every ask, and a worker that
-- died gives them back when they lapse. A lapsed row counts for nothing and is swept.
CREATE TABLE flow_holders (
    owner      text NOT NULL,
    flow_key   text NOT NULL,
    worker     text NOT NULL,
    held       integer NOT NULL CHECK (held > 0),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (owner, flow_key, worker)
);
CREATE INDEX flow_holders_expires ON flow_holders (expires_at);

-- duetime_take_flow: one worker's asks, one per (owner, key), as arrays; one row (ask, granted)
-- per ask, ask being its 1-based position. Called by the statement `take_flow`
-- (storage/sql/flow.sql; storage/postgres/flow.py), one round trip for all of a worker's keys.
--
-- Why a function and not one statement: a statement reads every table under the snapshot it took
-- when it began. A worker that waited for another's lock on a key's bucket would then count the
-- holders as they were before the other committed, and both could fill the same free slots. Here
-- each statement takes a new snapshot (a VOLATILE function under READ COMMITTED), so the holders
-- are counted after the bucket is locked, with every earlier taker's rows in view.
--
-- Keys are locked in (owner, key) order, by byte (COLLATE "C"), whatever order the asks came in:
-- two workers asking for overlapping keys wait for each other, never deadlock. The sweep at the
-- end only takes rows nobody holds (SKIP LOCKED), so it never waits either.
--
-- Changing what it does means a new migration with CREATE OR REPLACE FUNCTION, and
-- storage/memory.py's take_flow changed alike (tests/contract/test_flow_contract.py).
CREATE FUNCTION duetime_take_flow(
    p_worker text,
    p_owners text[],
    p_keys text[],
    p_rates double precision[],
    p_capacities double precision[],
    p_parallelisms integer[],
    p_wants integer[],
    p_runnings integer[],
    p_hold_s double precision
) RETURNS TABLE (ask integer, granted integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    a record;
    v_tokens double precision;
    v_others integer;
    v_granted integer;
BEGIN
    FOR a IN
        SELECT u.owner, u.flow_key, u.rate, u.capacity, u.parallelism, u.want, u.running, u.ord
        FROM unnest(p_owners, p_keys, p_rates, p_capacities, p_parallelisms, p_wants, p_runnings)
             WITH ORDINALITY AS u(owner, flow_key, rate, capacity, parallelism, want, running, ord)
        ORDER BY u.owner COLLATE "C", u.flow_key COLLATE "C"
    LOOP
        -- Lock the bucket (making it, full, the first time) and refill it. A refill by a clock
        -- read before the previous one's (this call waited for the lock) adds nothing and leaves
        -- refilled_at where it was, so no interval is counted twice.
        INSERT INTO flow_buckets AS b (owner, flow_key, tokens, refilled_at)
        VALUES (a.owner, a.flow_key, a.capacity, now())
        ON CONFLICT (owner, flow_key) DO UPDATE SET
            tokens = least(
                a.capacity,
                b.tokens + a.rate * greatest(0, extract(epoch FROM now() - b.refilled_at)::double precision)
            ),
            refilled_at = greatest(b.refilled_at, now())
        RETURNING b.tokens INTO v_tokens;

        SELECT coalesce(sum(h.held), 0)::integer INTO v_others
        FROM flow_holders h
        WHERE h.owner = a.owner AND h.flow_key = a.flow_key AND h.worker <> p_worker
          AND h.expires_at > now();

        v_granted := greatest(
            0, least(a.want, floor(v_tokens)::integer, a.parallelism - v_others - a.running)
        );
        IF v_granted > 0 THEN
            UPDATE flow_buckets SET tokens = tokens - v_granted
            WHERE owner = a.owner AND flow_key = a.flow_key;
        END IF;

        IF a.running + v_granted > 0 THEN
            INSERT INTO flow_holders (owner, flow_key, worker, held, expires_at)
            VALUES (a.owner, a.flow_key, p_worker, a.running + v_granted,
                    now() + make_interval(secs => p_hold_s))
            ON CONFLICT (owner, flow_key, worker) DO UPDATE SET
                held = excluded.held, expires_at = excluded.expires_at;
        ELSE
            DELETE FROM flow_holders
            WHERE owner = a.owner AND flow_key = a.flow_key AND worker = p_worker;
        END IF;

        ask := a.ord;
        granted := v_granted;
        RETURN NEXT;
    END LOOP;

    -- Lapsed holders (a worker that stopped asking) and buckets idle long enough to be full.
    DELETE FROM flow_holders h
    USING (
        SELECT owner, flow_key, worker FROM flow_holders
        WHERE expires_at <= now()
        ORDER BY expires_at LIMIT 100
        FOR UPDATE SKIP LOCKED
    ) lapsed
    WHERE (h.owner, h.flow_key, h.worker) = (lapsed.owner, lapsed.flow_key, lapsed.worker);
    DELETE FROM flow_buckets b
    USING (
        SELECT owner, flow_key FROM flow_buckets
        WHERE refilled_at < now() - interval '600 seconds'
        ORDER BY refilled_at LIMIT 100
        FOR UPDATE SKIP LOCKED
    ) idle
    WHERE (b.owner, b.flow_key) = (idle.owner, idle.flow_key);
END
$$;
