-- +goose Up
CREATE TABLE nodes (
    node_id        text        PRIMARY KEY CHECK (node_id ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    datacenter     text        NOT NULL CHECK (datacenter ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    role           text        NOT NULL CHECK (role IN ('api', 'worker', 'controller')),
    endpoint       text        NOT NULL DEFAULT '',
    class          text        NOT NULL DEFAULT 'standard',
    capacity       integer     NOT NULL DEFAULT 1 CHECK (capacity >= 0),
    version        text        NOT NULL DEFAULT '',
    started_at     timestamptz NOT NULL DEFAULT now(),
    heartbeat_at   timestamptz NOT NULL DEFAULT now(),
    state          text        NOT NULL DEFAULT 'up' CHECK (state IN ('up', 'down'))
);
CREATE INDEX nodes_datacenter_idx ON nodes (datacenter, state);

COMMENT ON TABLE nodes IS 'Every Blobplane process (api, worker, controller) registers here and heartbeats; a row not heartbeating is marked down by the node_prune periodic job.';
COMMENT ON COLUMN nodes.node_id IS 'Stable node id (BLOBPLANE_NODE_ID; default hostname:listen).';
COMMENT ON COLUMN nodes.datacenter IS 'Opaque datacenter label the node belongs to (BLOBPLANE_DATACENTER).';
COMMENT ON COLUMN nodes.role IS 'Which binary runs as this node: api, worker or controller.';
COMMENT ON COLUMN nodes.endpoint IS 'host:port where peers and clients reach the node''s API, as published in the partition map (empty for workers).';
COMMENT ON COLUMN nodes.class IS 'Capacity class used by the placement controller.';
COMMENT ON COLUMN nodes.capacity IS 'Relative capacity weight used by the placement controller.';
COMMENT ON COLUMN nodes.version IS 'Build version the node reported at registration.';
COMMENT ON COLUMN nodes.started_at IS 'Database time the current process registered.';
COMMENT ON COLUMN nodes.heartbeat_at IS 'Database time of the last heartbeat.';
COMMENT ON COLUMN nodes.state IS 'up while heartbeating; down once the heartbeat is older than the prune threshold or the process stopped cleanly.';

-- +goose Down
DROP TABLE nodes;
