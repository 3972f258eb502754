-- name: InsertSigningKey :exec
INSERT INTO map_signing_keys (key_id, alg, public_key, not_before, not_after)
VALUES (@key_id, @alg, @public_key, @not_before, @not_after);

-- name: ListSigningKeys :many
SELECT * FROM map_signing_keys ORDER BY not_before, key_id;

-- name: LockMapPublication :exec
SELECT pg_advisory_xact_lock(hashtext('blobplane_map_publish'));

-- name: LatestMapVersion :one
SELECT coalesce(max(version), 0)::bigint AS version FROM partition_maps;

-- name: InsertMap :execrows
-- The version test rides in the statement as well as in the trigger, so a
-- regression is refused even by a caller that skipped the lock (R6).
INSERT INTO partition_maps (version, document, key_id, generated_at)
SELECT @version, @document, @key_id, @generated_at
WHERE @version::bigint > (SELECT coalesce(max(version), 0) FROM partition_maps);

-- name: InsertMapDelta :exec
INSERT INTO map_deltas (base_version, version, document, key_id)
VALUES (@base_version, @version, @document, @key_id);

-- name: LatestMap :one
-- The newest map everyone adopts: a canary not yet promoted, and a
-- withdrawn one, are skipped (R120).
SELECT m.document FROM partition_maps m
WHERE NOT EXISTS (SELECT 1 FROM map_canaries c WHERE c.version = m.version AND c.state <> 'promoted')
ORDER BY m.version DESC LIMIT 1;

-- name: LatestMapFor :one
-- The newest map node adopts: as LatestMap, plus a canary naming node.
SELECT m.document FROM partition_maps m
WHERE NOT EXISTS (SELECT 1 FROM map_canaries c WHERE c.version = m.version
                  AND (c.state = 'withdrawn' OR (c.state = 'canary' AND NOT (@node::text = ANY(c.nodes)))))
ORDER BY m.version DESC LIMIT 1;

-- name: MapByVersion :one
SELECT document FROM partition_maps WHERE version = @version;

-- name: MapDeltaFrom :one
-- The newest stored delta from base_version.
SELECT document FROM map_deltas WHERE base_version = @base_version ORDER BY version DESC LIMIT 1;

-- name: AcquireLease :one
-- ACQUIRE: create the record at epoch 1, or claim an expired one at
-- epoch + 1 in the same write (R15). Like every lease write it is one
-- conditional statement on the database clock whose returned row decides
-- the outcome. Racing claimants serialise on the row
-- lock; the loser re-evaluates expires_at < now() against the winner's
-- row, finds it live, and gets no row.
--
-- With @take_back (issue 27, docs/authority.md "Taking a lease back"), a
-- live record whose owner is @node is claimed too, at epoch + 1 like any
-- claim (R15, R27): a restarted process that keeps its node id serves at
-- once instead of waiting out the TTL of the incarnation it replaces,
-- which the new epoch fences (R20). Only a record held the ordinary way
-- (RESTORING, CATCHING_UP, SERVING): after a seal the partition moves
-- only to its successor (R74), and a quarantined one is not placed (R59).
--
-- A split or merge child's first lease is at its planned epoch, above
-- its parents' (R16; handoff_children), whoever creates it.
INSERT INTO leases AS l (partition_id, epoch, owner_node, owner_endpoint, state,
                         lease_ttl_ms, renew_interval_ms, expires_at, renewed_at)
SELECT @partition_id, coalesce((SELECT c.epoch FROM handoff_children c WHERE c.child_id = @partition_id), 1), @node, @endpoint, 'RESTORING',
       t.ttl_ms, @renew_ms, now() + t.ttl_ms * interval '1 millisecond', now()
FROM (SELECT @ttl_ms::bigint AS ttl_ms) AS t
ON CONFLICT (partition_id) DO UPDATE
SET epoch = l.epoch + 1,
    owner_node = EXCLUDED.owner_node,
    owner_endpoint = EXCLUDED.owner_endpoint,
    state = 'RESTORING',
    lease_ttl_ms = EXCLUDED.lease_ttl_ms,
    renew_interval_ms = EXCLUDED.renew_interval_ms,
    expires_at = EXCLUDED.expires_at,
    renewed_at = now()
WHERE l.expires_at < now()
   OR (@take_back::boolean AND l.owner_node = EXCLUDED.owner_node
       AND l.state IN ('RESTORING', 'CATCHING_UP', 'SERVING'))
RETURNING *;

-- name: RenewLease :one
-- RENEW: extend under my epoch (R14, R20); never a sealed lease (R74:
-- after the seal the outgoing primary does not serve again).
UPDATE leases
SET expires_at = now() + lease_ttl_ms * interval '1 millisecond',
    renewed_at = now()
WHERE partition_id = @partition_id AND epoch = @epoch AND owner_node = @node AND state <> 'SEALED'
RETURNING *;

-- name: FenceLease :execrows
-- FENCE with nothing to move: succeeds only while node still holds the
-- record at epoch (R20). Taking the row lock orders it against a racing
-- ACQUIRE or FORCE.
UPDATE leases SET epoch = epoch
WHERE partition_id = @partition_id AND epoch = @epoch AND owner_node = @node;

-- name: FenceLeaseWrite :one
-- FENCE: move the checkpoint pointer, the state or the sealed LSN under my
-- epoch (R20, R22). The leases_guard trigger refuses un-sealing and a
-- second seal under the same epoch (R74) with SQLSTATE BPS01.
UPDATE leases
SET checkpoint_pointer = coalesce(sqlc.narg(checkpoint_pointer)::text, checkpoint_pointer),
    state = coalesce(sqlc.narg(state)::text, state),
    sealed_lsn = coalesce(sqlc.narg(sealed_lsn)::bigint, sealed_lsn)
WHERE partition_id = @partition_id AND epoch = @epoch AND owner_node = @node
RETURNING *;

-- name: ForceLease :one
-- FORCE: ACQUIRE without the expiry test, and nothing else (R26, R27), with
-- the operator's audit trail (R28). An existing record keeps its TTL and
-- renewal interval.
INSERT INTO leases AS l (partition_id, epoch, owner_node, owner_endpoint, state,
                         lease_ttl_ms, renew_interval_ms, expires_at, renewed_at,
                         taken_by, taken_reason, taken_at, taken_epoch)
SELECT @partition_id, 1, @node, @endpoint, 'RESTORING',
       t.ttl_ms, @renew_ms, now() + t.ttl_ms * interval '1 millisecond', now(),
       @operator::text, @reason::text, now(), 1
FROM (SELECT @ttl_ms::bigint AS ttl_ms) AS t
ON CONFLICT (partition_id) DO UPDATE
SET epoch = l.epoch + 1,
    owner_node = EXCLUDED.owner_node,
    owner_endpoint = EXCLUDED.owner_endpoint,
    state = 'RESTORING',
    expires_at = now() + l.lease_ttl_ms * interval '1 millisecond',
    renewed_at = now(),
    taken_by = EXCLUDED.taken_by,
    taken_reason = EXCLUDED.taken_reason,
    taken_at = now(),
    taken_epoch = l.epoch + 1
RETURNING *;

-- name: GetLease :one
SELECT * FROM leases WHERE partition_id = @partition_id;

-- name: ListLeases :many
SELECT * FROM leases ORDER BY partition_id;
