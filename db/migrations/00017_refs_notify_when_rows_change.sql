-- +goose Up
-- Issue 26 point 12: the statement-level triggers of 00012 notified
-- blobplane_refs for every DELETE (or UPDATE) statement on blob_references
-- and every DELETE on blobs, even one that changed no row, so any writer
-- could empty every api's existence cache at will with
-- DELETE /v2/<own repo>/blobs/<any digest> (a 404 that still cleared
-- them all). They now look at the rows the statement changed (transition
-- tables) and notify only when there is one. TRUNCATE has no transition
-- table and always notifies.

-- +goose StatementBegin
CREATE FUNCTION refs_notify_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM changed_rows) THEN
        PERFORM pg_notify('blobplane_refs', '');
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TRIGGER blob_references_refs_notify ON blob_references;
DROP TRIGGER blobs_refs_notify ON blobs;
-- A statement-level trigger with a transition table handles one event.
CREATE TRIGGER blob_references_refs_notify_delete AFTER DELETE ON blob_references
    REFERENCING OLD TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION refs_notify_changed();
CREATE TRIGGER blob_references_refs_notify_update AFTER UPDATE ON blob_references
    REFERENCING OLD TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION refs_notify_changed();
CREATE TRIGGER blob_references_refs_notify_truncate AFTER TRUNCATE ON blob_references
    FOR EACH STATEMENT EXECUTE FUNCTION refs_notify();
CREATE TRIGGER blobs_refs_notify_delete AFTER DELETE ON blobs
    REFERENCING OLD TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION refs_notify_changed();
CREATE TRIGGER blobs_refs_notify_truncate AFTER TRUNCATE ON blobs
    FOR EACH STATEMENT EXECUTE FUNCTION refs_notify();

COMMENT ON FUNCTION refs_notify_changed() IS 'Statement trigger: NOTIFY blobplane_refs when the statement changed at least one row (its transition table changed_rows), so a DELETE that removes nothing empties no existence cache (issue 26).';

-- +goose Down
DROP TRIGGER blobs_refs_notify_truncate ON blobs;
DROP TRIGGER blobs_refs_notify_delete ON blobs;
DROP TRIGGER blob_references_refs_notify_truncate ON blob_references;
DROP TRIGGER blob_references_refs_notify_update ON blob_references;
DROP TRIGGER blob_references_refs_notify_delete ON blob_references;
CREATE TRIGGER blob_references_refs_notify AFTER UPDATE OR DELETE OR TRUNCATE ON blob_references
    FOR EACH STATEMENT EXECUTE FUNCTION refs_notify();
CREATE TRIGGER blobs_refs_notify AFTER DELETE OR TRUNCATE ON blobs
    FOR EACH STATEMENT EXECUTE FUNCTION refs_notify();
DROP FUNCTION refs_notify_changed();
