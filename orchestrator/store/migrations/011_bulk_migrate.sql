-- The version a Migrate bulk job (`saga definitions migrate`) moves its sagas to; null for every other job.
ALTER TABLE saga.bulk_jobs ADD COLUMN IF NOT EXISTS definition_version int;
