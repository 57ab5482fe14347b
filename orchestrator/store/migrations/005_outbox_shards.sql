-- The outbox's shards (outbox/lease.py): each row records its saga's partition, and a relay publishes a
-- shard's rows only while it holds the shard's lease, so every orchestrator instance relays the sagas of its
-- own partitions and a relay cut off from Postgres is replaced after the lease's expiry. Rows written before
-- this column are in shard 0. Same DDL as outbox.table.shards_sql('saga').
ALTER TABLE saga.outbox ADD COLUMN IF NOT EXISTS shard int NOT NULL DEFAULT 0;
ALTER TABLE saga.outbox_parked ADD COLUMN IF NOT EXISTS shard int NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS saga.outbox_leases (
    shard      int         PRIMARY KEY,
    holder     text        NOT NULL,
    epoch      bigint      NOT NULL,
    locked     boolean     NOT NULL,
    expires_at timestamptz NOT NULL
);
