-- +goose Up
-- The API's existence cache (store/existencecache.go, docs/uploads.md
-- "Existence cache") keeps found answers of HEAD /v2/<repo>/blobs/<digest>
-- (a reference in the repository to a live blob, with its size) in memory
-- and must forget them the moment one of them may have become wrong. Every
-- committed change that can do that NOTIFYs blobplane_refs
-- (store.RefsChannel); a listening API process clears its whole existence
-- cache on each notification, and a DBA's hand-written DELETE is covered
-- like the api's.
--
-- Only absence is never cached, so what makes a blob appear needs no
-- notification: inserting references and blob rows, and a blob row
-- becoming live (revival, hand-back). What can make a cached answer wrong:
--   - blob_references: DELETE (DELETE /v2/<repo>/blobs/<digest>), TRUNCATE,
--     and UPDATE (nothing in Blobplane updates a reference; by hand it
--     could move one);
--   - blobs: a row leaving state live (collected by the collector, which
--     only collects unreferenced digests; obliterated by an operator), its
--     size rewritten (never done by Blobplane), DELETE and TRUNCATE.
--
-- NOTIFY is delivered only when the writing transaction commits, once per
-- transaction however many statements or rows fired it (identical
-- notifications within a transaction are folded into one). UPDATE on blobs
-- is a row-level trigger whose WHEN selects a live row that leaves live or
-- changes size: every publication of a known digest updates its row
-- (EnsureBlob's ON CONFLICT DO UPDATE, which changes nothing) and must not
-- clear every API process's cache, and neither must a revival. Every other
-- event is a statement-level trigger: it fires once per statement, even one
-- that changed no row (harmless: a spurious clear).

-- +goose StatementBegin
CREATE FUNCTION refs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('blobplane_refs', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION refs_notify() IS 'NOTIFY blobplane_refs (empty payload) from a transaction that deletes references or takes blobs out of state live; API processes clear their blob existence cache when it commits.';

CREATE TRIGGER blob_references_refs_notify AFTER UPDATE OR DELETE OR TRUNCATE ON blob_references
    FOR EACH STATEMENT EXECUTE FUNCTION refs_notify();
CREATE TRIGGER blobs_refs_notify AFTER DELETE OR TRUNCATE ON blobs
    FOR EACH STATEMENT EXECUTE FUNCTION refs_notify();
CREATE TRIGGER blobs_refs_notify_update AFTER UPDATE ON blobs
    FOR EACH ROW
    WHEN (OLD.state = 'live' AND (NEW.state <> 'live' OR NEW.size_bytes <> OLD.size_bytes))
    EXECUTE FUNCTION refs_notify();

COMMENT ON TRIGGER blob_references_refs_notify ON blob_references IS 'Deleting, truncating or rewriting references clears the API blob existence caches (NOTIFY blobplane_refs on commit); inserts do not.';
COMMENT ON TRIGGER blobs_refs_notify ON blobs IS 'Deleting or truncating blob rows clears the API blob existence caches (NOTIFY blobplane_refs on commit).';
COMMENT ON TRIGGER blobs_refs_notify_update ON blobs IS 'A live blob row leaving live (collected, obliterated) or changing size clears the API blob existence caches; a publication''s no-op upsert and a revival to live do not.';

-- +goose Down
DROP TRIGGER blobs_refs_notify_update ON blobs;
DROP TRIGGER blobs_refs_notify ON blobs;
DROP TRIGGER blob_references_refs_notify ON blob_references;
DROP FUNCTION refs_notify();
