-- +goose Up
-- A blob whose every copy is lost or corrupt (issue 29, "Loss"): HEAD
-- answers 404 once no verified or pending copy is left (the query
-- GetReferencedBlob), so the API caches must forget it when its last copy
-- fails. The placement ledger is created on its first write
-- (db/schema/placements.sql, which now carries the trigger); a ledger
-- created before this migration gets it here.

-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('placements') IS NOT NULL THEN
        CREATE OR REPLACE TRIGGER placements_refs_notify AFTER UPDATE OF state ON placements
            FOR EACH ROW
            WHEN (OLD.state IN ('verified', 'pending') AND NEW.state IN ('failed', 'revoked'))
            EXECUTE FUNCTION refs_notify();
        COMMENT ON TRIGGER placements_refs_notify ON placements IS 'A verified or pending copy failing or being revoked clears the API blob existence caches (NOTIFY blobplane_refs on commit): it may have been the blob''s last copy, after which HEAD answers 404.';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('placements') IS NOT NULL THEN
        DROP TRIGGER IF EXISTS placements_refs_notify ON placements;
    END IF;
END
$$;
-- +goose StatementEnd
