-- +goose Up
-- Repository quotas (issue 33, docs/adr/0009-quotas-as-partition-state.md):
-- set by admins, held in memory by each repository's home as partition
-- state, and journalled like every reference row so that the home's state
-- and this table never disagree.
CREATE TABLE repository_quotas (
    repository text        PRIMARY KEY REFERENCES repositories (name) ON DELETE CASCADE,
    max_bytes  bigint      NOT NULL DEFAULT 0 CHECK (max_bytes >= 0),
    max_blobs  bigint      NOT NULL DEFAULT 0 CHECK (max_blobs >= 0),
    set_by     text        NOT NULL CHECK (set_by <> ''),
    set_at     timestamptz NOT NULL DEFAULT now(),
    CHECK (max_bytes > 0 OR max_blobs > 0)
);
COMMENT ON TABLE repository_quotas IS 'Admin-set limits on what a repository holds (each distinct digest it references once). The repository''s home admits a publication only within them (ZBP-5 partition state, journalled by repository_quotas_journal).';
COMMENT ON COLUMN repository_quotas.repository IS 'The repository the quota limits.';
COMMENT ON COLUMN repository_quotas.max_bytes IS 'Most bytes the repository may reference (the sum of its distinct blobs'' sizes); 0: no limit on bytes.';
COMMENT ON COLUMN repository_quotas.max_blobs IS 'Most distinct blobs the repository may reference; 0: no limit on blobs.';
COMMENT ON COLUMN repository_quotas.set_by IS 'The principal that last set the quota.';
COMMENT ON COLUMN repository_quotas.set_at IS 'When the quota was last set (database clock).';

ALTER TABLE partition_journal_heads ADD COLUMN applied_lsn bigint NOT NULL DEFAULT 0 CHECK (applied_lsn >= 0);
COMMENT ON COLUMN partition_journal_heads.applied_lsn IS 'The LSN of this generation the primary''s state last reported applied after a quota record: an admin''s quota change waits for it (read-your-writes, R107).';

-- One append path for the triggers: @record, about @repository, to the
-- journal of the partition whose head's slots hold the repository's slot
-- (nothing when no journal holds it). The lease row is key-share-locked,
-- so a claim of a higher epoch waits for the writing transaction.
-- +goose StatementBegin
CREATE FUNCTION blobplane_journal(p_repository text, p_record jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id    bigint;
    v_bits  integer;
    v_part  text;
    v_slot  integer;
    v_epoch bigint;
BEGIN
    -- Every head is at the map's SLOT_BITS: one hash per row, and the
    -- slots' GiST index finds the head.
    SELECT h.slot_bits INTO v_bits FROM partition_journal_heads h LIMIT 1;
    IF v_bits IS NULL THEN
        RETURN NULL;
    END IF;
    v_slot := blobplane_slot(p_repository, v_bits);
    SELECT h.partition_id INTO v_part FROM partition_journal_heads h
    WHERE h.slots @> v_slot AND h.slot_bits = v_bits
    LIMIT 1;
    IF v_part IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT l.epoch INTO v_epoch FROM leases l WHERE l.partition_id = v_part FOR KEY SHARE;
    INSERT INTO partition_journal (partition_id, epoch, record_type, slot, payload)
    VALUES (v_part, v_epoch, 1, v_slot, convert_to(p_record::text, 'UTF8'))
    RETURNING append_id INTO v_id;
    RETURN v_id;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION blobplane_journal(text, jsonb) IS 'Appends a quota record about a repository to the journal of the partition holding its slot, if that partition has a journal (issue 33), and returns its append id (NULL: no journal holds it).';

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

-- +goose StatementBegin
CREATE FUNCTION repository_quotas_journal() RETURNS trigger LANGUAGE plpgsql AS $$
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
    -- The writer waits for its home to apply this record (StoreQuota).
    PERFORM set_config('blobplane.quota_append_id', coalesce(v_id, 0)::text, true);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION repository_quotas_journal() IS 'Journals each quota set or cleared to its repository''s partition, once the partition has a journal (issue 33).';
CREATE TRIGGER repository_quotas_journal AFTER INSERT OR UPDATE OR DELETE ON repository_quotas
FOR EACH ROW EXECUTE FUNCTION repository_quotas_journal();

-- +goose Down
DROP TRIGGER repository_quotas_journal ON repository_quotas;
DROP FUNCTION repository_quotas_journal();
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION blob_references_journal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r       blob_references;
    v_bits  integer;
    v_part  text;
    v_slot  integer;
    v_epoch bigint;
    v_size  bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN r := NEW; ELSE r := OLD; END IF;
    SELECT h.slot_bits INTO v_bits FROM partition_journal_heads h LIMIT 1;
    IF v_bits IS NULL THEN
        RETURN NULL;
    END IF;
    v_slot := blobplane_slot(r.repository, v_bits);
    SELECT h.partition_id INTO v_part FROM partition_journal_heads h
    WHERE h.slots @> v_slot AND h.slot_bits = v_bits
    LIMIT 1;
    IF v_part IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT l.epoch INTO v_epoch FROM leases l WHERE l.partition_id = v_part FOR KEY SHARE;
    SELECT b.size_bytes INTO v_size FROM blobs b WHERE b.digest = r.digest;
    INSERT INTO partition_journal (partition_id, epoch, record_type, slot, payload)
    VALUES (v_part, v_epoch, 1, v_slot, convert_to(jsonb_build_object(
        'v', 1, 'op', CASE TG_OP WHEN 'INSERT' THEN 'ref+' ELSE 'ref-' END,
        'repository', r.repository, 'digest', r.digest, 'size', v_size)::text, 'UTF8'));
    RETURN NULL;
END
$$;
-- +goose StatementEnd
DROP FUNCTION blobplane_journal(text, jsonb);
DROP TABLE repository_quotas;
ALTER TABLE partition_journal_heads DROP COLUMN applied_lsn;
