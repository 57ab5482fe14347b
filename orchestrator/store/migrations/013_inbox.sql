-- The console's inbox (operations/inbox.py): the sagas that need a human, the longest unchanged first, paged by
-- (updated_at to the millisecond, saga_id). Ordered like this index, a page reads its 50 rows and stops, however
-- many FAILED sagas the months left behind (without it every page sorted all of them). The expression is in UTC
-- so that it is immutable; the predicate holds every row the inbox can take: the states that need a human, and
-- the sagas whose current step (or compensation) failed.
CREATE INDEX IF NOT EXISTS saga_summary_inbox_idx
    ON saga.saga_summary ((date_trunc('milliseconds', updated_at AT TIME ZONE 'UTC')), saga_id)
    WHERE status IN ('FAILED', 'COMPENSATION_FAILED', 'QUARANTINED') OR step_failures > 0;
