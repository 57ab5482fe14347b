-- Rows of saga.outbox the broker refused for good (a record over the topic's limit, a topic it refuses),
-- kept with the reason. While a saga has a parked row its later rows wait behind it (their order kept);
-- every other saga's rows go on. `saga outbox` lists, requeues and discards them.
CREATE TABLE IF NOT EXISTS saga.outbox_parked (
    id           bigint      PRIMARY KEY,
    topic        text        NOT NULL,
    message_key  text        NOT NULL,
    value        bytea       NOT NULL,
    headers      jsonb       NOT NULL,
    message_id   text        NOT NULL,
    available_at timestamptz NOT NULL,
    created_at   timestamptz NOT NULL,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    reason       text        NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_parked_key ON saga.outbox_parked (message_key);
