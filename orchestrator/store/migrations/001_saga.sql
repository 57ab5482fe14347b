-- Orchestrator schema: event store, inbox, outbox, durable timers and the saga summary projection.
CREATE SCHEMA IF NOT EXISTS saga;

-- Event store. The primary key is the optimistic-concurrency check: two writers of one saga cannot both
-- append seq N; the loser gets a unique violation and retries from a fresh load.
-- Saga ids are opaque, so they use byte order (COLLATE "C"): cheaper comparisons, and (saga_id, seq) order
-- does not depend on the database's locale.
CREATE TABLE IF NOT EXISTS saga.events (
    saga_id     text        COLLATE "C" NOT NULL,
    seq         bigint      NOT NULL,
    event_type  text        NOT NULL,
    body        bytea       NOT NULL,  -- Avro single-object encoding of the event
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (saga_id, seq)
);

-- Inbox: one row per processed incoming message, written in the same transaction as the events it caused,
-- so a redelivered message is recognised and skipped.
CREATE TABLE IF NOT EXISTS saga.inbox (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
-- Lets a housekeeping job drop old inbox rows by age.
CREATE INDEX IF NOT EXISTS inbox_received_at_idx ON saga.inbox (received_at);

-- Outbox: same shape as outbox.writer.outbox_table_sql('saga'). A queue table (insert, publish, delete),
-- so autovacuum is told to clean it long before the default 20% of dead rows accumulates.
CREATE TABLE IF NOT EXISTS saga.outbox (
    id           bigserial   PRIMARY KEY,
    topic        text        NOT NULL,
    message_key  text        NOT NULL,
    value        bytea       NOT NULL,
    headers      jsonb       NOT NULL,
    message_id   text        NOT NULL,
    available_at timestamptz NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- Durable timers (step timeouts, retry backoff). The scheduler claims due rows with FOR UPDATE SKIP LOCKED.
CREATE TABLE IF NOT EXISTS saga.timers (
    saga_id  text        COLLATE "C" NOT NULL,
    timer_id text        NOT NULL,
    kind     text        NOT NULL,
    step     text        NOT NULL,
    attempt  integer     NOT NULL,
    due_at   timestamptz NOT NULL,
    PRIMARY KEY (saga_id, timer_id)
);
CREATE INDEX IF NOT EXISTS timers_due_at_idx ON saga.timers (due_at);

-- Read model: one row per saga, a projection of its events (rebuildable by replaying saga.events).
CREATE TABLE IF NOT EXISTS saga.saga_summary (
    saga_id     text        COLLATE "C" PRIMARY KEY,
    saga_type   text        NOT NULL,
    tenant_id   text,
    status      text        NOT NULL,
    started_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    last_seq    bigint      NOT NULL,
    failed_step text,
    reason      text
);
-- "sagas in state X, oldest first" (stuck-saga listing) and "sagas of type T".
CREATE INDEX IF NOT EXISTS saga_summary_status_updated_idx ON saga.saga_summary (status, updated_at);
CREATE INDEX IF NOT EXISTS saga_summary_type_idx ON saga.saga_summary (saga_type);
