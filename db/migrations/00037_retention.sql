-- +goose Up
-- Retention (issue 31): finished rows are pruned past a retention, in
-- bounded batches, by the sweep (sweep.Retention). These indexes find
-- the oldest finished rows without scanning the live ones.
CREATE INDEX intents_finished_updated_idx ON intents (updated_at) WHERE state <> 'pending';
COMMENT ON INDEX intents_finished_updated_idx IS 'Published and abandoned intents by age: the retention''s prune of operations (with their outcomes).';
CREATE INDEX deletions_finished_idx ON deletions (deleted_at) WHERE deleted_at IS NOT NULL;
COMMENT ON INDEX deletions_finished_idx IS 'Finished byte deletions by age: the retention''s prune.';
CREATE INDEX handoffs_finished_idx ON handoffs (finished_at) WHERE finished_at IS NOT NULL;
COMMENT ON INDEX handoffs_finished_idx IS 'Published and aborted moves by age: the retention''s prune.';

-- +goose Down
DROP INDEX handoffs_finished_idx;
DROP INDEX deletions_finished_idx;
DROP INDEX intents_finished_updated_idx;
