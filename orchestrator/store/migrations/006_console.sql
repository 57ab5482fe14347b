-- What the operator's console and the bulk selections read.
-- Where each saga is stuck (orchestrator/domain/trouble.py): the unfinished step with the most failed or
-- timed-out attempts, how many, and the latest one's error type ('timeout' for a timeout). The *wedged* view
-- lists the sagas whose current step failed at least N times, grouped by error.
ALTER TABLE saga.saga_summary ADD COLUMN IF NOT EXISTS current_step text;
ALTER TABLE saga.saga_summary ADD COLUMN IF NOT EXISTS step_failures int NOT NULL DEFAULT 0;
ALTER TABLE saga.saga_summary ADD COLUMN IF NOT EXISTS last_error text;
CREATE INDEX IF NOT EXISTS saga_summary_failures_idx ON saga.saga_summary (step_failures)
    WHERE step_failures > 0;
-- The business keys of each saga: the input fields its definition declares searchable, written once when it
-- starts (never updated: a saga's input does not change).
-- Keyed by value first: a search finds a value in any field, or in one field.
CREATE TABLE IF NOT EXISTS saga.search_keys (
    value   text NOT NULL,
    field   text NOT NULL,
    saga_id text COLLATE "C" NOT NULL,
    PRIMARY KEY (value, field, saga_id)
);
CREATE INDEX IF NOT EXISTS search_keys_saga_idx ON saga.search_keys (saga_id);
-- Every action taken through the console or its HTTP API: who, what, on what, and what came of it. The levers
-- are also recorded in each saga's own stream (OperatorAction); this is the console's own record, which also
-- holds what is not a saga's (a dead letter replayed, a bulk job started).
CREATE TABLE IF NOT EXISTS saga.operator_audit (
    id       bigserial   PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    operator text        NOT NULL,
    action   text        NOT NULL,
    target   text        NOT NULL,
    detail   jsonb       NOT NULL DEFAULT '{}',
    outcome  text        NOT NULL
);
CREATE INDEX IF NOT EXISTS operator_audit_at_idx ON saga.operator_audit (at);
