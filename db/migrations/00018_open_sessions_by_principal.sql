-- +goose Up
-- Per-principal bounds on open upload sessions and staged bytes (issue
-- 26): a session's insert counts the principal's open sessions, and a
-- chunk the bytes they hold, by this index.
CREATE INDEX intents_pending_principal_idx ON intents (principal) WHERE state = 'pending';
COMMENT ON INDEX intents_pending_principal_idx IS 'Open sessions per principal: the per-principal bounds on open upload sessions and staged bytes (issue 26).';

-- +goose Down
DROP INDEX intents_pending_principal_idx;
