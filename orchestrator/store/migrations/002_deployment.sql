-- One database serves one deployment: the orchestrator records its topic prefix here at its first start and
-- refuses to run against a database claimed by another prefix (its timers would send commands to the
-- other deployment's topics).
CREATE TABLE IF NOT EXISTS saga.deployment (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    topic_prefix text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now()
);
