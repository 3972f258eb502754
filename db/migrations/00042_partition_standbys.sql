-- +goose Up
-- Standbys of partition state (issue 33, ZBP-5 R60-R65, R72, R73;
-- docs/quotas.md "Standbys"): a node the map names as a partition's
-- standby follows its journal read-only and reports here how far it has
-- applied it. The controller and every api node read these reports to
-- tell a synced standby from a lagging or absent one (R60, R64), and a
-- failover promotes the synced one (R73).
CREATE TABLE partition_standbys (
    partition_id  text        NOT NULL CHECK (partition_id <> ''),
    node_id       text        NOT NULL CHECK (node_id <> ''),
    generation    bigint      NOT NULL CHECK (generation >= 1),
    epoch         bigint      NOT NULL CHECK (epoch >= 1),
    applied_lsn   bigint      NOT NULL CHECK (applied_lsn >= 0),
    head_lsn      bigint      NOT NULL CHECK (head_lsn >= applied_lsn),
    caught_up_at  timestamptz,
    reported_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, node_id)
);
COMMENT ON TABLE partition_standbys IS 'What each standby of a partition last reported of its journal-following state (ZBP-5 R64): one row per (partition, node), replaced at each report; rows of standbys no map names any more are deleted by the node that stops following.';
COMMENT ON COLUMN partition_standbys.partition_id IS 'The partition followed.';
COMMENT ON COLUMN partition_standbys.node_id IS 'The standby node (nodes.node_id).';
COMMENT ON COLUMN partition_standbys.generation IS 'The journal generation the standby follows (a restarted journal is followed from its start).';
COMMENT ON COLUMN partition_standbys.epoch IS 'The epoch the standby verified the journal is sequenced under (R72): the one the lease store says the map''s primary holds.';
COMMENT ON COLUMN partition_standbys.applied_lsn IS 'The last LSN the standby''s state applied (R64).';
COMMENT ON COLUMN partition_standbys.head_lsn IS 'The last LSN the journal had sequenced when the standby read it: head_lsn - applied_lsn is its lag in records.';
COMMENT ON COLUMN partition_standbys.caught_up_at IS 'When the standby last applied everything sequenced (database clock); NULL: never since it started following.';
COMMENT ON COLUMN partition_standbys.reported_at IS 'When the standby last reported (database clock): a silent standby is not synced, whatever it said before.';

-- +goose Down
DROP TABLE partition_standbys;
