-- Bulk operations (orchestrator/bulk_jobs.py): one row per job an operator started, a lever pulled on every saga
-- of a selection. The orchestrator's runner works a RUNNING job batch by batch: in one transaction it queues the
-- batch's control commands in saga.outbox and moves last_saga_id, done and not_before on, so a restart goes on
-- after the last saga handled and no saga is sent the command twice.
CREATE TABLE IF NOT EXISTS saga.bulk_jobs (
    id           bigserial        PRIMARY KEY,
    operator     text             NOT NULL,
    reason       text             NOT NULL,
    action       text             NOT NULL,  -- a Lever (schemas.message_types), Cancel, Resume or Release
    step         text,                       -- the step a lever acting on one names (RetryNow, Skip)
    selection    jsonb            NOT NULL,  -- bulk_jobs.Selection.to_json()
    rate_per_s   double precision NOT NULL CHECK (rate_per_s > 0),
    status       text             NOT NULL DEFAULT 'RUNNING'
                                  CHECK (status IN ('RUNNING', 'DONE', 'CANCELLED', 'FAILED')),
    total        integer          NOT NULL,  -- the sagas the selection matched when the job started
    done         integer          NOT NULL DEFAULT 0,  -- the sagas sent the command
    failed       integer          NOT NULL DEFAULT 0,  -- the sagas matched whose command could not be written
    last_saga_id text             COLLATE "C" NOT NULL DEFAULT '',  -- the cursor: sagas are taken in id order
    not_before   timestamptz      NOT NULL DEFAULT now(),  -- the rate limit: when the next batch may go
    error        text,                       -- why a FAILED job stopped
    created_at   timestamptz      NOT NULL DEFAULT now(),
    updated_at   timestamptz      NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    cancelled_by text
);
-- The runner's question, "which running job is due", reads only the running ones.
CREATE INDEX IF NOT EXISTS bulk_jobs_running_idx ON saga.bulk_jobs (not_before) WHERE status = 'RUNNING';
