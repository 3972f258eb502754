-- Collection of unreferenced content (db/migrations/00007_collect.sql).

-- name: LockCollectCandidates :many
-- Live blob rows that look unowned under this statement's snapshot, locked
-- so that a publication of the same digest (EnsureBlob) waits for the
-- decision. SKIP LOCKED: a row a publication holds is being published, and
-- a concurrent collector takes other rows. The caller re-checks ownership
-- with a fresh statement after the lock (a reference committed between
-- this snapshot and the lock is not visible here). A pass walks the
-- primary key from its cursor (after), so it never scans a row twice.
SELECT b.digest, b.size_bytes FROM blobs b
WHERE b.state = 'live'
  AND NOT EXISTS (SELECT 1 FROM blob_references r WHERE r.digest = b.digest)
  AND NOT EXISTS (SELECT 1 FROM intents i WHERE i.state = 'pending' AND i.expected_digest = b.digest)
  AND NOT EXISTS (SELECT 1 FROM placements p WHERE p.digest = b.digest AND p.state = 'pending')
  AND b.digest > @after::text
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

-- name: MarkBlobCollected :execrows
UPDATE blobs SET state = 'collected', updated_at = now()
WHERE digest = @digest AND state = 'live';

-- name: ReviveBlob :execrows
-- A collected digest whose placement verified again (re-stored bytes):
-- publication makes it live again.
UPDATE blobs SET state = 'live', updated_at = now()
WHERE digest = @digest AND state = 'collected';

-- name: RevokePlacementsForReclamation :many
-- Every placement of a collected digest stops serving and stops protecting
-- its bytes. A re-stage (a new upload of the same content) moves it out of
-- revoked again, which the byte-deletion job sees.
UPDATE placements
SET state = 'revoked', reason = NULL, revoke_reason = 'reclamation',
    generation = generation + 1, updated_at = now()
WHERE digest = @digest AND state <> 'revoked'
RETURNING *;

-- name: ListPlacementsTx :many
SELECT * FROM placements WHERE digest = @digest ORDER BY datacenter, backend, location;

-- name: InsertDeletion :one
INSERT INTO deletions (digest, backend, datacenter, location, size_bytes)
VALUES (@digest, @backend, @datacenter, @location, @size_bytes)
ON CONFLICT (digest, backend, datacenter, location) WHERE deleted_at IS NULL DO UPDATE SET decided_at = deletions.decided_at
RETURNING *;

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

-- name: PlacementsAt :many
-- Placements of a digest in one backend of one datacenter (inventory).
SELECT * FROM placements WHERE digest = @digest AND backend = @backend AND datacenter = @datacenter;

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
