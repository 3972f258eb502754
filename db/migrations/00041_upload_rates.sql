-- +goose Up
-- Upload rates (issue 33, docs/quotas.md "Upload rates"): a repository's
-- quota may also bound what it publishes per minute. Its home counts each
-- publication in a sliding window, at the time the ledger's transaction
-- wrote it (the record's "at", the database clock: replay counts it at the
-- same instant on every node, ZBP-5-R34).
ALTER TABLE repository_quotas
    ADD COLUMN max_bytes_per_minute bigint NOT NULL DEFAULT 0 CHECK (max_bytes_per_minute >= 0),
    ADD COLUMN max_blobs_per_minute bigint NOT NULL DEFAULT 0 CHECK (max_blobs_per_minute >= 0),
    DROP CONSTRAINT repository_quotas_check,
    ADD CONSTRAINT repository_quotas_check
        CHECK (max_bytes > 0 OR max_blobs > 0 OR max_bytes_per_minute > 0 OR max_blobs_per_minute > 0);
COMMENT ON COLUMN repository_quotas.max_bytes_per_minute IS 'Most bytes the repository may publish (newly reference) in any minute; 0: no limit on the byte rate.';
COMMENT ON COLUMN repository_quotas.max_blobs_per_minute IS 'Most blobs the repository may publish (newly reference) in any minute; 0: no limit on the blob rate.';

-- The "limit" of a quota record: the rate fields only when set, so that a
-- quota without a rate is journalled exactly as the release before wrote
-- it (ZBP-5-R44: that release reads it).
-- +goose StatementBegin
CREATE FUNCTION blobplane_quota_limit(q repository_quotas) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'bytes', q.max_bytes, 'blobs', q.max_blobs,
        'bytes_per_minute', nullif(q.max_bytes_per_minute, 0),
        'blobs_per_minute', nullif(q.max_blobs_per_minute, 0)))
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION blobplane_quota_limit(repository_quotas) IS 'The "limit" object of a quota journal record for a quota row (issue 33).';

-- A reference added to a repository whose quota bounds its rate carries
-- "at": Unix milliseconds of the transaction's clock. Only those: a
-- record without a rate stays in the previous release's format (R44), and
-- a rate is set only through this release's API.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION blob_references_journal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r      blob_references;
    v_size bigint;
    v_rec  jsonb;
BEGIN
    IF TG_OP = 'INSERT' THEN r := NEW; ELSE r := OLD; END IF;
    SELECT b.size_bytes INTO v_size FROM blobs b WHERE b.digest = r.digest;
    v_rec := jsonb_build_object(
        'v', 1, 'op', CASE TG_OP WHEN 'INSERT' THEN 'ref+' ELSE 'ref-' END,
        'repository', r.repository, 'digest', r.digest, 'size', v_size);
    IF TG_OP = 'INSERT' AND EXISTS (
        SELECT 1 FROM repository_quotas q
        WHERE q.repository = r.repository AND (q.max_bytes_per_minute > 0 OR q.max_blobs_per_minute > 0)) THEN
        v_rec := v_rec || jsonb_build_object('at', floor(extract(epoch FROM now()) * 1000)::bigint);
    END IF;
    PERFORM blobplane_journal(r.repository, v_rec);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION repository_quotas_journal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r repository_quotas;
    v_limit jsonb;
    v_id bigint;
BEGIN
    IF TG_OP = 'DELETE' THEN
        r := OLD;
        v_limit := jsonb_build_object('bytes', 0, 'blobs', 0);
    ELSE
        r := NEW;
        v_limit := blobplane_quota_limit(r);
    END IF;
    v_id := blobplane_journal(r.repository, jsonb_build_object(
        'v', 1, 'op', 'quota', 'repository', r.repository, 'limit', v_limit));
    -- The writer waits for its home to apply this record (StoreQuota).
    PERFORM set_config('blobplane.quota_append_id', coalesce(v_id, 0)::text, true);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION repository_quotas_journal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r repository_quotas;
    v_limit jsonb;
    v_id bigint;
BEGIN
    IF TG_OP = 'DELETE' THEN
        r := OLD;
        v_limit := jsonb_build_object('bytes', 0, 'blobs', 0);
    ELSE
        r := NEW;
        v_limit := jsonb_build_object('bytes', r.max_bytes, 'blobs', r.max_blobs);
    END IF;
    v_id := blobplane_journal(r.repository, jsonb_build_object(
        'v', 1, 'op', 'quota', 'repository', r.repository, 'limit', v_limit));
    PERFORM set_config('blobplane.quota_append_id', coalesce(v_id, 0)::text, true);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION blob_references_journal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r      blob_references;
    v_size bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN r := NEW; ELSE r := OLD; END IF;
    IF NOT EXISTS (SELECT 1 FROM partition_journal_heads) THEN
        RETURN NULL;
    END IF;
    SELECT b.size_bytes INTO v_size FROM blobs b WHERE b.digest = r.digest;
    PERFORM blobplane_journal(r.repository, jsonb_build_object(
        'v', 1, 'op', CASE TG_OP WHEN 'INSERT' THEN 'ref+' ELSE 'ref-' END,
        'repository', r.repository, 'digest', r.digest, 'size', v_size));
    RETURN NULL;
END
$$;
-- +goose StatementEnd
DROP FUNCTION blobplane_quota_limit(repository_quotas);
-- A quota that limits only a rate has no form before this migration.
DELETE FROM repository_quotas WHERE max_bytes = 0 AND max_blobs = 0;
ALTER TABLE repository_quotas
    DROP CONSTRAINT repository_quotas_check,
    ADD CONSTRAINT repository_quotas_check CHECK (max_bytes > 0 OR max_blobs > 0),
    DROP COLUMN max_bytes_per_minute,
    DROP COLUMN max_blobs_per_minute;
