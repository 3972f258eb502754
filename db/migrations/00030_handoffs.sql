-- +goose Up
-- Ownership that moves by itself (issue 30; ZBP-5 A.4, A.8, R74–R84,
-- R112–R123): the controller service's handoffs, its recorded plans, its
-- freeze switch, and a node's announcement that it is draining.

-- A handoff moves one partition from its current primary to a target
-- node. Kind 'handoff' is the live path of A.4: the target reports
-- synced, the outgoing primary seals under its epoch (the one point of
-- no return, R74), the target claims the sealed lease at epoch + 1 and
-- reports ready, and only then does the controller publish a map naming
-- it (R79). Kind 'recover' is the cold path: the primary's lease expired
-- (its node died or stopped renewing), so the target claims the expired
-- lease, reports ready, and the map follows the same way.
CREATE TABLE handoffs (
    handoff_id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    plan_id        bigint,
    partition_id   text        NOT NULL CHECK (partition_id <> ''),
    kind           text        NOT NULL CHECK (kind IN ('handoff', 'recover')),
    from_node      text        NOT NULL CHECK (from_node <> ''),
    from_epoch     bigint      NOT NULL CHECK (from_epoch >= 0),
    to_node        text        NOT NULL CHECK (to_node <> ''),
    to_endpoint    text        NOT NULL CHECK (to_endpoint <> ''),
    state          text        NOT NULL DEFAULT 'preparing'
                   CHECK (state IN ('preparing', 'synced', 'sealed', 'ready', 'published', 'aborted')),
    reason         text        NOT NULL CHECK (reason <> ''),
    deadline       timestamptz NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- When the partition stopped being served: the seal for a handoff,
    -- the old lease's last renewal for a recovery (the last moment its
    -- holder proved it could write; an upper bound of the outage).
    unavailable_since timestamptz,
    sealed_at      timestamptz,
    to_epoch       bigint      CHECK (to_epoch >= 1),
    ready_at       timestamptz,
    map_version    bigint,
    finished_at    timestamptz,
    abort_reason   text,
    CHECK (from_node <> to_node OR kind = 'recover'),
    CHECK ((state = 'aborted') = (abort_reason IS NOT NULL)),
    CHECK (state NOT IN ('ready', 'published') OR to_epoch IS NOT NULL)
);
-- At most one handoff in flight per partition.
CREATE UNIQUE INDEX handoffs_active_key ON handoffs (partition_id) WHERE state IN ('preparing', 'synced', 'sealed', 'ready');
CREATE INDEX handoffs_nodes_idx ON handoffs (from_node, to_node) WHERE state IN ('preparing', 'synced', 'sealed', 'ready');

COMMENT ON TABLE handoffs IS 'Partition moves driven by the controller service (ZBP-5 A.4 live handoff, A.3 recovery after an expired lease): preparing -> synced -> sealed -> ready -> published, or aborted. At most one in flight per partition. Notifies channel blobplane_handoff with the partition id on every insert and state change.';
COMMENT ON COLUMN handoffs.handoff_id IS 'Identity of the move.';
COMMENT ON COLUMN handoffs.plan_id IS 'The controller_plans row that started it (NULL for a handoff started by hand).';
COMMENT ON COLUMN handoffs.partition_id IS 'The partition moving.';
COMMENT ON COLUMN handoffs.kind IS 'handoff: live, sealed by the outgoing primary (A.4). recover: the lease expired and the target claims it (A.3).';
COMMENT ON COLUMN handoffs.from_node IS 'The primary the map names when the move started.';
COMMENT ON COLUMN handoffs.from_epoch IS 'The lease epoch the outgoing primary held (the seal is written under it); for a recovery, the expired lease''s epoch (0: no lease record).';
COMMENT ON COLUMN handoffs.to_node IS 'The node taking the partition.';
COMMENT ON COLUMN handoffs.to_endpoint IS 'The target''s host:port, as the next map will publish it.';
COMMENT ON COLUMN handoffs.state IS 'preparing (target asked), synced (target ready to take it; nothing has changed yet, R75), sealed (the point of no return, R74), ready (the target holds the lease at to_epoch and serves, R79), published (a map names the target), aborted (abort_reason says why).';
COMMENT ON COLUMN handoffs.reason IS 'What triggered the move: drain of <node>, lease expired on <node>, or an operator''s words.';
COMMENT ON COLUMN handoffs.deadline IS 'Before the seal: abort once passed (R82). After the seal: the controller completes it by recovery (R76, R82).';
COMMENT ON COLUMN handoffs.created_at IS 'Database time the move started.';
COMMENT ON COLUMN handoffs.unavailable_since IS 'Start of the partition''s outage: the seal, or the expired lease''s last renewal (upper bound).';
COMMENT ON COLUMN handoffs.sealed_at IS 'Database time of the seal (handoff only).';
COMMENT ON COLUMN handoffs.to_epoch IS 'The epoch the target claimed.';
COMMENT ON COLUMN handoffs.ready_at IS 'Database time the target reported serving under to_epoch.';
COMMENT ON COLUMN handoffs.map_version IS 'The map version that named the target.';
COMMENT ON COLUMN handoffs.finished_at IS 'Database time it was published or aborted.';
COMMENT ON COLUMN handoffs.abort_reason IS 'Why it was aborted (set exactly when state = aborted).';

-- Every plan the controller applied, with what it changed and what
-- triggered it (R117, R118); a movement beyond the cap carries the
-- operator's override (R119).
CREATE TABLE controller_plans (
    plan_id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trigger         text        NOT NULL CHECK (trigger <> ''),
    moves           jsonb       NOT NULL CHECK (jsonb_typeof(moves) = 'array'),
    moved_slots     bigint      NOT NULL CHECK (moved_slots >= 0),
    total_slots     bigint      NOT NULL CHECK (total_slots > 0),
    override_by     text,
    override_reason text,
    applied_by      text        NOT NULL CHECK (applied_by <> ''),
    created_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((override_by IS NULL) = (override_reason IS NULL))
);

COMMENT ON TABLE controller_plans IS 'Every plan the controller applied (ZBP-5 R117, R118): its moves, what triggered it, and the movement-cap override when one was used (R119).';
COMMENT ON COLUMN controller_plans.plan_id IS 'Identity of the plan; handoffs.plan_id points here.';
COMMENT ON COLUMN controller_plans.trigger IS 'What the controller observed: drain, expired leases, or an operator''s apply.';
COMMENT ON COLUMN controller_plans.moves IS 'The moves: [{"partition","kind","from","to","slots","reason"}].';
COMMENT ON COLUMN controller_plans.moved_slots IS 'Slots the plan moves.';
COMMENT ON COLUMN controller_plans.total_slots IS 'Slots of the map the plan was computed against.';
COMMENT ON COLUMN controller_plans.override_by IS 'The operator who allowed movement beyond the cap (R119).';
COMMENT ON COLUMN controller_plans.override_reason IS 'Their stated reason.';
COMMENT ON COLUMN controller_plans.applied_by IS 'controller run (automatic, by plan kind policy) or controller apply (an operator).';
COMMENT ON COLUMN controller_plans.created_at IS 'Database time the plan was applied.';

-- The global freeze (R123): halts new movement, never a handoff past its
-- seal, and takes effect without a restart (the controller reads it on
-- every round).
CREATE TABLE controller_freeze (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    frozen_by  text        NOT NULL CHECK (frozen_by <> ''),
    reason     text        NOT NULL CHECK (reason <> ''),
    frozen_at  timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE controller_freeze IS 'One row while the controller is frozen (ZBP-5 R123): no new move starts; serving and handoffs past their seal continue. controller freeze / unfreeze.';
COMMENT ON COLUMN controller_freeze.singleton IS 'Always true: at most one row.';
COMMENT ON COLUMN controller_freeze.frozen_by IS 'The operator who froze.';
COMMENT ON COLUMN controller_freeze.reason IS 'Their stated reason.';
COMMENT ON COLUMN controller_freeze.frozen_at IS 'Database time of the freeze.';

ALTER TABLE nodes ADD COLUMN draining_since timestamptz;
COMMENT ON COLUMN nodes.draining_since IS 'Set when the node received its termination signal (ZBP-5 R83): the controller hands its partitions off and chooses it for nothing new. Cleared when the node registers again.';

-- The epoch a FORCE produced: the forced owner's keeper adopts the lease
-- at once (R26) only while the record is still at that epoch; taken_by,
-- taken_reason and taken_at stay as the audit trail after later claims.
ALTER TABLE leases ADD COLUMN taken_epoch bigint CHECK (taken_epoch >= 1);
COMMENT ON COLUMN leases.taken_epoch IS 'Epoch of the last force-takeover (R26-R28): while epoch = taken_epoch the lease is the forced one and its owner adopts it at once.';

-- +goose StatementBegin
CREATE FUNCTION handoffs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state THEN
        PERFORM pg_notify('blobplane_handoff', NEW.partition_id);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION handoffs_notify() IS 'NOTIFY blobplane_handoff with the partition id when a handoff starts or changes state (delivered on commit): the keepers and the controller act at once instead of at their next tick.';

CREATE TRIGGER handoffs_notify AFTER INSERT OR UPDATE ON handoffs
    FOR EACH ROW EXECUTE FUNCTION handoffs_notify();

-- +goose Down
DROP TRIGGER handoffs_notify ON handoffs;
DROP FUNCTION handoffs_notify();
ALTER TABLE leases DROP COLUMN taken_epoch;
ALTER TABLE nodes DROP COLUMN draining_since;
DROP TABLE controller_freeze;
DROP TABLE controller_plans;
DROP TABLE handoffs;
