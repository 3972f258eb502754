-- +goose Up
-- A scheduled exercise (issue 30; ZBP-5 R136): the controller moves one
-- healthy partition live, on a calendar, so the move path is exercised in
-- production and its measured duration feeds the leads of R128.
ALTER TABLE controller_schedules DROP CONSTRAINT controller_schedules_action_check;
ALTER TABLE controller_schedules ADD CONSTRAINT controller_schedules_action_check
    CHECK (action IN ('split', 'merge', 'retire', 'exercise', 'freeze', 'unfreeze'));
COMMENT ON COLUMN controller_schedules.action IS 'split, merge, retire (a node the controller chooses, or the one named), exercise (a deliberate live move of one partition, R136), freeze or unfreeze.';
COMMENT ON COLUMN controller_schedules.args IS 'The action''s arguments: {"partition","at","to"} for split, {"partitions","to"} for merge, {"node"} for retire, {"partition"} for exercise (none: the least recently moved).';

-- +goose Down
DELETE FROM controller_schedules WHERE action = 'exercise';
ALTER TABLE controller_schedules DROP CONSTRAINT controller_schedules_action_check;
ALTER TABLE controller_schedules ADD CONSTRAINT controller_schedules_action_check
    CHECK (action IN ('split', 'merge', 'retire', 'freeze', 'unfreeze'));
COMMENT ON COLUMN controller_schedules.action IS 'split, merge, retire (a node the controller chooses, or the one named), freeze or unfreeze.';
COMMENT ON COLUMN controller_schedules.args IS 'The action''s arguments: {"partition","at","to"} for split, {"partitions","to"} for merge, {"node"} for retire.';
