-- Retention (docs/DESIGN.md §9, gateway/README.md): an envelope is deleted a configured time
-- after it reached its final status, or after it was created when it never does. The time of
-- the final status; envelopes final before this migration take their last update's.
ALTER TABLE envelopes ADD COLUMN IF NOT EXISTS finished_at timestamptz;
UPDATE envelopes SET finished_at = updated_at
    WHERE finished_at IS NULL AND status IN ('succeeded', 'failed');
-- The retention pass takes the oldest first, in bounded batches, by these.
CREATE INDEX IF NOT EXISTS envelopes_finished_at ON envelopes (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS envelopes_created_at ON envelopes (created_at);
