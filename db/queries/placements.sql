-- Placement ledger queries. The table is an optional persistence domain
-- (db/schema/placements.sql); store creates it before the first write.

-- name: LockPlacementDigest :exec
-- Serializes stages of one digest (the 64-placement bound) for the rest of
-- the transaction. The two-key form keeps these locks apart from others.
SELECT pg_advisory_xact_lock(@lock_class::int4, hashtext(@digest::text));

-- name: GetPlacementForUpdate :one
SELECT * FROM placements
WHERE digest = @digest AND backend = @backend AND datacenter = @datacenter AND location = @location
FOR UPDATE;

-- name: GetPlacement :one
SELECT * FROM placements
WHERE digest = @digest AND backend = @backend AND datacenter = @datacenter AND location = @location;

-- name: GetPlacementIfChanged :one
SELECT * FROM placements
WHERE digest = @digest AND backend = @backend AND datacenter = @datacenter AND location = @location
  AND generation <> @since_generation::bigint;

-- name: CountPlacements :one
SELECT count(*) FROM placements WHERE digest = @digest;

-- name: InsertPlacement :one
INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch, generation, created_at, updated_at)
VALUES (@digest, @backend, @datacenter, @location, 'pending', @size_bytes, @epoch, 1, now(), now())
RETURNING *;

-- name: UpdatePlacement :one
-- One fenced transition. The epoch fence and the generation the caller read
-- are in the WHERE clause: no row back means the write was refused.
UPDATE placements
SET state = @state,
    reason = sqlc.narg(reason),
    revoke_reason = sqlc.narg(revoke_reason),
    size_bytes = @size_bytes,
    epoch = @epoch,
    generation = generation + 1,
    updated_at = now(),
    verified_at = CASE WHEN @state::text = 'verified' THEN now() ELSE verified_at END
WHERE digest = @digest AND backend = @backend AND datacenter = @datacenter AND location = @location
  AND epoch <= @epoch
  AND generation = @generation
RETURNING *;

-- name: ListPlacements :many
-- The routing query: one index range scan on the primary key.
SELECT * FROM placements WHERE digest = @digest
ORDER BY datacenter, backend, location;
