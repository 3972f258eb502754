-- +goose Up
-- Split and merge (issue 30; ZBP-5 A.5, A.6, R89–R96): a handoff of kind
-- split or merge seals its parent(s) like a live handoff, and the target
-- node then claims a lease for each child at an epoch above every
-- parent's (R16), only once every parent of its group is sealed; the map
-- replacing the parents by the children is published only when every
-- child serves (R79). A merge's parents are sealed together, in one
-- transaction, by the one node holding them all.
ALTER TABLE handoffs DROP CONSTRAINT handoffs_kind_check;
ALTER TABLE handoffs ADD CONSTRAINT handoffs_kind_check CHECK (kind IN ('handoff', 'recover', 'split', 'merge'));
ALTER TABLE handoffs DROP CONSTRAINT handoffs_check;
ALTER TABLE handoffs ADD CONSTRAINT handoffs_check CHECK (from_node <> to_node OR kind IN ('recover', 'split', 'merge'));
-- A sealed move past its deadline is published forward without its
-- target having reported (R76, R82): published no longer implies to_epoch.
ALTER TABLE handoffs DROP CONSTRAINT handoffs_check2;
ALTER TABLE handoffs ADD CONSTRAINT handoffs_ready_epoch_check CHECK (state <> 'ready' OR to_epoch IS NOT NULL);
ALTER TABLE handoffs ADD COLUMN group_id bigint;
ALTER TABLE handoffs ADD CONSTRAINT handoffs_group_check CHECK ((group_id IS NOT NULL) = (kind IN ('split', 'merge')));
CREATE INDEX handoffs_group_idx ON handoffs (group_id) WHERE group_id IS NOT NULL;

COMMENT ON COLUMN handoffs.group_id IS 'split / merge: the group of parents sealed together and of the children (handoff_children) that replace them; NULL otherwise.';
COMMENT ON COLUMN handoffs.kind IS 'handoff: live, sealed by the outgoing primary (A.4). recover: the lease expired and the target claims it (A.3). split / merge: the parent(s) of group_id are sealed and the target claims the children (A.5, A.6).';

CREATE SEQUENCE handoff_groups;
COMMENT ON SEQUENCE handoff_groups IS 'Ids of split and merge groups (handoffs.group_id).';

CREATE TABLE handoff_children (
    group_id     bigint      NOT NULL,
    child_id     text        NOT NULL PRIMARY KEY CHECK (child_id <> ''),
    generation   bigint      NOT NULL CHECK (generation >= 1),
    epoch        bigint      NOT NULL CHECK (epoch >= 1),
    slots        jsonb       NOT NULL CHECK (jsonb_typeof(slots) = 'array' AND jsonb_array_length(slots) > 0),
    parents      jsonb       NOT NULL CHECK (jsonb_typeof(parents) = 'array' AND jsonb_array_length(parents) > 0),
    ready_at     timestamptz
);
CREATE INDEX handoff_children_group_idx ON handoff_children (group_id);

COMMENT ON TABLE handoff_children IS 'The children of a split or merge (ZBP-5 A.5, A.6): new partition ids (R13, R89) whose leases the group''s target claims at epoch, above every parent''s (R16), once every parent is sealed.';
COMMENT ON COLUMN handoff_children.group_id IS 'The split or merge (handoffs.group_id).';
COMMENT ON COLUMN handoff_children.child_id IS 'The child''s partition id: new, never a parent''s (R89).';
COMMENT ON COLUMN handoff_children.generation IS 'Above every parent''s generation (R89, R90).';
COMMENT ON COLUMN handoff_children.epoch IS 'The child''s first epoch: one above the highest parent epoch sealed (R16).';
COMMENT ON COLUMN handoff_children.slots IS 'The child''s slot ranges at the map''s slot_bits: [{"low","high"}].';
COMMENT ON COLUMN handoff_children.parents IS 'The parents it descends from: [{"id","generation"}] (R91).';
COMMENT ON COLUMN handoff_children.ready_at IS 'When the target reported the child serving under epoch.';

-- +goose Down
DROP TABLE handoff_children;
DROP SEQUENCE handoff_groups;
DROP INDEX handoffs_group_idx;
ALTER TABLE handoffs DROP CONSTRAINT handoffs_group_check;
ALTER TABLE handoffs DROP COLUMN group_id;
ALTER TABLE handoffs DROP CONSTRAINT handoffs_ready_epoch_check;
ALTER TABLE handoffs ADD CONSTRAINT handoffs_check2 CHECK (state NOT IN ('ready', 'published') OR to_epoch IS NOT NULL);
ALTER TABLE handoffs DROP CONSTRAINT handoffs_check;
ALTER TABLE handoffs ADD CONSTRAINT handoffs_check CHECK (from_node <> to_node OR kind = 'recover');
ALTER TABLE handoffs DROP CONSTRAINT handoffs_kind_check;
ALTER TABLE handoffs ADD CONSTRAINT handoffs_kind_check CHECK (kind IN ('handoff', 'recover'));
