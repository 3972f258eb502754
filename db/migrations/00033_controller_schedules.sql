-- +goose Up
-- Scheduled plans (issue 30; ZBP-5 R127, R128): the controller service
-- runs each at its calendar time — minus a lead time measured from the
-- recent moves of its kind when asked — so a known trough can be met
-- with merges and retirements and a known ramp with splits made ahead.
CREATE TABLE controller_schedules (
    name         text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    cron         text        NOT NULL CHECK (cron <> ''),
    action       text        NOT NULL CHECK (action IN ('split', 'merge', 'retire', 'freeze', 'unfreeze')),
    args         jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(args) = 'object'),
    lead_ms      bigint      NOT NULL DEFAULT 0 CHECK (lead_ms >= 0),
    created_by   text        NOT NULL CHECK (created_by <> ''),
    reason       text        NOT NULL CHECK (reason <> ''),
    created_at   timestamptz NOT NULL DEFAULT now(),
    next_run_at  timestamptz NOT NULL,
    last_run_at  timestamptz,
    last_result  text
);

COMMENT ON TABLE controller_schedules IS 'Calendar-scheduled plans the controller service runs (ZBP-5 R127, R128): controller schedule add | list | remove.';
COMMENT ON COLUMN controller_schedules.name IS 'The schedule''s name.';
COMMENT ON COLUMN controller_schedules.cron IS 'When the action must be done: a cron expression (5 fields) or a descriptor such as @daily, in UTC.';
COMMENT ON COLUMN controller_schedules.action IS 'split, merge, retire (a node the controller chooses, or the one named), freeze or unfreeze.';
COMMENT ON COLUMN controller_schedules.args IS 'The action''s arguments: {"partition","at","to"} for split, {"partitions","to"} for merge, {"node"} for retire.';
COMMENT ON COLUMN controller_schedules.lead_ms IS 'How long before each cron time the action starts, so that it is done by then (R128: measured from recent moves of its kind when added with --lead auto).';
COMMENT ON COLUMN controller_schedules.created_by IS 'The operator who scheduled it.';
COMMENT ON COLUMN controller_schedules.reason IS 'Their stated reason, recorded with every plan it starts.';
COMMENT ON COLUMN controller_schedules.created_at IS 'Database time it was added.';
COMMENT ON COLUMN controller_schedules.next_run_at IS 'When the service runs it next (the next cron time minus the lead).';
COMMENT ON COLUMN controller_schedules.last_run_at IS 'When it last ran.';
COMMENT ON COLUMN controller_schedules.last_result IS 'What its last run did, or why it failed.';

-- +goose Down
DROP TABLE controller_schedules;
