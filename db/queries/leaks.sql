-- No leaked bytes (issue 29; db/migrations/00027_leaks.sql, store/leaks.go).

-- name: StalePendingPlacements :many
-- Pending placements whose writer is gone, from an unlocked read, oldest
-- first (placements_pending_idx): no pending intent claims the digest
-- (an upload's claim lasts from before its stage until it is admitted or
-- abandoned) and no replicate job into the row's datacenter is
-- unfinished (a transfer stages while its job runs). The caller decides
-- each again under the digest's stage lock (FailStalePlacements).
SELECT p.digest, p.backend, p.datacenter, p.location, p.generation FROM placements p
WHERE p.state = 'pending'
  AND NOT EXISTS (SELECT 1 FROM intents i WHERE i.state = 'pending' AND i.expected_digest = p.digest)
  AND NOT transfer_unfinished(p.digest, p.datacenter)
ORDER BY p.updated_at
LIMIT @max_rows;

-- name: FailStalePlacements :many
-- The decision on StalePendingPlacements' rows, under their digests'
-- stage locks (LockPlacementDigests) in one statement whose snapshot
-- follows those locks: a row still pending at the generation read (no
-- stage, verification or failure since) whose digest no pending intent
-- claims and whose datacenter no replicate job of it is copying into
-- becomes failed (source_unavailable: its writer is gone) under a new
-- epoch, so a late write of the stale writer is refused (S3). A stage
-- that follows takes the failed row over as it would any failed one.
UPDATE placements p
SET state = 'failed', reason = 'source_unavailable', revoke_reason = NULL,
    epoch = p.epoch + 1, generation = p.generation + 1, updated_at = now()
FROM (SELECT unnest(@digests::text[]) AS digest, unnest(@backends::text[]) AS backend, unnest(@datacenters::text[]) AS datacenter,
             unnest(@locations::text[]) AS location, unnest(@generations::bigint[]) AS generation) c
WHERE p.digest = ANY (@digests::text[])
  AND p.digest = c.digest AND p.backend = c.backend AND p.datacenter = c.datacenter AND p.location = c.location
  AND coalesce(p.state, '') = 'pending' AND p.generation = c.generation
  AND NOT EXISTS (SELECT 1 FROM intents i WHERE i.state = 'pending' AND i.expected_digest = p.digest)
  AND NOT transfer_unfinished(p.digest, p.datacenter)
RETURNING p.*;

-- name: EnsureClusterIdentity :one
-- This database's identity, made on first use. DO UPDATE (of nothing)
-- rather than DO NOTHING: it returns the row a concurrent first user just
-- committed.
INSERT INTO cluster_identity (singleton) VALUES (true)
ON CONFLICT (singleton) DO UPDATE SET singleton = true
RETURNING cluster_id;

-- name: GetClusterIdentity :many
SELECT cluster_id FROM cluster_identity;

-- name: GetBackendMarker :many
SELECT * FROM backend_markers WHERE datacenter = @datacenter AND backend = @backend;

-- name: AdoptBackend :one
-- The first inventory pass over a backend with no marker claims it: the
-- row first, the marker after (ConfirmMarkerWritten). A concurrent pass
-- that adopted it first wins; the row comes back either way.
INSERT INTO backend_markers (datacenter, backend) VALUES (@datacenter, @backend)
ON CONFLICT (datacenter, backend) DO UPDATE SET datacenter = backend_markers.datacenter
RETURNING *;

-- name: ReadoptBackend :one
-- An operator's re-adoption after checking the backend belongs here (a
-- replaced disk or bucket, a database restored on purpose): the row is
-- made or reset, its pass past the marker's (@pass), and the marker is
-- rewritten after it.
INSERT INTO backend_markers (datacenter, backend, pass) VALUES (@datacenter, @backend, @pass)
ON CONFLICT (datacenter, backend) DO UPDATE
SET pass = greatest(backend_markers.pass + 1, excluded.pass), adopted_at = now(),
    marker_written_at = NULL, capped_pass = NULL, updated_at = now()
RETURNING *;

-- name: ConfirmMarkerWritten :execrows
UPDATE backend_markers SET marker_written_at = now(), updated_at = now()
WHERE datacenter = @datacenter AND backend = @backend AND pass >= @pass;

-- name: AdvanceInventoryPass :one
-- A pass that found the marker in agreement: the row's pass advances
-- (then the marker is rewritten with it), only while the marker is not
-- ahead of the row (@marker_pass: what the pass read). No row back: it
-- is, or the marker was never confirmed; the pass deletes nothing.
UPDATE backend_markers SET pass = pass + 1, updated_at = now()
WHERE datacenter = @datacenter AND backend = @backend
  AND marker_written_at IS NOT NULL AND pass >= @marker_pass::bigint
RETURNING *;

-- name: SetInventoryCapped :exec
UPDATE backend_markers SET capped_pass = sqlc.narg(capped_pass), updated_at = now()
WHERE datacenter = @datacenter AND backend = @backend;

-- name: BackendHasPlacements :one
-- Whether the ledger knows any placement on this backend of this
-- datacenter: a database that knows none looks empty, and the inventory
-- deletes nothing on its word.
SELECT EXISTS (SELECT 1 FROM placements WHERE datacenter = @datacenter AND backend = @backend)::bool AS known;

-- name: OwnedStagedUploads :many
-- Which of these staged upload ids an intent of the backend still owns:
-- a pending intent's (its upload in progress), or an abandoned intent's
-- whose staged bytes the reaper has not yet deleted (it deletes and
-- records them itself). Each arm reaches its intents through a partial
-- index (pending; abandoned and undeleted).
SELECT i.staged_location::text AS id FROM intents i
WHERE i.state = 'pending' AND i.ingress_datacenter = @datacenter AND i.backend = @backend
  AND i.staged_location = ANY (@ids::text[])
UNION
SELECT a.staged_location::text FROM intents a
WHERE a.state = 'abandoned' AND a.staged_deleted_at IS NULL AND a.staged_location IS NOT NULL
  AND a.ingress_datacenter = @datacenter AND a.backend = @backend
  AND a.staged_location = ANY (@ids::text[]);
