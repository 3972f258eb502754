-- +goose Up
-- `controller apply` beside a running service (issue 30; ZBP-5 R118,
-- R119): the operator's request to apply plan kinds the service holds for
-- an operator (balance, by default) is a row the service takes in its
-- next round, so applying never needs the service stopped, and only the
-- service acts (one controller at a time).
CREATE TABLE controller_apply_requests (
    request_id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kinds           text[]      NOT NULL CHECK (cardinality(kinds) > 0 AND kinds <@ ARRAY['drain', 'recover', 'balance']),
    requested_by    text        NOT NULL CHECK (requested_by <> ''),
    override_reason text        CHECK (override_reason <> ''),
    requested_at    timestamptz NOT NULL DEFAULT now(),
    taken_at        timestamptz,
    plan_id         bigint      REFERENCES controller_plans (plan_id) ON DELETE SET NULL
);
CREATE INDEX controller_apply_requests_pending ON controller_apply_requests (request_id) WHERE taken_at IS NULL;

COMMENT ON TABLE controller_apply_requests IS 'Operators'' requests to apply plan kinds now (controller apply while controller run is active); the service takes each in its next round (R118).';
COMMENT ON COLUMN controller_apply_requests.request_id IS 'Request id.';
COMMENT ON COLUMN controller_apply_requests.kinds IS 'Plan kinds to apply in that round: drain, recover, balance.';
COMMENT ON COLUMN controller_apply_requests.requested_by IS 'The operator (recorded in the plan).';
COMMENT ON COLUMN controller_apply_requests.override_reason IS 'Set to lift the movement cap for that plan (R119), recorded with it.';
COMMENT ON COLUMN controller_apply_requests.requested_at IS 'Database time of the request.';
COMMENT ON COLUMN controller_apply_requests.taken_at IS 'When the service took it (NULL: pending).';
COMMENT ON COLUMN controller_apply_requests.plan_id IS 'The plan that round recorded (NULL: nothing to start, or not taken yet).';

-- +goose Down
DROP TABLE controller_apply_requests;
