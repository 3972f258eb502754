-- The admin status page (issue 31, handlers/status.go): each a bounded
-- aggregate.

-- name: StatusPlacementHealth :many
-- Placements per datacenter and state (an index-only scan of
-- placements_datacenter_state_idx).
SELECT datacenter::text AS datacenter, state, count(*)::bigint AS placements
FROM placements GROUP BY 1, 2 ORDER BY 1, 2;

-- name: StatusSweepBacklog :one
-- What the sweeps still owe: expired uploads not reaped yet, abandoned
-- ones whose staged bytes are not deleted yet, and decided byte
-- deletions not finished, each with the age of the oldest.
SELECT
    (SELECT count(*) FROM intents WHERE state = 'pending' AND accepted_at IS NULL AND expires_at < now())::bigint AS expired_uploads,
    coalesce((SELECT extract(epoch FROM now() - min(expires_at)) FROM intents WHERE state = 'pending' AND accepted_at IS NULL AND expires_at < now()), 0)::float8 AS expired_oldest_seconds,
    (SELECT count(*) FROM intents WHERE state = 'abandoned' AND staged_location IS NOT NULL AND staged_deleted_at IS NULL)::bigint AS staged_undeleted,
    (SELECT count(*) FROM deletions WHERE deleted_at IS NULL)::bigint AS owed_deletions,
    coalesce((SELECT extract(epoch FROM now() - min(decided_at)) FROM deletions WHERE deleted_at IS NULL), 0)::float8 AS owed_oldest_seconds;
