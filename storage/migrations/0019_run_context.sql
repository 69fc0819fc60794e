-- Run context for targets (issue 30, item 4): every call of a run carries, besides its own
-- occurrence, the newest occurrence of its job that succeeded (Duetime-Last-Success-Scheduled-For)
-- and, for a run that stands for missed occurrences the misfire policy run_once folded into it,
-- the oldest of them (Duetime-Folded-From; the count is schedule math, core.schedule.folded_count).
-- The fence returns both with the row it fences, read from the row itself: a column read, no
-- join and no look into the history per run (the fence is a statement per 500 runs).
--
--   last_success_for  the largest scheduled_for of this job's attempts that succeeded. Written by
--                     the completion that records a success (finish_ordinary, apply_plans, and
--                     for an occurrence row its job's row after the commit: parent_last_run), as
--                     GREATEST(old, new), so a backfilled older occurrence that succeeds later
--                     never moves it back. NULL: none recorded since this migration (a job
--                     that last succeeded before the upgrade shows none until it succeeds again;
--                     filling it from the history would rewrite every row of the table).
--   folded_from       the oldest occurrence run_once folded into the run of folded_into; both are
--   folded_into       written by the fence when it moves the row's occurrence forward (only
--                     run_once's FireNow does: the row's scheduled_for at the fence was the oldest
--                     missed one). The pair describes the row's current occurrence only while
--                     folded_into = scheduled_for, so every retry of that occurrence still carries
--                     it, and nothing has to clear it when the row moves on.
--
-- No index reads these columns: the fence and the completion stay HOT updates (migration 0010).
-- Nullable columns without a default rewrite no row and read none.
ALTER TABLE jobs
    ADD COLUMN last_success_for timestamptz,
    ADD COLUMN folded_from timestamptz,
    ADD COLUMN folded_into timestamptz;
