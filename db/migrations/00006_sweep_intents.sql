-- +goose Up
-- The reaper of expired intents (DESIGN flow 5, issue 7,
-- ../shared/spec/publication-across-two-stores.md).
--
-- Abandonment is decided on the intent row (S5); the staged bytes are
-- deleted only after that decision commits. staged_deleted_at is the durable
-- half of "abandoned, staged bytes not yet deleted": a reaper that crashes
-- between the decision and the delete, or whose delete fails, leaves it NULL
-- and the next pass deletes again (deleting a missing staged upload
-- succeeds).

ALTER TABLE intents ADD COLUMN staged_deleted_at timestamptz;
-- Only abandoned intents have their staged bytes deleted this way (a
-- publication promotes them; PromoteUpload removes the staged upload).
ALTER TABLE intents ADD CONSTRAINT intents_staged_deleted_abandoned_check
    CHECK (staged_deleted_at IS NULL OR state = 'abandoned');
-- The reaper's retry pass: abandoned intents whose staged bytes may remain.
CREATE INDEX intents_staged_undeleted_idx ON intents (ingress_datacenter, updated_at)
    WHERE state = 'abandoned' AND staged_deleted_at IS NULL AND staged_location IS NOT NULL;

COMMENT ON COLUMN intents.staged_deleted_at IS 'Database time the reaper confirmed the staged upload deleted (after the abandonment committed); NULL while an abandoned intent''s staged bytes may remain, so a crashed or failed delete is retried by the next sweep. Always NULL unless abandoned.';
COMMENT ON INDEX intents_staged_undeleted_idx IS 'Abandoned intents whose staged bytes are not yet confirmed deleted, oldest first per ingress datacenter: the reaper''s retry queue.';

-- +goose Down
DROP INDEX intents_staged_undeleted_idx;
ALTER TABLE intents DROP CONSTRAINT intents_staged_deleted_abandoned_check;
ALTER TABLE intents DROP COLUMN staged_deleted_at;
