-- +goose Up
-- Acknowledged means kept (issue 27): an upload answered 202 (its bytes
-- verified and its possession recorded, publication left to the finalize
-- job because the home could not publish now) is accepted: from then on
-- the reaper never abandons it, however long the home stays away, and its
-- finalize job publishes it once a home can. Before, such an intent
-- expired like an idle session and was abandoned while the client had
-- been told its upload was accepted.
ALTER TABLE intents ADD COLUMN accepted_at timestamptz;

COMMENT ON COLUMN intents.accepted_at IS 'When the client was answered 202 for this upload (bytes verified, possession recorded, publication queued): an accepted pending intent is never reaped; its finalize job publishes it. NULL: not accepted.';

-- +goose Down
ALTER TABLE intents DROP COLUMN accepted_at;
