-- The version and shape each saga started on, in the read model: how many sagas run on each version and shape
-- of their type (`saga definitions`), and what a deploy would change under them (checked at start). Rows
-- written before this migration have none until `saga reproject` rebuilds them.
ALTER TABLE saga.saga_summary ADD COLUMN IF NOT EXISTS definition_version int;
ALTER TABLE saga.saga_summary ADD COLUMN IF NOT EXISTS definition_fingerprint text;
CREATE INDEX IF NOT EXISTS saga_summary_version_idx
    ON saga.saga_summary (saga_type, definition_version, definition_fingerprint, status);

-- Every shape an orchestrator ever registered (SagaDefinition.shape), by fingerprint: what running sagas started
-- on, to name the step-level difference when a deploy would change it.
CREATE TABLE IF NOT EXISTS saga.definition_shapes (
    fingerprint text PRIMARY KEY,
    saga_type text NOT NULL,
    version int NOT NULL,
    shape jsonb NOT NULL,
    first_registered timestamptz NOT NULL DEFAULT now()
);
