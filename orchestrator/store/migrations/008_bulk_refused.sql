-- A bulk job's commands that reached their saga and were refused there (OperatorActionRefused, SagaCancelRefused:
-- the lever did not apply to the saga as it stood). The orchestrator adds them in the transaction that records
-- the refusal, so each is counted once.
ALTER TABLE saga.bulk_jobs ADD COLUMN IF NOT EXISTS refused integer NOT NULL DEFAULT 0;
