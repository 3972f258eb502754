-- Admission and publication queries (db/migrations/00005_uploads.sql).
--
-- A statement that reaches one intent by its operation id and re-checks
-- that it is pending writes the check as coalesce(state, '') = 'pending'
-- (state is NOT NULL: the coalesce changes nothing but the plan), as the
-- reaper does (sweep_intents.sql). Written state = 'pending', it matches
-- the partial indexes on pending intents, and with statistics that count
-- almost no pending rows (a busy store's: every upload's intent is
-- pending for milliseconds) Postgres preferred those small-looking
-- indexes over the primary key and walked every entry in them, dead ones
-- included: every upload since the last vacuum, ~1.4 ms at 10,000
-- (TestByKeyStatementsUseTheKey, docs/performance.md item 29).

-- name: CreateIntent :one
-- Commits without waiting for its WAL flush: set_config(..., true) lasts
-- for this statement's own transaction, so its commit is asynchronous
-- (store.CreateIntent says why that is safe). @operation_id NULL draws a
-- new id; store.OpenAndStage names its own, to stage under it in the same
-- round trip. An intent declaring an obliterated digest is not created
-- (no row back; the upload flow asks IsObliterated why): a claim of
-- obliterated content never commits, so nothing is staged for it
-- (issue 29, docs/obliteration.md).
WITH async_commit AS (SELECT set_config('synchronous_commit', 'off', true) AS setting)
INSERT INTO intents (operation_id, repository, principal, expected_digest, expected_size, ingress_datacenter, backend, staged_location, expires_at)
SELECT coalesce(sqlc.narg(operation_id)::uuid, gen_random_uuid()), @repository, @principal, sqlc.narg(expected_digest)::text, sqlc.narg(expected_size), @ingress_datacenter, @backend,
       sqlc.narg(staged_location), now() + make_interval(secs => @ttl_seconds::float8)
FROM async_commit
WHERE NOT EXISTS (SELECT 1 FROM blobs b WHERE b.digest = sqlc.narg(expected_digest)::text AND b.state = 'obliterated')
RETURNING *;

-- name: CreateIntents :many
-- CreateIntent of each call of a merged claim batch (store/claim_batch.go),
-- one array per parameter, the operation ids drawn by the caller; ''
-- (and -1 for a size) stand for NULL. Asynchronous, as CreateIntent; a
-- call declaring an obliterated digest gets no row, as CreateIntent.
WITH async_commit AS (SELECT set_config('synchronous_commit', 'off', true) AS setting)
INSERT INTO intents (operation_id, repository, principal, expected_digest, expected_size, ingress_datacenter, backend, staged_location, expires_at)
SELECT c.operation_id, c.repository, c.principal, nullif(c.expected_digest, ''), nullif(c.expected_size, -1), c.ingress_datacenter, c.backend,
       nullif(c.staged_location, ''), now() + make_interval(secs => c.ttl_seconds)
FROM (SELECT unnest(@operation_ids::uuid[]) AS operation_id, unnest(@repositories::text[]) AS repository,
             unnest(@principals::text[]) AS principal, unnest(@expected_digests::text[]) AS expected_digest,
             unnest(@expected_sizes::bigint[]) AS expected_size, unnest(@ingress_datacenters::text[]) AS ingress_datacenter,
             unnest(@backends::text[]) AS backend, unnest(@staged_locations::text[]) AS staged_location,
             unnest(@ttl_seconds::float8[]) AS ttl_seconds) c, async_commit
WHERE NOT EXISTS (SELECT 1 FROM blobs b WHERE b.digest = c.expected_digest AND b.state = 'obliterated')
RETURNING *;

-- name: GetIntent :one
SELECT * FROM intents WHERE operation_id = @operation_id;

-- name: LockIntent :one
SELECT * FROM intents WHERE operation_id = @operation_id FOR UPDATE;

-- name: ExtendIntent :one
-- One chunk landed: record the staged size (and the staged location the
-- first time) and move the expiry forward. Terminal intents take no
-- progress: no row back means the intent is not pending.
UPDATE intents
SET received_bytes = @received_bytes,
    staged_location = coalesce(staged_location, sqlc.narg(staged_location)),
    expires_at = greatest(expires_at, now() + make_interval(secs => @ttl_seconds::float8)),
    updated_at = now()
WHERE operation_id = @operation_id AND coalesce(state, '') = 'pending'
  AND (sqlc.narg(staged_location)::text IS NULL OR staged_location IS NULL OR staged_location = sqlc.narg(staged_location))
RETURNING *;

-- name: ClaimIntentContent :one
-- RecordIntentContent, then the stage lock of the digest
-- (LockPlacementDigest) for the rest of the transaction, in one round
-- trip: ClaimAndStage's first statement. With @session_repository set
-- it claims only a session the OCI PUT could close with its body
-- unread: of that repository, on @session_backend, nothing staged yet
-- (ClaimSessionAndStage). No row back: not claimed, and no lock taken;
-- so for an obliterated digest (issue 29).
WITH claimed AS (
    UPDATE intents
    SET expected_digest = @digest::text, expected_size = @size_bytes::bigint, received_bytes = @size_bytes::bigint, updated_at = now()
    WHERE operation_id = @operation_id AND coalesce(state, '') = 'pending'
      AND coalesce(expected_digest, @digest::text) = @digest::text
      AND coalesce(expected_size, @size_bytes::bigint) = @size_bytes::bigint
      AND NOT EXISTS (SELECT 1 FROM blobs b WHERE b.digest = @digest::text AND b.state = 'obliterated')
      AND (sqlc.narg(session_repository)::text IS NULL
           OR (repository = sqlc.narg(session_repository)::text AND backend = sqlc.narg(session_backend)::text AND staged_location IS NULL))
    RETURNING *
)
SELECT c.operation_id, c.repository, c.principal, c.expected_digest, c.expected_size, c.ingress_datacenter, c.backend,
       c.staged_location, c.state, c.received_bytes, c.created_at, c.updated_at, c.expires_at, c.staged_deleted_at,
       c.possession, c.mounted_from, c.accepted_at
FROM claimed c, LATERAL pg_advisory_xact_lock(@lock_class::int4, hashtext(@digest::text)) AS stage_lock;

-- name: RecordIntentContent :one
-- Close: the verified digest and size become the intent's, unless it
-- already claimed different ones or the digest is obliterated (then no
-- row back).
UPDATE intents
SET expected_digest = @digest::text, expected_size = @size_bytes::bigint, received_bytes = @size_bytes::bigint, updated_at = now()
WHERE operation_id = @operation_id AND coalesce(state, '') = 'pending'
  AND coalesce(expected_digest, @digest::text) = @digest::text
  AND coalesce(expected_size, @size_bytes::bigint) = @size_bytes::bigint
  AND NOT EXISTS (SELECT 1 FROM blobs b WHERE b.digest = @digest::text AND b.state = 'obliterated')
RETURNING *;

-- name: CreateMountIntent :one
-- A mount's intent (store.CreateMountIntent): its content declared, its
-- possession the mount from @mounted_from, which Finalize re-checks at the
-- home (issue 26: a claim proves nothing, S9). None for an obliterated
-- digest (no row back, issue 29).
INSERT INTO intents (repository, principal, expected_digest, expected_size, ingress_datacenter, backend, expires_at, possession, mounted_from)
SELECT @repository, @principal, @expected_digest::text, @expected_size::bigint, @ingress_datacenter, @backend,
       now() + make_interval(secs => @ttl_seconds::float8), 'mounted', @mounted_from::text
WHERE NOT EXISTS (SELECT 1 FROM blobs b WHERE b.digest = @expected_digest::text AND b.state = 'obliterated')
RETURNING *;

-- name: OpenUsage :many
-- What each principal holds open (pending, unexpired sessions, and the
-- bytes its chunked ones staged), for the principals at or past
-- @min_sessions sessions or @min_staged bytes: the api's snapshot for its
-- per-principal bounds (issue 26), read once a second, never per upload
-- (a per-upload count walked every dead entry of a pending index).
SELECT principal::text AS principal, count(*)::bigint AS sessions,
       coalesce(sum(received_bytes) FILTER (WHERE staged_location IS NOT NULL), 0)::bigint AS staged_bytes
FROM intents
WHERE state = 'pending' AND expires_at > now()
GROUP BY principal
HAVING count(*) >= @min_sessions::bigint
    OR coalesce(sum(received_bytes) FILTER (WHERE staged_location IS NOT NULL), 0) >= @min_staged::bigint;

-- name: RecordPossession :execrows
-- The intent's own bytes were streamed and hashed to its claimed digest
-- and size (issue 26, S9): from now on it may publish, at this node or
-- forwarded to the home or by a finalize job. No row: the intent is not
-- pending, or claims other content, or is a mount.
UPDATE intents SET possession = 'uploaded', updated_at = now()
WHERE operation_id = @operation_id AND coalesce(state, '') = 'pending'
  AND expected_digest = @digest::text AND expected_size = @size_bytes::bigint
  AND coalesce(possession, 'uploaded') = 'uploaded';

-- name: AcceptIntent :execrows
-- The client is about to be answered 202 for this upload (issue 27):
-- pending, its bytes proven (possession uploaded), it leaves the reaper's
-- reach. No row: not pending, or nothing proven.
UPDATE intents SET accepted_at = coalesce(accepted_at, now()), updated_at = now()
WHERE operation_id = @operation_id AND coalesce(state, '') = 'pending' AND possession = 'uploaded';

-- name: AbandonIntent :one
-- Terminal; decided on the locked row, so it cannot overlap a publication.
UPDATE intents SET state = 'abandoned', updated_at = now()
WHERE operation_id = @operation_id AND coalesce(state, '') = 'pending'
RETURNING *;

-- name: AdmitIntent :execrows
UPDATE intents SET state = 'admitted', updated_at = now()
WHERE operation_id = @operation_id AND coalesce(state, '') = 'pending';

-- name: FinalizeContext :one
-- Everything Finalize validates, in one statement (one round trip), first
-- in its transaction: the intent, locked FOR UPDATE (a publication and an
-- abandonment decide on this row, S5); its stored outcome if it published;
-- the partition's lease; the grants the intent's principal holds now (its
-- own and those of its valid tokens, as PrincipalGrants); whether a
-- verified placement of the content exists. The lease is re-checked under FOR
-- SHARE when the blob row is taken (EnsureBlobUnderLease). After a wait
-- for the intent's lock the joined rows are those of the statement's
-- snapshot: an intent found admitted reads its outcome afresh.
SELECT sqlc.embed(i),
       o.result AS outcome_result, o.published_at AS outcome_published_at,
       l.owner_node AS lease_owner, l.epoch AS lease_epoch,
       ARRAY(
           SELECT pg.grant_text FROM principal_grants pg WHERE pg.principal = i.principal ORDER BY pg.grant_id
       )::text[] AS principal_grants,
       EXISTS (
           SELECT 1 FROM placements p
           WHERE p.digest = @digest::text AND p.state = 'verified' AND p.size_bytes = @size_bytes::bigint
       ) AS verified,
       EXISTS (
           SELECT 1 FROM blob_references r WHERE r.repository = i.mounted_from AND r.digest = @digest::text
       ) AS mount_source_references
FROM intents i
LEFT JOIN operation_outcomes o ON o.operation_id = i.operation_id
LEFT JOIN leases l ON l.partition_id = @partition_id::text
WHERE i.operation_id = @operation_id
FOR UPDATE OF i;

-- name: Publish :one
-- Finalize's writes in one statement, pipelined with its reads
-- (store.queueFinalize) and decided on afterwards: when the intent is
-- pending and the blob row exists (EnsureBlobUnderLease made it, unless
-- the lease moved), the reference, the transition to admitted and the stored
-- outcome, into which go the repository, the replication targets
-- (read by this statement, whose answer is what Finalize enqueues:
-- replication_targets, migration 00019: the datacenters of the
-- repository's replication policy other than the ingress; with no
-- policy @targets, or else every registered datacenter other than the
-- ingress) and whether the reference was new. No row back: the intent
-- was not pending or there is no blob row, and nothing was written. Finalize validates after it
-- and rolls the transaction back on a refusal.
WITH intent AS (
    SELECT p.operation_id, p.repository FROM intents p
    WHERE p.operation_id = @operation_id AND coalesce(p.state, '') = 'pending'
      AND EXISTS (SELECT 1 FROM blobs b WHERE b.digest = @digest::text)
), ref AS (
    INSERT INTO blob_references (repository, digest, operation_id)
    SELECT intent.repository, @digest::text, intent.operation_id FROM intent
    ON CONFLICT (repository, digest) DO NOTHING
    RETURNING 1
), admitted AS (
    UPDATE intents i SET state = 'admitted', updated_at = now()
    FROM intent WHERE i.operation_id = intent.operation_id
    RETURNING i.operation_id, i.repository, i.ingress_datacenter
)
INSERT INTO operation_outcomes (operation_id, repository, digest, size_bytes, result)
SELECT a.operation_id, a.repository, @digest::text, @size_bytes::bigint,
       @result::jsonb || jsonb_build_object(
           'repository', a.repository,
           'replication_targets', to_jsonb((
               SELECT rt FROM replication_targets(a.repository, a.ingress_datacenter, sqlc.narg(targets)::text[]) AS rt)),
           'new_reference', EXISTS (SELECT 1 FROM ref))
FROM admitted a
RETURNING result, published_at;

-- name: GetOutcome :one
SELECT * FROM operation_outcomes WHERE operation_id = @operation_id;

-- name: InsertOutcome :one
INSERT INTO operation_outcomes (operation_id, repository, digest, size_bytes, result)
VALUES (@operation_id, @repository, @digest, @size_bytes, @result)
RETURNING *;

-- name: EnsureBlob :one
-- Creates the blob state row, or returns the existing one with its state
-- untouched: an obliteration mark is never cleared here. DO UPDATE (of
-- nothing) rather than DO NOTHING: it returns the row a concurrent
-- publisher just committed, which a separate SELECT under this statement's
-- snapshot would miss, and it locks the row, so an obliteration serializes
-- with this publication.
INSERT INTO blobs (digest, size_bytes) VALUES (@digest, @size_bytes)
ON CONFLICT (digest) DO UPDATE SET digest = blobs.digest
RETURNING *;

-- name: EnsureBlobUnderLease :one
-- The authority fence and EnsureBlob in one statement: the lease row is
-- key-share-locked, and the blob state row is ensured only when the
-- caller holds the lease at its epoch. No row back: the lease moved.
-- FOR KEY SHARE (migration 00028): a claim or a takeover changes the
-- epoch, a key column, and so waits for this commit (R20); the owner's
-- renewal changes no key and does not, so publications cannot starve it.
-- A SEALED lease fences nothing (R74), and the seal, a change of state
-- (a key since migration 00029), waits for this commit.
WITH lease AS (
    SELECT epoch FROM leases
    WHERE partition_id = @partition_id AND owner_node = @node AND epoch = @epoch AND state <> 'SEALED'
    FOR KEY SHARE
)
INSERT INTO blobs (digest, size_bytes)
SELECT @digest::text, @size_bytes::bigint FROM lease
ON CONFLICT (digest) DO UPDATE SET digest = blobs.digest
RETURNING *;

-- name: GetBlob :one
SELECT * FROM blobs WHERE digest = @digest;

-- name: InsertReference :execrows
INSERT INTO blob_references (repository, digest, operation_id)
VALUES (@repository, @digest, @operation_id)
ON CONFLICT (repository, digest) DO NOTHING;

-- name: GetReferencedBlob :one
-- Existence for HEAD, from Postgres alone: a reference in repository to a
-- live blob that has a verified copy somewhere, or one being made. A blob
-- whose every copy is lost or corrupt answers not found, so clients push
-- it again (issue 29; the trigger placements_refs_notify keeps the API
-- caches in step).
SELECT b.digest, b.size_bytes FROM blob_references r JOIN blobs b ON b.digest = r.digest
WHERE r.repository = @repository AND r.digest = @digest AND b.state = 'live'
  AND EXISTS (SELECT 1 FROM placements p WHERE p.digest = b.digest AND p.state IN ('verified', 'pending'));

-- name: DeleteReference :execrows
DELETE FROM blob_references WHERE repository = @repository AND digest = @digest;

-- name: DeleteReferenceUnderLease :one
-- DeleteReference at the repository's home, fenced as a publication is
-- (EnsureBlobUnderLease; ZBP-5 R19, R20): the lease row key-share-locked
-- while the caller holds it at its epoch, so a claim of a higher epoch
-- waits for this commit, and nothing is deleted once the lease moved.
-- fenced false: the lease moved (nothing deleted).
WITH lease AS (
    SELECT epoch FROM leases
    WHERE partition_id = @partition_id AND owner_node = @node AND epoch = @epoch AND state <> 'SEALED'
    FOR KEY SHARE
), deleted AS (
    DELETE FROM blob_references
    WHERE repository = @repository AND digest = @digest AND EXISTS (SELECT 1 FROM lease)
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM lease) AS fenced, (SELECT count(*) FROM deleted)::bigint AS deleted;

-- name: ReplicationTargets :many
-- The default replication policy: every registered datacenter other than
-- the ingress.
SELECT DISTINCT datacenter FROM nodes WHERE datacenter <> @ingress_datacenter ORDER BY datacenter;

-- The statements of a Finalize batch (store/finalize_batch.go): each is
-- the single-call statement above for every call of the batch at once,
-- its arguments one array per parameter (no digest twice, no explicit
-- targets; rows are locked and written in digest order, as the batch's
-- calls are sorted), its rows matched to the calls by operation id or
-- digest. A call without a row is answered as its own
-- statement would have been: no row.

-- name: FinalizeContexts :many
-- FinalizeContext of each call, the intents locked in digest order.
-- Each row is reached by its key: a join of the arrays with the tables
-- was planned as a hash join over a scan of every intent, and the
-- verified placement's EXISTS as one hashed scan of every verified
-- placement (2-4 ms for a batch of six after 6,000 uploads); LATERAL
-- lookups, fenced by OFFSET 0, LIMIT or FOR UPDATE so they are not
-- flattened back into joins, are index lookups per call.
SELECT i.operation_id, i.repository, i.principal, i.expected_digest, i.expected_size, i.ingress_datacenter, i.backend,
       i.staged_location, i.state, i.received_bytes, i.created_at, i.updated_at, i.expires_at, i.staged_deleted_at,
       i.possession, i.mounted_from, i.accepted_at,
       o.result AS outcome_result, o.published_at AS outcome_published_at,
       coalesce((SELECT l.owner_node FROM leases l WHERE l.partition_id = c.partition_id), '')::text AS lease_owner, -- '': no lease
       coalesce((SELECT l.epoch FROM leases l WHERE l.partition_id = c.partition_id), 0)::bigint AS lease_epoch,
       ARRAY(
           SELECT pg.grant_text FROM principal_grants pg WHERE pg.principal = i.principal ORDER BY pg.grant_id
       )::text[] AS principal_grants,
       coalesce(v.verified, false)::bool AS verified,
       coalesce((SELECT true FROM blob_references r WHERE r.repository = i.mounted_from AND r.digest = c.digest LIMIT 1), false)::bool AS mount_source_references
FROM (SELECT unnest(@operation_ids::uuid[]) AS operation_id, unnest(@digests::text[]) AS digest,
             unnest(@sizes::bigint[]) AS size_bytes, unnest(@partition_ids::text[]) AS partition_id
      ORDER BY digest OFFSET 0) c
JOIN LATERAL (SELECT * FROM intents WHERE operation_id = c.operation_id FOR UPDATE) i ON true
LEFT JOIN LATERAL (SELECT * FROM operation_outcomes WHERE operation_id = c.operation_id OFFSET 0) o ON true
LEFT JOIN LATERAL (
    SELECT true AS verified FROM placements p
    WHERE p.digest = c.digest AND p.state = 'verified' AND p.size_bytes = c.size_bytes
    LIMIT 1
) v ON true;

-- name: EnsureBlobsUnderLease :many
-- EnsureBlobUnderLease of each call: the leases key-share-locked, then the
-- blob rows ensured, in digest order, of the calls whose caller holds its
-- partition's lease at its epoch.
WITH c AS (
    SELECT unnest(@digests::text[]) AS digest, unnest(@sizes::bigint[]) AS size_bytes, unnest(@partition_ids::text[]) AS partition_id,
           unnest(@nodes::text[]) AS node, unnest(@epochs::bigint[]) AS epoch
), lease AS (
    SELECT l.partition_id, l.owner_node, l.epoch FROM leases l
    WHERE (l.partition_id, l.owner_node, l.epoch) IN (SELECT c.partition_id, c.node, c.epoch FROM c) AND l.state <> 'SEALED'
    FOR KEY SHARE
)
INSERT INTO blobs (digest, size_bytes)
SELECT c.digest, c.size_bytes FROM c
JOIN lease ON lease.partition_id = c.partition_id AND lease.owner_node = c.node AND lease.epoch = c.epoch
ORDER BY c.digest
ON CONFLICT (digest) DO UPDATE SET digest = blobs.digest
RETURNING *;

-- name: PublishMany :many
-- Publish of each call, all with the same fallback targets: each call's
-- replication_targets, its own repository's policy read per call, else
-- @targets, or (NULL) every registered datacenter other than the call's
-- ingress. The intents
-- are reached by key: a LATERAL lookup each, and the operation ids as an
-- array (= ANY) for the transition.
WITH c AS (
    SELECT unnest(@operation_ids::uuid[]) AS operation_id, unnest(@digests::text[]) AS digest,
           unnest(@sizes::bigint[]) AS size_bytes, unnest(@results::jsonb[]) AS result
), intent AS (
    SELECT p.operation_id, p.repository, c.digest, c.size_bytes, c.result FROM c
    CROSS JOIN LATERAL (
        SELECT i.operation_id, i.repository FROM intents i
        WHERE i.operation_id = c.operation_id AND coalesce(i.state, '') = 'pending'
          AND (SELECT true FROM blobs b WHERE b.digest = c.digest LIMIT 1)
        OFFSET 0
    ) p
), ref AS (
    INSERT INTO blob_references (repository, digest, operation_id)
    SELECT intent.repository, intent.digest, intent.operation_id FROM intent
    ON CONFLICT (repository, digest) DO NOTHING
    RETURNING operation_id
), admitted AS (
    UPDATE intents i SET state = 'admitted', updated_at = now()
    WHERE i.operation_id = ANY (@operation_ids::uuid[])
      AND i.operation_id IN (SELECT intent.operation_id FROM intent)
    RETURNING i.operation_id, i.ingress_datacenter
)
INSERT INTO operation_outcomes (operation_id, repository, digest, size_bytes, result)
SELECT t.operation_id, t.repository, t.digest, t.size_bytes,
       t.result || jsonb_build_object(
           'repository', t.repository,
           'replication_targets', to_jsonb((
               SELECT rt FROM replication_targets(t.repository, a.ingress_datacenter, sqlc.narg(targets)::text[]) AS rt)),
           'new_reference', EXISTS (SELECT 1 FROM ref WHERE ref.operation_id = t.operation_id))
FROM admitted a JOIN intent t ON t.operation_id = a.operation_id
RETURNING operation_id, result, published_at;

-- name: PendingPublicationsByRepository :many
-- Uploads whose bytes were accepted (202) and whose publication at the
-- repository's home has not happened yet, per repository: a partition's
-- work to consume (ZBP-5 R138). Visits pending rows only (their partial
-- index), bounded.
SELECT repository, count(*)::bigint AS pending,
       extract(epoch FROM now() - min(accepted_at))::float8 AS oldest_age_seconds
FROM intents
WHERE state = 'pending' AND accepted_at IS NOT NULL
GROUP BY repository
ORDER BY repository
LIMIT @max_rows;
