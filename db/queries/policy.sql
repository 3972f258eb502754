-- Replication policy queries (db/migrations/00019_replication_policy.sql,
-- docs/replication.md).
--
-- The policy of a repository, the row of the longest prefix matching
-- it, is the SQL function replication_policy_of (migration 00019), which
-- PolicyFor here and Publish, PublishMany (uploads.sql, through
-- replication_targets) read; package replication/policy (Matches, For)
-- is its Go twin.

-- name: SetPolicy :one
-- Creates or replaces the policy of @prefix.
INSERT INTO replication_policies (prefix, datacenters, min_verified_copies, set_by)
VALUES (@prefix::text, @datacenters::text[], @min_verified_copies::int4, @set_by::text)
ON CONFLICT (prefix) DO UPDATE
SET datacenters = excluded.datacenters, min_verified_copies = excluded.min_verified_copies,
    set_by = excluded.set_by, updated_at = now()
RETURNING *;

-- name: DeletePolicy :execrows
DELETE FROM replication_policies WHERE prefix = @prefix::text;

-- name: ListPolicies :many
SELECT * FROM replication_policies ORDER BY prefix;

-- name: PolicyFor :one
-- The policy of @repository. No row: no policy matches.
SELECT * FROM replication_policy_of(@repository::text);
