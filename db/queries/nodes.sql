-- name: UpsertNode :one
-- reads_format: the level this build reads (formats.Reads), reported by
-- this registration (reads_format_started_at = started_at).
INSERT INTO nodes (node_id, datacenter, role, endpoint, class, capacity, version, started_at, heartbeat_at, state, reads_format, reads_format_started_at)
VALUES (@node_id, @datacenter, @role, @endpoint, @class, @capacity, @version, now(), now(), 'up', @reads_format, now())
ON CONFLICT (node_id) DO UPDATE
SET datacenter = EXCLUDED.datacenter,
    role = EXCLUDED.role,
    endpoint = EXCLUDED.endpoint,
    class = EXCLUDED.class,
    capacity = EXCLUDED.capacity,
    version = EXCLUDED.version,
    started_at = now(),
    heartbeat_at = now(),
    state = 'up',
    draining_since = NULL,
    reads_format = EXCLUDED.reads_format,
    reads_format_started_at = now()
RETURNING *;

-- name: HeartbeatNode :execrows
UPDATE nodes SET heartbeat_at = now(), state = 'up' WHERE node_id = @node_id;

-- name: MarkNodeDown :execrows
UPDATE nodes SET state = 'down' WHERE node_id = @node_id;

-- name: PruneNodes :many
UPDATE nodes SET state = 'down'
WHERE state = 'up' AND heartbeat_at < now() - make_interval(secs => @older_than_seconds::float8)
RETURNING node_id;

-- name: ListNodes :many
SELECT * FROM nodes ORDER BY datacenter, node_id;

-- name: ReportNode :execrows
UPDATE nodes SET heartbeat_at = now(), state = 'up', map_version = @map_version, primaries = @primaries
WHERE node_id = @node_id;

-- name: NodeReports :many
SELECT node_id, map_version, primaries FROM nodes WHERE state = 'up' AND role = 'api';
