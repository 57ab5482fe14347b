-- A dead letter an operator dismissed: handled without a replay (a record nobody can read, a lever refused that
-- would be stale if sent again, a start made by mistake), with who did it and why. ``dismissed_at_ms`` NULL: never
-- dismissed. A dismissed letter can still be replayed on purpose; the inbox lists the letters neither replayed nor
-- dismissed.
ALTER TABLE saga.dead_letters
    ADD COLUMN IF NOT EXISTS dismissed_at_ms bigint,
    ADD COLUMN IF NOT EXISTS dismissed_by text,
    ADD COLUMN IF NOT EXISTS dismiss_reason text;
-- The inbox: the letters not handled (neither replayed nor dismissed), oldest first.
DROP INDEX IF EXISTS saga.dead_letters_unreplayed_idx;
CREATE INDEX IF NOT EXISTS dead_letters_unhandled_idx ON saga.dead_letters (failed_at_ms, dlq_partition, dlq_offset)
    WHERE replayed_at_ms IS NULL AND dismissed_at_ms IS NULL;
