-- +goose Up
-- Possession (issue 26, DESIGN S8/S9): an intent publishes only content
-- its own bytes proved, or a mount from a repository its principal can
-- read. A claim (expected_digest, expected_size, received_bytes) proves
-- nothing: before this column a session that claimed a digest and never
-- sent its bytes could publish on the strength of another tenant's
-- verified placement. Finalize now requires possession: 'uploaded' once
-- the intent's own bytes were streamed and hashed to expected_digest
-- (recorded with the placement's verification, or by the publishing
-- transaction itself), 'mounted' for a cross-repository mount, whose
-- source (mounted_from) is re-checked at the home when it publishes.
ALTER TABLE intents
    ADD COLUMN possession text CHECK (possession IN ('uploaded', 'mounted')),
    ADD COLUMN mounted_from text CHECK (octet_length(mounted_from) BETWEEN 1 AND 255),
    ADD CONSTRAINT intents_mount_source CHECK ((possession = 'mounted') = (mounted_from IS NOT NULL));

COMMENT ON COLUMN intents.possession IS 'How the intent proved it holds its content (S9): uploaded (its own bytes were streamed and hashed to expected_digest), mounted (a mount from mounted_from, which its principal can read), or NULL (nothing proven yet: Finalize refuses it, whatever verified placements of the digest exist).';
COMMENT ON COLUMN intents.mounted_from IS 'Repository a mount publishes from; set exactly when possession is mounted. The home re-checks at publication that it still references the digest and that the principal can read it.';

-- +goose Down
ALTER TABLE intents DROP CONSTRAINT intents_mount_source, DROP COLUMN mounted_from, DROP COLUMN possession;
