-- Collection of unreferenced content (db/migrations/00007_collect.sql).

-- name: LockCollectCandidates :many
-- Live blob rows that look unowned under this statement's snapshot, locked
-- so that a publication of the same digest (EnsureBlob) waits for the
-- decision. SKIP LOCKED: a row a publication holds is being published, and
-- a concurrent collector takes other rows. The caller re-checks ownership
-- with a fresh statement after the lock (a reference committed between
-- this snapshot and the lock is not visible here). A pass walks the
-- live rows' index (blobs_live_digest_idx) from its cursor (after) up to
-- upto ('' for the end), so it never scans a row twice.
-- The range is repeated inside each NOT EXISTS: implied by the join, but
-- the planner does not infer it, and without it a merge anti-join reads
-- the references index from its first digest on every batch.
SELECT b.digest, b.size_bytes FROM blobs b
WHERE b.state = 'live'
  AND NOT EXISTS (SELECT 1 FROM blob_references r WHERE r.digest = b.digest
                  AND r.digest > @after::text AND (@upto::text = '' OR r.digest <= @upto::text))
  AND NOT EXISTS (SELECT 1 FROM intents i WHERE i.state = 'pending' AND i.expected_digest = b.digest
                  AND i.expected_digest > @after::text AND (@upto::text = '' OR i.expected_digest <= @upto::text))
  AND NOT EXISTS (SELECT 1 FROM placements p WHERE p.digest = b.digest AND p.state = 'pending'
                  AND p.digest > @after::text AND (@upto::text = '' OR p.digest <= @upto::text))
  AND b.digest > @after::text
  AND (@upto::text = '' OR b.digest <= @upto::text)
ORDER BY b.digest
LIMIT @max_rows
FOR UPDATE OF b SKIP LOCKED;

-- name: BlobOwnership :one
-- Ownership of a digest (S6): the refcount over live references and the
-- claims by unfinished intents that name it.
SELECT (SELECT count(*) FROM blob_references r WHERE r.digest = @digest::text)::bigint AS refs,
       (SELECT count(*) FROM intents i WHERE i.state = 'pending' AND i.expected_digest = @digest::text)::bigint AS claims;

-- name: LockBlob :one
SELECT * FROM blobs WHERE digest = @digest FOR UPDATE;

-- name: ReviveBlob :execrows
-- A collected digest whose placement verified again (re-stored bytes):
-- publication makes it live again.
UPDATE blobs SET state = 'live', updated_at = now()
WHERE digest = @digest AND state = 'collected';

-- name: ListPlacementsTx :many
SELECT * FROM placements WHERE digest = @digest ORDER BY datacenter, backend, location;

-- name: LockUnfinishedDeletion :one
SELECT * FROM deletions
WHERE digest = @digest AND backend = @backend AND datacenter = @datacenter AND location = @location AND deleted_at IS NULL
FOR UPDATE;

-- name: FinishDeletion :exec
UPDATE deletions SET deleted_at = now(), result = @result WHERE id = @id AND deleted_at IS NULL;

-- name: UnfinishedDeletions :many
-- Owed deletions, oldest first: for re-enqueueing after a crash and for
-- the oldest-overdue metric.
SELECT * FROM deletions WHERE deleted_at IS NULL ORDER BY decided_at LIMIT @max_rows;

-- name: LockBlobIfExists :many
SELECT digest, state FROM blobs WHERE digest = @digest FOR UPDATE;

-- name: OldestUnfinishedDeletionAge :one
-- Age of the oldest owed deletion by the database clock (0: none).
SELECT coalesce(extract(epoch FROM now() - min(decided_at)), 0)::float8 AS age_seconds
FROM deletions WHERE deleted_at IS NULL;

-- name: HandBackToCollector :execrows
-- An abandoned intent's claim ends. If the content it named has verified
-- bytes (the upload closed but never published), the digest must become a
-- collection candidate, or nothing would ever reclaim those bytes (L1): a
-- blob state row appears in state live (no reference yet), or a collected
-- row whose placement verified again is made live again. Sized from the
-- verified placement, never from the intent's unverified claim, so a
-- false claim cannot poison the digest's recorded size. Digests in order,
-- so concurrent hand-backs take row locks in one order.
INSERT INTO blobs (digest, size_bytes)
SELECT DISTINCT ON (p.digest) p.digest, p.size_bytes FROM placements p
WHERE p.digest = ANY(@digests::text[]) AND p.state = 'verified'
ORDER BY p.digest
ON CONFLICT (digest) DO UPDATE SET state = 'live', updated_at = now()
WHERE blobs.state = 'collected';

-- name: LockPlacementDigests :exec
-- LockPlacementDigest for a batch of digests, in digest order (the order
-- every multi-digest locker uses), for the rest of the transaction.
SELECT count(pg_advisory_xact_lock(@lock_class::int4, hashtext(s.d)))
FROM (SELECT d FROM unnest(@digests::text[]) AS d ORDER BY d) s;

-- name: DecideCollection :many
-- The collection decision for a batch of candidate rows the caller holds
-- FOR UPDATE, under their placement locks, in one statement whose snapshot
-- is taken after those locks: a reference or claim committed after the
-- candidate scan is visible here, and an owned digest is left alone. Each
-- unowned digest is marked collected, every placement of it revoked for
-- reclamation, one deletion recorded per revoked placement. One row per
-- deletion, plus one row with NULL deletion columns for a collected digest
-- that had no placement left to revoke.
WITH unowned AS (
    SELECT c.d FROM unnest(@digests::text[]) AS c(d)
    WHERE NOT EXISTS (SELECT 1 FROM blob_references r WHERE r.digest = c.d)
      AND NOT EXISTS (SELECT 1 FROM intents i WHERE i.state = 'pending' AND i.expected_digest = c.d)
      AND NOT EXISTS (SELECT 1 FROM placements p WHERE p.digest = c.d AND p.state = 'pending')
), marked AS (
    UPDATE blobs b SET state = 'collected', updated_at = now()
    FROM unowned u
    WHERE b.digest = u.d AND b.state = 'live'
    RETURNING b.digest, b.size_bytes
), revoked AS (
    UPDATE placements p
    SET state = 'revoked', reason = NULL, revoke_reason = 'reclamation',
        generation = p.generation + 1, updated_at = now()
    FROM marked m
    WHERE p.digest = m.digest AND p.state <> 'revoked'
    RETURNING p.digest, p.backend, p.datacenter, p.location, p.size_bytes
), recorded AS (
    INSERT INTO deletions (digest, backend, datacenter, location, size_bytes)
    SELECT digest, backend, datacenter, location, size_bytes FROM revoked
    ON CONFLICT (digest, backend, datacenter, location) WHERE deleted_at IS NULL DO UPDATE SET decided_at = deletions.decided_at
    RETURNING *
)
SELECT m.digest, m.size_bytes AS blob_size,
       d.id AS deletion_id, d.backend, d.datacenter, d.location, d.size_bytes AS deletion_size, d.decided_at
FROM marked m LEFT JOIN recorded d ON d.digest = m.digest
ORDER BY m.digest, d.id;

-- name: ClassifyObjects :many
-- The inventory's classification of a page of stored objects of one
-- backend in one datacenter, in one statement: unlocked for a page, and
-- under the locks for one object (store.classify). Placements by the
-- primary key (coalesce(datacenter, ''): placements.sql says why). A
-- verified placement here keeps the bytes while a live (or obliterated)
-- blob row makes the digest the collector's; with no row, or a collected
-- one, nothing would ever collect it (its upload was abandoned after its
-- verification committed): 'unowned', which the inventory hands back to
-- the collector (HandBackToCollector) instead of deleting. A referenced
-- object of a live blob with no placement row at all on this backend is
-- 'unrecorded': a copy the ledger lost (a database restored to before the
-- copy was made), which the inventory re-hashes and records as verified
-- (RediscoverPlacement, issue 32). An obliterated digest never is. A
-- collected copy whose deletion is owed is the collector's ('staged'),
-- which keeps it for the delete delay (DeletionWait).
SELECT o.digest::text AS digest,
       (CASE
            WHEN EXISTS (SELECT 1 FROM blob_references r WHERE r.digest = o.digest) THEN
                (CASE WHEN EXISTS (SELECT 1 FROM blobs b WHERE b.digest = o.digest AND b.state = 'live')
                       AND NOT EXISTS (SELECT 1 FROM placements p WHERE p.digest = o.digest AND p.backend = @backend
                                       AND coalesce(p.datacenter, '') = @datacenter::text) THEN 'unrecorded'
                      ELSE 'referenced' END)
            WHEN EXISTS (SELECT 1 FROM intents i WHERE i.state = 'pending' AND i.expected_digest = o.digest) THEN 'claimed'
            WHEN EXISTS (SELECT 1 FROM placements p WHERE p.digest = o.digest AND p.backend = @backend AND coalesce(p.datacenter, '') = @datacenter::text
                         AND p.state = 'pending') THEN 'staged'
            WHEN EXISTS (SELECT 1 FROM placements p WHERE p.digest = o.digest AND p.backend = @backend AND coalesce(p.datacenter, '') = @datacenter::text
                         AND p.state = 'verified') THEN
                (CASE WHEN EXISTS (SELECT 1 FROM blobs b WHERE b.digest = o.digest AND b.state IN ('live', 'obliterated')) THEN 'staged'
                      ELSE 'unowned' END)
            WHEN EXISTS (SELECT 1 FROM deletions d WHERE d.digest = o.digest AND d.backend = @backend AND d.datacenter = @datacenter::text
                         AND d.deleted_at IS NULL) THEN 'staged'
            ELSE 'orphan'
        END)::text AS class
FROM unnest(@digests::text[]) AS o(digest);

-- name: GetCollectorCursor :one
SELECT coalesce((SELECT after_digest FROM collector_cursor WHERE id = 1), '')::text AS after_digest;

-- name: SetCollectorCursor :exec
INSERT INTO collector_cursor (id, after_digest) VALUES (1, @after_digest)
ON CONFLICT (id) DO UPDATE SET after_digest = excluded.after_digest, updated_at = now();

-- name: CollectCandidates :many
-- What a collection pass would decide now (a dry run): unowned live
-- digests, unlocked, in digest order.
SELECT b.digest FROM blobs b
WHERE b.state = 'live'
  AND NOT EXISTS (SELECT 1 FROM blob_references r WHERE r.digest = b.digest)
  AND NOT EXISTS (SELECT 1 FROM intents i WHERE i.state = 'pending' AND i.expected_digest = b.digest)
  AND NOT EXISTS (SELECT 1 FROM placements p WHERE p.digest = b.digest AND p.state = 'pending')
ORDER BY b.digest
LIMIT @max_rows;

-- name: DeletionWait :one
-- How long an owed deletion decided at decided_at must still wait before
-- its bytes go, by the database clock: the collection delete delay keeps
-- a collected digest's bytes that long, so a database restored from a
-- backup taken within it finds every reference's bytes (issue 32). An
-- obliterated digest's bytes never wait.
SELECT (CASE WHEN b.state = 'obliterated' THEN 0
             ELSE greatest(0, sqlc.arg(delay_seconds)::float8 - date_part('epoch', now() - sqlc.arg(decided_at)::timestamptz)) END)::float8 AS wait_seconds
FROM (SELECT coalesce((SELECT state FROM blobs WHERE digest = sqlc.arg(digest)::text), '') AS state) b;
