-- Partition journals (db/migrations/00038_partition_journal.sql).

-- name: FenceJournal :one
-- A primary that claimed the partition at @epoch takes its journal: the
-- head's epoch moves up to @epoch, only if the lease record holds @epoch
-- (an epoch no one claimed never appends). Waits for an append in flight
-- at the old epoch (the head's row lock) and returns the head after it:
-- every record of the old epoch is committed and readable from here.
INSERT INTO partition_journal_heads AS h (partition_id, epoch)
SELECT l.partition_id, l.epoch FROM leases l WHERE l.partition_id = @partition_id AND l.epoch = @epoch
ON CONFLICT (partition_id) DO UPDATE SET epoch = excluded.epoch, updated_at = now()
WHERE h.epoch <= excluded.epoch
RETURNING h.generation, h.next_lsn;

-- name: AppendJournal :many
-- Appends one record per payload at the next LSNs, in order, fenced on
-- the head's epoch: no row when @epoch is not the head's (stale). The
-- head's row lock is held to the end of the caller's transaction, so
-- LSNs are dense and gapless (a rollback returns them).
WITH head AS (
    UPDATE partition_journal_heads
    SET next_lsn = next_lsn + cardinality(@payloads::bytea[]), updated_at = now()
    WHERE partition_id = @partition_id AND epoch = @epoch
    RETURNING generation, next_lsn - cardinality(@payloads::bytea[]) AS first
)
INSERT INTO partition_journal (partition_id, generation, lsn, epoch, record_type, slot, payload)
SELECT @partition_id, head.generation, head.first + i - 1, @epoch,
       (@types::smallint[])[i], (@slots::integer[])[i], (@payloads::bytea[])[i]
FROM head, generate_subscripts(@payloads::bytea[], 1) AS i
ORDER BY i
RETURNING generation, lsn;

-- name: ReadJournal :many
-- The records of a partition's generation after @after_lsn, in LSN order.
SELECT lsn, epoch, record_type, slot, payload FROM partition_journal
WHERE partition_id = @partition_id AND generation = @generation AND lsn > @after_lsn
ORDER BY lsn
LIMIT @max_rows;

-- name: JournalHead :one
SELECT generation, epoch, next_lsn FROM partition_journal_heads WHERE partition_id = @partition_id;
