-- +goose Up
-- The seal holds off the writes fenced under its epoch (ZBP-5 R74).
--
-- A publication or a reference deletion fences itself with FOR KEY SHARE
-- on its partition's lease row (migration 00028), and now also refuses a
-- SEALED lease; the renewal refuses one too, so after the seal the
-- outgoing primary never writes or serves again. For the seal to come
-- after every write fenced before it, it must wait for them: this index
-- makes state a key column, so a change of state (the seal, RESTORING →
-- SERVING) waits for the writes holding the row, while the renewal
-- (expires_at, renewed_at) still does not.
CREATE UNIQUE INDEX leases_partition_epoch_state_key ON leases (partition_id, epoch, state);

COMMENT ON INDEX leases_partition_epoch_state_key IS 'Makes state a key column, so that a change of state (the seal, R74) waits for the writes fenced under the lease (FOR KEY SHARE), as an epoch change does (migrations 00028, 00029).';

-- +goose Down
DROP INDEX leases_partition_epoch_state_key;
