-- The dead letters on saga.dlq, indexed by the orchestrator (orchestrator/dead_letter_index.py) so that the console,
-- its API and `saga dlq list` answer from one indexed query instead of reading the topic. A row is one record on
-- saga.dlq, at its (partition, offset) there; ``record`` is its value (the letter with the original bytes: a replay
-- publishes from it), the columns beside it what the lists filter and order on. ``failed_at`` is when the letter's
-- record failed (when it was written to saga.dlq, for a record that is no readable letter); ``replayed_at`` when an
-- operator last replayed it (NULL: never; the inbox lists those).
CREATE TABLE IF NOT EXISTS saga.dead_letters (
    dlq_partition int NOT NULL,
    dlq_offset bigint NOT NULL,
    written_at_ms bigint NOT NULL,
    failed_at_ms bigint NOT NULL,
    saga_id text,
    source_topic text,
    reason text,
    record bytea,
    replayed_at_ms bigint,
    PRIMARY KEY (dlq_partition, dlq_offset)
);
-- The lists: newest failure first. The inbox: the letters not replayed, oldest first (the same index, read backwards).
CREATE INDEX IF NOT EXISTS dead_letters_failed_idx ON saga.dead_letters (failed_at_ms, dlq_partition, dlq_offset);
CREATE INDEX IF NOT EXISTS dead_letters_unreplayed_idx ON saga.dead_letters (failed_at_ms, dlq_partition, dlq_offset)
    WHERE replayed_at_ms IS NULL;
CREATE INDEX IF NOT EXISTS dead_letters_saga_idx ON saga.dead_letters (saga_id, failed_at_ms) WHERE saga_id IS NOT NULL;
-- Where the index has read saga.dlq up to, per partition: written in the transaction of the rows it read, so a
-- restart goes on from there (and re-reading a record only rewrites its row).
CREATE TABLE IF NOT EXISTS saga.dead_letter_positions (
    dlq_partition int PRIMARY KEY,
    next_offset bigint NOT NULL
);
