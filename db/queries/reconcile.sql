-- The replication reconciler (issue 28): live blobs in digest order after
-- a cursor, each with the datacenters holding a verified copy, the
-- datacenters its policies require (the union over the repositories that
-- reference it; replication_targets with no ingress: the policy's
-- datacenters, else the fallback, else every registered datacenter) and
-- the most verified copies any of them asks for. The placements table
-- must exist (store creates it first).

-- name: ReplicationNeeds :many
WITH b AS (
    SELECT digest, size_bytes FROM blobs
    WHERE state = 'live' AND digest > @after_digest::text
    ORDER BY digest
    LIMIT @max_rows
)
SELECT b.digest, b.size_bytes,
    coalesce((SELECT array_agg(DISTINCT p.datacenter::text ORDER BY p.datacenter::text) FROM placements p
              WHERE p.digest = b.digest AND p.state = 'verified'), '{}')::text[] AS verified,
    coalesce((SELECT array_agg(DISTINCT t ORDER BY t)
              FROM blob_references r
              CROSS JOIN LATERAL replication_targets(r.repository, '', @fallback::text[]) AS rt
              CROSS JOIN LATERAL unnest(rt) AS t
              WHERE r.digest = b.digest), '{}')::text[] AS required,
    coalesce((SELECT max(p.min_verified_copies) FROM blob_references r
              CROSS JOIN LATERAL replication_policy_of(r.repository) AS p
              WHERE r.digest = b.digest), 1)::int AS min_copies
FROM b
ORDER BY b.digest;

-- name: RegisteredDatacenters :many
SELECT DISTINCT datacenter::text FROM nodes ORDER BY 1;

-- name: GetReplicationCursor :one
SELECT coalesce((SELECT after_digest FROM replication_cursor WHERE id = 1), '')::text AS after_digest;

-- name: SetReplicationCursor :exec
INSERT INTO replication_cursor (id, after_digest) VALUES (1, @after_digest)
ON CONFLICT (id) DO UPDATE SET after_digest = excluded.after_digest, updated_at = now();
