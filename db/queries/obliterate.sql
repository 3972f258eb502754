-- Obliteration (db/migrations/00026_obliteration.sql, store/obliterate.go,
-- docs/obliteration.md).
--
-- Lock order, the same in every statement sequence here: the blob state
-- row first (FOR UPDATE to mark or unmark, FOR SHARE in the job's steps),
-- then the digest's stage lock (LockPlacementDigest), then rows of
-- intents or placements, which the job's steps take with SKIP LOCKED: a
-- row another transaction holds is a close or a transfer in flight, whose
-- Finalize waits for the blob row behind this transaction (it locks the
-- intent or the placement first), so waiting for it here could deadlock.
-- A skipped row is counted (busy) and taken by a later pass.

-- name: MarkObliterated :execrows
-- The mark, on the row the caller locked (LockBlob): a live or collected
-- row leaving live NOTIFYs blobplane_refs (00012), which with the
-- references' deletion empties every api's existence cache.
UPDATE blobs SET state = 'obliterated', updated_at = now()
WHERE digest = @digest AND state <> 'obliterated';

-- name: UnmarkObliterated :execrows
-- Lifts the mark, on the row the caller locked: @state is collected when
-- every placement is revoked (the obliteration finished: the bytes are
-- deleted or being deleted, exactly what collected means), live otherwise
-- (the collector then reclaims whatever the job left).
UPDATE blobs SET state = @state::text, updated_at = now()
WHERE digest = @digest AND state = 'obliterated' AND @state::text IN ('live', 'collected');

-- name: InsertObliterationAudit :one
INSERT INTO blob_obliterations (digest, action, principal, reason)
VALUES (@digest, @action, @principal, @reason)
RETURNING *;

-- name: FinishObliterationAudit :execrows
-- The obliterate job found nothing left to do for this mark.
UPDATE blob_obliterations SET finished_at = now()
WHERE id = @id AND action = 'obliterate' AND finished_at IS NULL;

-- name: ObliterationHistory :many
-- A digest's audit rows, newest first (the current mark is the first one
-- when the blob row is obliterated).
SELECT * FROM blob_obliterations WHERE digest = @digest ORDER BY id DESC LIMIT @max_rows;

-- name: LockObliterationMark :one
-- A job step's check that the mark it works for still holds, taken first
-- in its transaction: the blob row FOR SHARE (an unmark or a publication
-- waits for the step's commit; after a wait the row is read as committed
-- since) and the digest's newest audit row. No row: the blob row is gone.
SELECT b.state::text AS state, b.size_bytes,
       coalesce((SELECT o.id FROM blob_obliterations o WHERE o.digest = b.digest ORDER BY o.id DESC LIMIT 1), 0)::bigint AS latest_mark,
       coalesce((SELECT extract(epoch FROM now() - o.at) FROM blob_obliterations o WHERE o.id = @mark::bigint), 0)::float8 AS mark_age_seconds
FROM blobs b WHERE b.digest = @digest
FOR SHARE OF b;

-- name: DeleteReferencesOf :execrows
-- Every reference to the digest (its own statement after the mark, so its
-- snapshot sees a reference a publication committed while the mark
-- waited for the blob row).
DELETE FROM blob_references WHERE digest = @digest;

-- name: AbandonClaimsOf :one
-- Every pending intent claiming the digest becomes abandoned (it could
-- never publish: Finalize refuses the mark), so its claim no longer owns
-- the bytes the deletions must remove (store.DeleteCollectedBytes, S6).
-- An intent another transaction holds (a Finalize in flight, refused at
-- the blob row) is skipped and counted as busy.
WITH locked AS (
    SELECT operation_id FROM intents
    WHERE expected_digest = @digest::text AND state = 'pending'
    FOR UPDATE SKIP LOCKED
), abandoned AS (
    UPDATE intents i SET state = 'abandoned', updated_at = now()
    FROM locked l WHERE i.operation_id = l.operation_id
    RETURNING i.operation_id
)
SELECT (SELECT count(*) FROM abandoned)::bigint AS abandoned,
       ((SELECT count(*) FROM intents WHERE expected_digest = @digest::text AND state = 'pending')
        - (SELECT count(*) FROM locked))::bigint AS busy;

-- name: RevokeForObliteration :one
-- Every placement of the digest not yet revoked for reclamation is
-- revoked for it (its bytes are reclaimed, as the collector's are: the
-- byte deletion deletes only such a placement's), its generation
-- advanced; a row another transaction holds (a verification or a
-- transfer in flight) is skipped and counted as busy. The caller holds
-- the digest's stage lock.
WITH locked AS (
    SELECT digest, backend, datacenter, location FROM placements
    WHERE digest = @digest::text AND (state <> 'revoked' OR revoke_reason <> 'reclamation')
    FOR UPDATE SKIP LOCKED
), revoked AS (
    UPDATE placements p
    SET state = 'revoked', reason = NULL, revoke_reason = 'reclamation',
        generation = p.generation + 1, updated_at = now()
    FROM locked l
    WHERE p.digest = l.digest AND p.backend = l.backend AND p.datacenter = l.datacenter AND p.location = l.location
    RETURNING p.digest
)
SELECT (SELECT count(*) FROM revoked)::bigint AS revoked,
       ((SELECT count(*) FROM placements WHERE digest = @digest::text AND (state <> 'revoked' OR revoke_reason <> 'reclamation'))
        - (SELECT count(*) FROM locked))::bigint AS busy;

-- name: RecordObliterationDeletions :execrows
-- One unfinished deletion per revoked placement of the digest whose bytes
-- may still be there: none is owed yet, and none finished deleted since
-- the placement last changed (a deletion decided before a re-stage does
-- not cover the bytes stored after it). The delete_bytes job of each
-- (store.DeleteCollectedBytes) deletes only while the placement is still
-- revoked and nothing owns the digest.
INSERT INTO deletions (digest, backend, datacenter, location, size_bytes)
SELECT p.digest, p.backend, p.datacenter, p.location, p.size_bytes FROM placements p
WHERE p.digest = @digest::text AND p.state = 'revoked'
  AND NOT EXISTS (
      SELECT 1 FROM deletions d
      WHERE d.digest = p.digest AND d.backend = p.backend AND d.datacenter = p.datacenter AND d.location = p.location
        AND (d.deleted_at IS NULL OR (d.result = 'deleted' AND d.decided_at >= p.updated_at)))
ON CONFLICT (digest, backend, datacenter, location) WHERE deleted_at IS NULL DO NOTHING;

-- name: UnfinishedDeletionsOf :many
-- The digest's owed deletions, whose delete_bytes jobs the step enqueues
-- (unique by key: an existing one is not doubled).
SELECT * FROM deletions WHERE digest = @digest AND deleted_at IS NULL ORDER BY id;

-- name: ObliterationProgress :one
-- What is left of a digest for an obliteration (GET .../obliterate and
-- the job's last check): references, pending intents claiming it,
-- placements not revoked, deletions owed.
SELECT (SELECT count(*) FROM blob_references r WHERE r.digest = @digest::text)::bigint AS refs,
       (SELECT count(*) FROM intents i WHERE i.expected_digest = @digest::text AND i.state = 'pending')::bigint AS pending_intents,
       (SELECT count(*) FROM placements p WHERE p.digest = @digest::text AND p.state <> 'revoked')::bigint AS unrevoked,
       (SELECT count(*) FROM deletions d WHERE d.digest = @digest::text AND d.deleted_at IS NULL)::bigint AS owed_deletions;

-- name: IsObliterated :one
-- Whether the digest is obliterated now (the upload flow's explanation of
-- a claim refused by the statements of uploads.sql).
SELECT EXISTS (SELECT 1 FROM blobs WHERE digest = @digest AND state = 'obliterated') AS obliterated;
