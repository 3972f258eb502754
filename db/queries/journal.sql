-- Partition journals (db/migrations/00038_partition_journal.sql).

-- name: LeaseAtEpoch :one
-- The first statement of a fence: the lease record at @epoch, key-share
-- locked to the end of the transaction (a claim of a higher epoch waits).
SELECT l.epoch FROM leases l WHERE l.partition_id = @partition_id AND l.epoch = @epoch FOR KEY SHARE;

-- name: MoveJournalHead :one
-- An existing head moves up to @epoch (with the map's current slots); no
-- row when there is none, or it is past @epoch.
UPDATE partition_journal_heads h
SET epoch = @epoch, slot_bits = @slot_bits, slots = CAST(CAST(@slots AS text) AS int4multirange), updated_at = now()
WHERE h.partition_id = @partition_id AND h.epoch <= @epoch
RETURNING h.generation, h.next_lsn;

-- name: JournalHeadExists :one
SELECT EXISTS (SELECT 1 FROM partition_journal_heads WHERE partition_id = @partition_id) AS found;

-- name: LockReferencesForBootstrap :exec
-- A journal's creation waits for every transaction writing references and
-- holds new ones back until it commits: the references it counts and the
-- records the trigger writes after it cover each reference once.
LOCK TABLE blob_references, repository_quotas IN SHARE MODE;

-- name: CreateJournalHead :one
INSERT INTO partition_journal_heads (partition_id, epoch, slot_bits, slots)
VALUES (@partition_id, @epoch, @slot_bits, CAST(CAST(@slots AS text) AS int4multirange))
ON CONFLICT (partition_id) DO NOTHING
RETURNING generation, next_lsn;

-- name: JournalBootstrap :execrows
-- A new journal's first records: each repository of its slots with the
-- usage the ledger holds now (op "usage", absolute), in repository order.
INSERT INTO partition_journal (partition_id, epoch, record_type, slot, payload)
SELECT @partition_id, @epoch, 1, u.slot,
       convert_to(jsonb_build_object('v', 1, 'op', 'usage', 'repository', u.repository,
                                     'usage', jsonb_build_object('bytes', u.bytes, 'blobs', u.blobs))::text, 'UTF8')
FROM (
    SELECT r.repository, blobplane_slot(r.repository, @slot_bits) AS slot,
           sum(b.size_bytes)::bigint AS bytes, count(*)::bigint AS blobs
    FROM blob_references r JOIN blobs b ON b.digest = r.digest
    WHERE CAST(CAST(@slots AS text) AS int4multirange) @> blobplane_slot(r.repository, @slot_bits)
    GROUP BY r.repository
) u
ORDER BY u.repository;

-- name: JournalBootstrapQuotas :execrows
-- A new journal's quota records: each repository of its slots with a
-- quota, after its usage (JournalBootstrap), in repository order.
INSERT INTO partition_journal (partition_id, epoch, record_type, slot, payload)
SELECT @partition_id, @epoch, 1, blobplane_slot(q.repository, @slot_bits),
       convert_to(jsonb_build_object('v', 1, 'op', 'quota', 'repository', q.repository,
                                     'limit', blobplane_quota_limit(q))::text, 'UTF8')
FROM repository_quotas q
WHERE CAST(CAST(@slots AS text) AS int4multirange) @> blobplane_slot(q.repository, @slot_bits)
ORDER BY q.repository;

-- name: RetireOverlappingHeads :execrows
-- A new journal (a split or merge child, or a partition of a new map)
-- takes its slots from the heads that held them: the trigger journals a
-- repository to one partition only.
UPDATE partition_journal_heads h
SET slots = h.slots - CAST(CAST(@slots AS text) AS int4multirange), updated_at = now()
WHERE h.partition_id <> @partition_id AND h.slots && CAST(CAST(@slots AS text) AS int4multirange);

-- name: RestartJournalHead :one
-- A new generation of a journal whose history cannot be read (a segment
-- missing from this node's archive): LSNs restart at 1, only while
-- @epoch may hold the head.
UPDATE partition_journal_heads h
SET generation = h.generation + 1, next_lsn = 1, applied_lsn = 0, epoch = @epoch, slot_bits = @slot_bits,
    slots = CAST(CAST(@slots AS text) AS int4multirange), updated_at = now()
WHERE h.partition_id = @partition_id AND h.epoch <= @epoch
RETURNING h.generation, h.next_lsn;

-- name: DropJournalRecords :execrows
-- Every record of a partition's journal below @generation, and every one
-- not sequenced yet: a restart's bootstrap (under the references' SHARE
-- lock, which waited for their writers) counts what they recorded.
DELETE FROM partition_journal
WHERE partition_id = @partition_id AND (generation IS NULL OR generation < @generation::bigint);

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
-- ready is materialized and the update finds its rows by primary key
-- only: with the unsequenced index's statistics near empty (its steady
-- state), a filter on lsn there let the planner scan that index and run
-- ready again for each row, quadratic in the page (1,000 records: 650 ms,
-- now 6 ms; BenchmarkFailover). The head's lock (LockJournalHead) keeps
-- every other sequencer, and a restart's deletion, out meanwhile.
WITH ready AS MATERIALIZED (
    SELECT j.append_id, row_number() OVER (ORDER BY j.append_id) AS n
    FROM partition_journal j
    WHERE j.partition_id = @partition_id AND j.lsn IS NULL
    ORDER BY j.append_id
    LIMIT @max_rows
), numbered AS (
    UPDATE partition_journal j
    SET lsn = ready.n - 1 + sqlc.arg(next_lsn)::bigint, generation = @generation::bigint
    FROM ready
    WHERE j.append_id = ready.append_id
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

-- name: JournalFloor :one
-- The lowest sequenced LSN still in the table (0: none): the records below
-- it are in segment objects.
SELECT coalesce(min(lsn), 0)::bigint AS lsn FROM partition_journal
WHERE partition_id = @partition_id AND generation = @generation::bigint;

-- name: TrimJournal :execrows
-- Deletes a generation's sequenced records up to @upto_lsn, once a segment
-- object holds them.
DELETE FROM partition_journal
WHERE partition_id = @partition_id AND generation = @generation::bigint AND lsn <= @upto_lsn::bigint;

-- name: ReportJournalApplied :exec
-- The primary at @epoch reports the LSN its state applied (after a quota
-- record), for admins waiting on a quota change.
UPDATE partition_journal_heads
SET applied_lsn = GREATEST(applied_lsn, @applied_lsn::bigint)
WHERE partition_id = @partition_id AND generation = @generation::bigint AND epoch = @epoch;

-- name: ReportStandby :exec
-- A standby's report of how far it applied a partition's journal (ZBP-5
-- R64); caught_up_at moves only when it applied everything sequenced.
INSERT INTO partition_standbys (partition_id, node_id, generation, epoch, applied_lsn, head_lsn, caught_up_at, reported_at)
VALUES (@partition_id, @node_id, @generation, @epoch, @applied_lsn, @head_lsn,
        CASE WHEN sqlc.arg(caught_up)::boolean THEN now() END, now())
ON CONFLICT (partition_id, node_id) DO UPDATE
SET generation = EXCLUDED.generation, epoch = EXCLUDED.epoch, applied_lsn = EXCLUDED.applied_lsn, head_lsn = EXCLUDED.head_lsn,
    caught_up_at = CASE WHEN sqlc.arg(caught_up)::boolean THEN now()
                        WHEN partition_standbys.generation = EXCLUDED.generation THEN partition_standbys.caught_up_at END,
    reported_at = now();

-- name: ForgetStandby :exec
-- A node stopped following a partition (no map names it its standby).
DELETE FROM partition_standbys WHERE partition_id = @partition_id AND node_id = @node_id;

-- name: StandbyReports :many
-- Every standby's last report, with how old it is and how long since it
-- was caught up (database clock; -1: never), by partition and node. The
-- clock is read now, not at this transaction's start, and never gives a
-- negative age: a report committed after this statement's transaction
-- began is 0 s old, not "never".
SELECT s.partition_id, s.node_id, s.generation, s.epoch, s.applied_lsn, s.head_lsn,
       GREATEST(EXTRACT(EPOCH FROM clock_timestamp() - s.reported_at), 0)::float8 AS reported_ago,
       (CASE WHEN s.caught_up_at IS NULL THEN -1 -- GREATEST would read NULL as 0: caught up now
             ELSE GREATEST(EXTRACT(EPOCH FROM clock_timestamp() - s.caught_up_at), 0) END)::float8 AS caught_up_ago
FROM partition_standbys s
ORDER BY s.partition_id, s.node_id;
