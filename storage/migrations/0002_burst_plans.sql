-- Keep the run path's statements on the primary key during a burst.
--
-- jobs_leases and jobs_claimed_by were partial on "phase <> 'idle'". Every fence, heartbeat and
-- release names a phase ("phase = 'claimed'", "phase <> 'idle'"), which implies that predicate,
-- so the planner may read either index whole as "the few leased rows" and hash-join the batch
-- against it. Its statistics come from before the burst, when almost nothing was leased; in the
-- burst a million rows are, and each 500-row fence scanned all of them (60 ms at 30,000 claimed,
-- seconds at a million, growing with the wheel). Keyed on "leased_until / claimed_by IS NOT
-- NULL" instead, the indexes hold the same rows (a leased row has both, an idle row neither) and
-- still serve the janitor ("leased_until < now()") and an engine's restart ("claimed_by = $1"),
-- but nothing on the run path implies their predicates: a batch is joined on the primary key.
DROP INDEX jobs_leases;
CREATE INDEX jobs_leases ON jobs (shard, leased_until) WHERE leased_until IS NOT NULL;
DROP INDEX jobs_claimed_by;
CREATE INDEX jobs_claimed_by ON jobs (claimed_by) WHERE claimed_by IS NOT NULL;
