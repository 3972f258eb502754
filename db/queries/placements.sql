-- Placement ledger queries. The table is an optional persistence domain
-- (db/schema/placements.sql); store creates it before the first write.
--
-- A statement that reaches one placement by its key writes the
-- datacenter's equality as coalesce(datacenter, '') = @datacenter
-- (datacenter is NOT NULL: the coalesce changes nothing but the plan).
-- Written datacenter = @datacenter, the (datacenter, state) index could
-- serve it too; a connection caches a statement's generic plan, and one
-- made while the table was a few pages (a new store, never analyzed)
-- costed that index below the primary key and kept it: each lookup then
-- walked every placement of the datacenter until an ANALYZE replanned it
-- (TestByKeyStatementsUseTheKeyInANewStore, docs/performance.md item 33).
-- The state is written coalesce(state, '') for the same reason
-- (uploads.sql).

-- name: LockPlacementDigest :exec
-- Serializes stages of one digest (the 64-placement bound) for the rest of
-- the transaction. The two-key form keeps these locks apart from others.
SELECT pg_advisory_xact_lock(@lock_class::int4, hashtext(@digest::text));

-- name: GetPlacementForUpdate :one
SELECT * FROM placements
WHERE digest = @digest AND backend = @backend AND coalesce(datacenter, '') = @datacenter::text AND location = @location
FOR UPDATE;

-- name: GetPlacement :one
SELECT * FROM placements
WHERE digest = @digest AND backend = @backend AND coalesce(datacenter, '') = @datacenter::text AND location = @location;

-- name: GetPlacementIfChanged :one
SELECT * FROM placements
WHERE digest = @digest AND backend = @backend AND coalesce(datacenter, '') = @datacenter::text AND location = @location
  AND generation <> @since_generation::bigint;

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
WHERE digest = @digest AND backend = @backend AND coalesce(datacenter, '') = @datacenter::text AND location = @location
  AND epoch <= @epoch
  AND generation = @generation
RETURNING *;

-- name: FailStagedPlacement :one
-- A close whose bytes did not hash to the key's digest fails only the
-- stage it made (@generation, still pending): never a row another upload
-- re-staged or verified since (issue 26, S9). No row back: nothing
-- changed.
UPDATE placements
SET state = 'failed', reason = @reason::text, revoke_reason = NULL,
    generation = generation + 1, updated_at = now()
WHERE digest = @digest AND backend = @backend AND coalesce(datacenter, '') = @datacenter::text AND location = @location
  AND coalesce(state, '') = 'pending' AND generation = @generation
RETURNING *;

-- name: VerifyPendingPlacement :one
-- The common verification in one statement: a pending row whose staged
-- size the backend confirmed (with the key's digest, which the caller
-- checked) becomes verified, as UpdatePlacement would write the
-- transition pending -> verified (placement.Transition). No row back: not
-- that case (absent, another state, another size, a higher epoch); the
-- caller takes the general path (GetPlacementForUpdate, Transition).
-- The pending check and the datacenter are written so that neither
-- placements_pending_idx nor (datacenter, state) can serve it: the row is
-- reached by its key, not by walking every pending entry, dead ones
-- included, or every placement of the datacenter (see above).
UPDATE placements
SET state = 'verified', reason = NULL, revoke_reason = NULL,
    epoch = @epoch, generation = generation + 1, updated_at = now(), verified_at = now()
WHERE digest = @digest AND backend = @backend AND coalesce(datacenter, '') = @datacenter::text AND location = @location
  AND coalesce(state, '') = 'pending' AND size_bytes = @size_bytes AND epoch <= @epoch
RETURNING *;

-- name: InsertPlacementIfAbsent :one
-- A new pending row for a key that has none (the common stage), unless
-- the digest already holds @max_per_digest placements. No row back: the
-- key has a row (the caller re-stages it: GetPlacementForUpdate,
-- Transition) or the digest is at the bound. The caller holds the
-- digest's stage lock (LockPlacementDigest) from an earlier statement, so
-- this statement's snapshot sees every stage committed before the lock:
-- the count and the insert are one decision. With @claimed_by, only when
-- that pending intent claims the digest and size in a row version this
-- transaction wrote (xmin): pipelined after the claim in one transaction
-- (ClaimIntentContent in store.ClaimAndStage and ClaimSessionAndStage,
-- CreateIntent in store.OpenAndStage), this is true exactly when the
-- claim succeeded and took the lock. An intent that claimed the content
-- earlier does not count: a claim that declined it (ClaimSessionAndStage's
-- guards) stages nothing. (The intent is reached by its key: the pending
-- check's coalesce, as in uploads.sql.)
INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch, generation, created_at, updated_at)
SELECT @digest::text, @backend::text, @datacenter::text, @location::text, 'pending', @size_bytes, @epoch, 1, now(), now()
WHERE (SELECT count(*) FROM placements WHERE digest = @digest::text) < @max_per_digest::bigint
  AND (sqlc.narg(claimed_by)::uuid IS NULL OR EXISTS (
      SELECT 1 FROM intents
      WHERE operation_id = sqlc.narg(claimed_by)::uuid AND coalesce(state, '') = 'pending'
        AND expected_digest = @digest::text AND expected_size = @size_bytes
        AND xmin = pg_current_xact_id_if_assigned()::xid))
ON CONFLICT (digest, backend, datacenter, location) DO NOTHING
RETURNING *;

-- name: ListPlacements :many
-- The routing query: one index range scan on the primary key.
SELECT * FROM placements WHERE digest = @digest
ORDER BY datacenter, backend, location;

-- name: VerifyPendingPlacements :many
-- VerifyPendingPlacement of each call of a Finalize batch (uploads.sql),
-- one array per parameter. The digests as an array (= ANY) give the
-- primary key an index condition of its own, so the rows are reached by
-- key however small the table was when the plan was made.
UPDATE placements p
SET state = 'verified', reason = NULL, revoke_reason = NULL,
    epoch = v.epoch, generation = p.generation + 1, updated_at = now(), verified_at = now()
FROM (SELECT unnest(@digests::text[]) AS digest, unnest(@backends::text[]) AS backend, unnest(@datacenters::text[]) AS datacenter,
             unnest(@locations::text[]) AS location, unnest(@sizes::bigint[]) AS size_bytes, unnest(@epochs::bigint[]) AS epoch) v
WHERE p.digest = ANY (@digests::text[])
  AND p.digest = v.digest AND p.backend = v.backend AND p.datacenter = v.datacenter AND p.location = v.location
  AND coalesce(p.state, '') = 'pending' AND p.size_bytes = v.size_bytes AND p.epoch <= v.epoch
RETURNING p.*;

-- name: InsertPlacementsIfAbsent :many
-- InsertPlacementIfAbsent, claimed, of each call of a merged claim batch
-- (store/claim_batch.go), one array per parameter, no digest twice. Each
-- count and each claim is a lookup by key per call (scalar subqueries,
-- which are not turned into joins).
INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch, generation, created_at, updated_at)
SELECT c.digest, c.backend, c.datacenter, c.location, 'pending', c.size_bytes, c.epoch, 1, now(), now()
FROM (SELECT unnest(@digests::text[]) AS digest, unnest(@backends::text[]) AS backend, unnest(@datacenters::text[]) AS datacenter,
             unnest(@locations::text[]) AS location, unnest(@sizes::bigint[]) AS size_bytes, unnest(@epochs::bigint[]) AS epoch,
             unnest(@claimed_by::uuid[]) AS claimed_by) c
WHERE (SELECT count(*) FROM placements p WHERE p.digest = c.digest) < @max_per_digest::bigint
  AND coalesce((SELECT true FROM intents i
                WHERE i.operation_id = c.claimed_by AND coalesce(i.state, '') = 'pending'
                  AND i.expected_digest = c.digest AND i.expected_size = c.size_bytes
                  AND i.xmin = pg_current_xact_id_if_assigned()::xid
                LIMIT 1), false)
ON CONFLICT (digest, backend, datacenter, location) DO NOTHING
RETURNING *;
