-- The partition of a timer's saga (its key's partition on every topic the orchestrator reads), so that the
-- instance that owns the partition fires it against its own read horizon (orchestrator/timers.py). NULL:
-- armed before this column, or by a store that does not know the partition count: any instance fires it.
ALTER TABLE saga.timers ADD COLUMN IF NOT EXISTS partition int;
CREATE INDEX IF NOT EXISTS timers_partition_due ON saga.timers (partition, due_at);
