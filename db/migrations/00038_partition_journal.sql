-- +goose Up
-- The tail of each partition's journal (issue 33, ZBP-5 R31, R35;
-- docs/adr/0009-quotas-as-partition-state.md). Records are appended in the
-- transaction that makes the change they record, so journal and ledger
-- commit together; sealed ranges move to segment objects on the byte
-- backend and leave this table.
CREATE TABLE partition_journal_heads (
    partition_id text        PRIMARY KEY CHECK (partition_id <> ''),
    generation   bigint      NOT NULL DEFAULT 1 CHECK (generation >= 1),
    epoch        bigint      NOT NULL CHECK (epoch >= 1),
    next_lsn     bigint      NOT NULL DEFAULT 1 CHECK (next_lsn >= 1),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE partition_journal_heads IS 'One row per partition: the next LSN of its journal (dense, gapless: R35) and the epoch allowed to append. An append moves next_lsn under this row''s lock, fenced on epoch; a new primary advances epoch (FenceJournal) before it reads the tail, so a displaced primary''s append either committed before that read or changes no row.';

CREATE TABLE partition_journal (
    partition_id text        NOT NULL,
    generation   bigint      NOT NULL CHECK (generation >= 1),
    lsn          bigint      NOT NULL CHECK (lsn >= 1),
    epoch        bigint      NOT NULL CHECK (epoch >= 1),
    record_type  smallint    NOT NULL CHECK (record_type IN (1, 2, 3)),
    slot         integer     NOT NULL CHECK (slot >= 0),
    payload      bytea       NOT NULL,
    appended_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, generation, lsn)
);
COMMENT ON COLUMN partition_journal_heads.partition_id IS 'Opaque partition id from the map (leases.partition_id).';
COMMENT ON COLUMN partition_journal_heads.generation IS 'Journal generation: LSNs restart at 1 in a new generation (a split or merge gives children their own partition ids: R108).';
COMMENT ON COLUMN partition_journal_heads.epoch IS 'The epoch whose primary may append: moved up only by FenceJournal, to an epoch the lease record holds.';
COMMENT ON COLUMN partition_journal_heads.next_lsn IS 'The LSN the next record gets (R35: dense, gapless, assigned here, never from a clock).';
COMMENT ON COLUMN partition_journal_heads.updated_at IS 'Last append or fence, by the database clock.';

COMMENT ON TABLE partition_journal IS 'Journal records not yet sealed into a segment object, one row per LSN; the framing of package journal (with its CRC32C) is applied when a range is written to the backend. record_type: 1 APPLY, 2 MARK, 3 SEAL.';

COMMENT ON COLUMN partition_journal.partition_id IS 'The partition whose journal this is.';
COMMENT ON COLUMN partition_journal.generation IS 'The journal generation the LSN belongs to.';
COMMENT ON COLUMN partition_journal.lsn IS 'Dense and gapless within (partition, generation) (R35).';
COMMENT ON COLUMN partition_journal.epoch IS 'The primary''s fencing epoch when the record was appended.';
COMMENT ON COLUMN partition_journal.record_type IS '1 APPLY, 2 MARK, 3 SEAL (package journal).';
COMMENT ON COLUMN partition_journal.slot IS 'The slot the record is about (records for slots a partition does not own are discarded on replay: R58).';
COMMENT ON COLUMN partition_journal.payload IS 'Opaque to the runtime, interpreted only by the applier (package quota: a versioned JSON record).';
COMMENT ON COLUMN partition_journal.appended_at IS 'Commit-time clock of the append (database clock), for the tail''s age.';

-- +goose Down
DROP TABLE partition_journal;
DROP TABLE partition_journal_heads;
