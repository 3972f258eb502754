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
    updated_at   timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE partition_journal_heads IS 'One row per partition: the next LSN its primary gives (dense, gapless: R35) and the epoch of the primary allowed to give it. Moved only by SequenceJournal under this row''s lock, fenced on epoch; FenceJournal moves epoch up to a claimed one.';
COMMENT ON COLUMN partition_journal_heads.partition_id IS 'Opaque partition id from the map (leases.partition_id).';
COMMENT ON COLUMN partition_journal_heads.generation IS 'Journal generation: LSNs restart at 1 in a new generation (a split or merge gives children their own partition ids: R108).';
COMMENT ON COLUMN partition_journal_heads.epoch IS 'The epoch whose primary sequences the journal: moved up only by FenceJournal, to an epoch the lease record holds.';
COMMENT ON COLUMN partition_journal_heads.next_lsn IS 'The LSN the next sequenced record gets (R35: assigned here, never from a clock).';
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

-- +goose Down
DROP TABLE partition_journal;
DROP TABLE partition_journal_heads;
