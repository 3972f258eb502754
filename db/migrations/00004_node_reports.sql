-- +goose Up
-- What each node believes, reported with its heartbeat, so convergence and
-- split-brain are measured rather than assumed (ZBP-5 R134, R139).
ALTER TABLE nodes
    ADD COLUMN map_version bigint NOT NULL DEFAULT 0 CHECK (map_version >= 0),
    ADD COLUMN primaries   jsonb  NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(primaries) = 'array');

COMMENT ON COLUMN nodes.map_version IS 'Version of the verified partition map the node serves from, as of its last heartbeat (0: none yet). The oldest among up nodes is the blobplane_map_oldest_version_in_use metric (R139).';
COMMENT ON COLUMN nodes.primaries IS 'Partitions the node believes it is primary for, as [{"partition": id, "epoch": n}], as of its last heartbeat. Two nodes claiming one partition at one epoch is the blobplane_duplicate_primaries alarm (R134).';

-- +goose Down
ALTER TABLE nodes DROP COLUMN primaries, DROP COLUMN map_version;
