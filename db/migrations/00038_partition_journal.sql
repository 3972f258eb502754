-- +goose Up
-- The tail of each partition's journal (issue 33, ZBP-5 R31, R35;
-- docs/adr/0009-quotas-as-partition-state.md). A record is inserted in the
-- transaction that makes the change it records, so journal and ledger
-- commit together, without an LSN and without a lock held across the
-- commit; the partition's primary then gives the committed records dense,
-- gapless LSNs (SequenceJournal), in the order they became visible to it. Sealed ranges move to segment objects on the byte
-- backend and leave this table.
CREATE TABLE partition_journal_heads (
    partition_id text        PRIMARY KEY CHECK (partition_id <> ''),
    generation   bigint      NOT NULL DEFAULT 1 CHECK (generation >= 1),
    epoch        bigint      NOT NULL CHECK (epoch >= 1),
    next_lsn     bigint      NOT NULL DEFAULT 1 CHECK (next_lsn >= 1),
    slot_bits    integer     NOT NULL CHECK (slot_bits BETWEEN 1 AND 32),
    slots        int4multirange NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX partition_journal_heads_slots_idx ON partition_journal_heads USING gist (slots);
COMMENT ON TABLE partition_journal_heads IS 'One row per partition: the next LSN its primary gives (dense, gapless: R35) and the epoch of the primary allowed to give it. Moved only by SequenceJournal under this row''s lock, fenced on epoch; FenceJournal moves epoch up to a claimed one.';
COMMENT ON COLUMN partition_journal_heads.partition_id IS 'Opaque partition id from the map (leases.partition_id).';
COMMENT ON COLUMN partition_journal_heads.generation IS 'Journal generation: LSNs restart at 1 in a new generation (a split or merge gives children their own partition ids: R108).';
COMMENT ON COLUMN partition_journal_heads.epoch IS 'The epoch whose primary sequences the journal: moved up only by FenceJournal, to an epoch the lease record holds.';
COMMENT ON COLUMN partition_journal_heads.next_lsn IS 'The LSN the next sequenced record gets (R35: assigned here, never from a clock).';
COMMENT ON COLUMN partition_journal_heads.slot_bits IS 'SLOT_BITS of the map the slots are at.';
COMMENT ON COLUMN partition_journal_heads.slots IS 'The partition''s slot ranges (half-open): a reference to a repository whose slot is here is journalled to this partition (blob_references_journal).';
COMMENT ON COLUMN partition_journal_heads.updated_at IS 'Last sequencing or fence, by the database clock.';

CREATE TABLE partition_journal (
    append_id    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    partition_id text        NOT NULL CHECK (partition_id <> ''),
    generation   bigint      CHECK (generation >= 1),
    lsn          bigint      CHECK (lsn >= 1),
    epoch        bigint      NOT NULL CHECK (epoch >= 1),
    record_type  smallint    NOT NULL CHECK (record_type IN (1, 2, 3)),
    slot         integer     NOT NULL CHECK (slot >= 0),
    payload      bytea       NOT NULL,
    appended_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((lsn IS NULL) = (generation IS NULL))
);
CREATE UNIQUE INDEX partition_journal_lsn_idx ON partition_journal (partition_id, generation, lsn) WHERE lsn IS NOT NULL;
CREATE INDEX partition_journal_unsequenced_idx ON partition_journal (partition_id, append_id) WHERE lsn IS NULL;
COMMENT ON TABLE partition_journal IS 'Journal records not yet sealed into a segment object. Inserted without an LSN by the transaction that makes the change; given one by SequenceJournal once committed. The framing of package journal (with its CRC32C) is applied when a range is written to the backend.';
COMMENT ON COLUMN partition_journal.append_id IS 'Insertion order: SequenceJournal numbers the committed records it sees in this order; a record committed later gets a later LSN, whatever its append_id.';
COMMENT ON COLUMN partition_journal.partition_id IS 'The partition whose journal this is.';
COMMENT ON COLUMN partition_journal.generation IS 'The journal generation its LSN belongs to (NULL until sequenced).';
COMMENT ON COLUMN partition_journal.lsn IS 'Dense and gapless within (partition, generation) (R35); NULL until sequenced.';
COMMENT ON COLUMN partition_journal.epoch IS 'The lease epoch the record was appended under.';
COMMENT ON COLUMN partition_journal.record_type IS '1 APPLY, 2 MARK, 3 SEAL (package journal).';
COMMENT ON COLUMN partition_journal.slot IS 'The slot the record is about (records for slots a partition does not own are discarded on replay: R58).';
COMMENT ON COLUMN partition_journal.payload IS 'Opaque to the runtime, interpreted only by the applier (package quota: a versioned JSON record).';
COMMENT ON COLUMN partition_journal.appended_at IS 'When the record was inserted (database clock).';

-- The slot of a repository name (authority.SlotOf: the top slot_bits bits
-- of its MD5, big-endian).
-- +goose StatementBegin
CREATE FUNCTION blobplane_slot(repository text, slot_bits integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT (('x' || substr(md5(repository), 1, 8))::bit(32)::bigint >> (32 - slot_bits))::integer $$;
-- +goose StatementEnd
COMMENT ON FUNCTION blobplane_slot(text, integer) IS 'authority.SlotOf in SQL: the top slot_bits bits of md5(repository), big-endian.';

-- Every reference row created or removed, by any path (the three
-- publication paths, deletes, obliteration), is journalled to the
-- partition whose slots hold its repository, once that partition's
-- journal exists: what the ledger did, in the same transaction (R31, R34;
-- ADR 0009 items 3 and 11). The lease row is key-share-locked, so a claim
-- of a higher epoch waits for this transaction.
-- +goose StatementBegin
CREATE FUNCTION blob_references_journal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r       blob_references;
    v_bits  integer;
    v_part  text;
    v_slot  integer;
    v_epoch bigint;
    v_size  bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN r := NEW; ELSE r := OLD; END IF;
    -- Every head is at the map's SLOT_BITS: one hash per row, and the
    -- slots' GiST index finds the head (no head at all: nothing to do).
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
COMMENT ON FUNCTION blob_references_journal() IS 'Journals each reference row created or removed to its partition''s journal, once the partition has one (issue 33).';
CREATE TRIGGER blob_references_journal AFTER INSERT OR DELETE ON blob_references
FOR EACH ROW EXECUTE FUNCTION blob_references_journal();

-- +goose Down
DROP TRIGGER blob_references_journal ON blob_references;
DROP FUNCTION blob_references_journal();
DROP FUNCTION blobplane_slot(text, integer);
DROP TABLE partition_journal;
DROP TABLE partition_journal_heads;
