-- Partition journals (db/migrations/00038_partition_journal.sql).

-- name: FenceJournal :one
-- A primary that claimed the partition at @epoch takes its journal: the
-- head's epoch moves up to @epoch, only if the lease record holds @epoch
-- (an epoch no one claimed never sequences). Returns the head.
INSERT INTO partition_journal_heads AS h (partition_id, epoch)
SELECT l.partition_id, l.epoch FROM leases l WHERE l.partition_id = @partition_id AND l.epoch = @epoch
ON CONFLICT (partition_id) DO UPDATE SET epoch = excluded.epoch, updated_at = now()
WHERE h.epoch <= excluded.epoch
RETURNING h.generation, h.next_lsn;

-- name: AppendJournal :many
-- Inserts one record per payload, without an LSN, fenced as a publication
-- is: only while the lease record holds @epoch, key-share-locked so that a
-- claim of a higher epoch waits for this transaction. Shared locks only:
-- concurrent appends to one partition do not wait for each other. No row
-- back: the lease moved on.
WITH lease AS (
    SELECT l.epoch FROM leases l WHERE l.partition_id = @partition_id AND l.epoch = @epoch FOR KEY SHARE
)
INSERT INTO partition_journal (partition_id, epoch, record_type, slot, payload)
SELECT @partition_id, lease.epoch, (@types::smallint[])[i], (@slots::integer[])[i], (@payloads::bytea[])[i]
FROM lease, generate_subscripts(@payloads::bytea[], 1) AS i
ORDER BY i
RETURNING append_id;

-- name: LockJournalHead :one
-- The first statement of a sequencing: the head, locked for the rest of
-- the transaction, only while @epoch holds it. One sequencer at a time
-- per partition; the next statement takes a snapshot after this lock.
SELECT generation, next_lsn FROM partition_journal_heads
WHERE partition_id = @partition_id AND epoch = @epoch
FOR UPDATE;

-- name: SequenceJournal :many
-- Under the head's lock (LockJournalHead), gives the partition's
-- committed, unsequenced records this statement sees the LSNs from
-- @next_lsn on, in insertion order, up to @max_rows; one that commits
-- later gets a later LSN. Readers see only sequenced records, so the
-- journal's order is the order records became visible to its one
-- sequencer. The head moves past them.
WITH ready AS (
    SELECT j.append_id, row_number() OVER (ORDER BY j.append_id) AS n
    FROM partition_journal j
    WHERE j.partition_id = @partition_id AND j.lsn IS NULL
    ORDER BY j.append_id
    LIMIT @max_rows
), numbered AS (
    UPDATE partition_journal j
    SET lsn = ready.n - 1 + sqlc.arg(next_lsn)::bigint, generation = @generation::bigint
    FROM ready
    WHERE j.append_id = ready.append_id AND j.lsn IS NULL
    RETURNING j.append_id, j.lsn
), moved AS (
    UPDATE partition_journal_heads h
    SET next_lsn = (SELECT count(*) FROM numbered) + sqlc.arg(next_lsn)::bigint, updated_at = now()
    WHERE h.partition_id = @partition_id AND EXISTS (SELECT 1 FROM numbered)
    RETURNING h.next_lsn
)
SELECT numbered.append_id, numbered.lsn::bigint AS lsn FROM numbered
ORDER BY numbered.lsn;

-- name: ReadJournal :many
-- The sequenced records of a partition's generation after @after_lsn, in
-- LSN order.
SELECT append_id, lsn::bigint AS lsn, epoch, record_type, slot, payload FROM partition_journal
WHERE partition_id = @partition_id AND generation = @generation::bigint AND lsn > @after_lsn::bigint
ORDER BY lsn
LIMIT @max_rows;

-- name: JournalHead :one
SELECT generation, epoch, next_lsn FROM partition_journal_heads WHERE partition_id = @partition_id;
