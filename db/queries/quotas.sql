-- Repository quotas (db/migrations/00039_repository_quotas.sql).

-- name: SetRepositoryQuota :one
-- Sets a repository's quota (the trigger journals it to its home); no row
-- when the repository does not exist.
INSERT INTO repository_quotas (repository, max_bytes, max_blobs, max_bytes_per_minute, max_blobs_per_minute, set_by)
SELECT r.name, @max_bytes, @max_blobs, @max_bytes_per_minute, @max_blobs_per_minute, @set_by FROM repositories r WHERE r.name = @repository
ON CONFLICT (repository) DO UPDATE
SET max_bytes = EXCLUDED.max_bytes, max_blobs = EXCLUDED.max_blobs,
    max_bytes_per_minute = EXCLUDED.max_bytes_per_minute, max_blobs_per_minute = EXCLUDED.max_blobs_per_minute,
    set_by = EXCLUDED.set_by, set_at = now()
RETURNING repository;

-- name: ClearRepositoryQuota :execrows
DELETE FROM repository_quotas WHERE repository = @repository;

-- name: QuotaAppendID :one
-- The append id of the journal record the last quota write of this
-- transaction made (0: no journal holds the repository).
SELECT coalesce(nullif(current_setting('blobplane.quota_append_id', true), ''), '0')::bigint AS append_id;

-- name: QuotaRecordApplied :one
-- Whether the home applied the journal record @append_id: sequenced, and
-- at or below the LSN its primary reported applied in the same
-- generation; a record trimmed away (sealed after a checkpoint) was. With
-- the position the home reported (ZBP-5-R107: partition, the reporting
-- primary's epoch, its applied LSN), empty for a trimmed record.
SELECT coalesce(a.applied, true)::boolean AS applied,
       coalesce(a.partition_id, '')::text AS partition_id,
       coalesce(a.epoch, 0)::bigint AS epoch,
       coalesce(a.applied_lsn, 0)::bigint AS applied_lsn
FROM (SELECT 1) one
LEFT JOIN (
    SELECT j.lsn IS NOT NULL AND h.generation = j.generation AND h.applied_lsn >= j.lsn AS applied,
           h.partition_id, h.epoch, h.applied_lsn
    FROM partition_journal j JOIN partition_journal_heads h ON h.partition_id = j.partition_id
    WHERE j.append_id = @append_id
) a ON true;

-- name: RepositoryUsage :many
-- Repositories (all with a quota, or @repository) with their quota and the
-- usage the ledger holds: each distinct digest referenced once.
SELECT r.name AS repository,
       coalesce(q.max_bytes, 0)::bigint AS max_bytes, coalesce(q.max_blobs, 0)::bigint AS max_blobs,
       coalesce(q.max_bytes_per_minute, 0)::bigint AS max_bytes_per_minute,
       coalesce(q.max_blobs_per_minute, 0)::bigint AS max_blobs_per_minute,
       coalesce(q.set_by, '')::text AS set_by, q.set_at,
       coalesce(u.bytes, 0)::bigint AS bytes, coalesce(u.blobs, 0)::bigint AS blobs
FROM repositories r
LEFT JOIN repository_quotas q ON q.repository = r.name
LEFT JOIN LATERAL (
    SELECT sum(b.size_bytes)::bigint AS bytes, count(*)::bigint AS blobs
    FROM blob_references br JOIN blobs b ON b.digest = br.digest
    WHERE br.repository = r.name
) u ON true
WHERE (sqlc.narg(repository)::text IS NULL AND q.repository IS NOT NULL) OR r.name = sqlc.narg(repository)::text
ORDER BY r.name;

-- name: LockReferencesForTenantQuota :exec
-- A new tenant quota's usage is counted while no reference is written.
LOCK TABLE blob_references IN SHARE MODE;

-- name: SetTenantQuota :one
-- Creates or changes a tenant's quota; a new one starts from the usage the
-- ledger holds (under LockReferencesForTenantQuota).
INSERT INTO tenant_quotas (prefix, max_bytes, max_blobs, used_bytes, used_blobs, set_by)
SELECT @prefix, @max_bytes, @max_blobs, coalesce(sum(b.size_bytes), 0)::bigint, count(r.digest), @set_by
FROM blob_references r JOIN blobs b ON b.digest = r.digest
WHERE starts_with(r.repository, @prefix::text)
ON CONFLICT (prefix) DO UPDATE
SET max_bytes = EXCLUDED.max_bytes, max_blobs = EXCLUDED.max_blobs, set_by = EXCLUDED.set_by, set_at = now()
RETURNING prefix, max_bytes, max_blobs, used_bytes, used_blobs, set_by, set_at;

-- name: ClearTenantQuota :execrows
DELETE FROM tenant_quotas WHERE prefix = @prefix;

-- name: TenantQuotas :many
SELECT prefix, max_bytes, max_blobs, used_bytes, used_blobs, set_by, set_at FROM tenant_quotas
WHERE sqlc.narg(prefix)::text IS NULL OR prefix = sqlc.narg(prefix)::text
ORDER BY prefix;
