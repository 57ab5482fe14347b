-- Keyset paging of the saga lists (console and API): the order (started_at, saga_id) and the place of a cursor
-- in it, read through one index however deep the page.
CREATE INDEX IF NOT EXISTS saga_summary_started_idx ON saga.saga_summary (started_at, saga_id);
