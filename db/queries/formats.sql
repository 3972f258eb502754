-- The cluster's format level (db/migrations/00043_format_level.sql,
-- package formats).

-- name: ClusterFormat :one
SELECT * FROM cluster_format;

-- name: ClusterFormatLevelForShare :one
-- A writer of a level-gated format reads the level under a share lock
-- held to its commit: a finalize running meanwhile (FOR UPDATE) is
-- waited for, and the writer sees its outcome.
SELECT level FROM cluster_format FOR SHARE;

-- name: ClusterFormatLevelForUpdate :one
SELECT level FROM cluster_format FOR UPDATE;

-- name: RaiseClusterFormat :execrows
-- Raises the level, never lowers it.
UPDATE cluster_format SET level = @level, raised_by = @raised_by::text, raised_at = now()
WHERE level < @level;

-- name: FormatNodes :many
-- Every node with the level its running process reads (0: it reported
-- none, or an older binary registered after the report) and its
-- heartbeat's age, on the database clock.
SELECT node_id, role, state,
       coalesce(CASE WHEN reads_format_started_at = started_at THEN reads_format END, 0)::smallint AS reads_format,
       (extract(epoch FROM now() - heartbeat_at) * 1000)::bigint AS heartbeat_age_ms
FROM nodes ORDER BY node_id;
