-- Fencing tokens that never repeat across a failover (issue 27, item 7).
--
-- A row's lease token grows by one at every claim. After a failover to an asynchronous standby,
-- the last transactions of the old primary may be lost: a row comes back with an older token, the
-- next claim issues a token the old primary had already given out, and a process still holding
-- that token (a worker whose call is in flight) passes the fence and records its outcome under the
-- new lease: two holders of one token.
--
-- Every promotion (and every point-in-time recovery) starts a new timeline, and the timeline of
-- the WAL being written is in the name of the current WAL file. The claims set a token of at least
-- (timeline - 1) << 40: on the first timeline nothing changes; after a promotion every token is
-- above any the old timeline could have issued (2^40 claims of one row per timeline is beyond
-- reach), so tokens stay strictly increasing per row across failovers with lost transactions.
-- The function is read once per claim statement (an InitPlan), not per row.
CREATE FUNCTION duetime_token_floor() RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT ((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint) - 1) << 40
$$;
