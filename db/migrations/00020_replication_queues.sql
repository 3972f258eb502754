-- +goose Up
-- Issue 28: replication jobs go to their target datacenter's queue
-- (jobs.ReplicationQueue: 'replicate_' || datacenter, a label too long for
-- River's 64 characters hashed), whose workers pull the bytes. Before,
-- they all went to the one queue 'replication', which no worker polled:
-- the copies that waited there move to their target's queue and run.
-- On a fresh database River's tables come after goose's migrations, and
-- there is nothing to move.
-- +goose StatementBegin
DO $$
BEGIN
  IF to_regclass('river_job') IS NOT NULL THEN
    UPDATE river_job
    SET queue = CASE
          WHEN length('replicate_' || (args->>'target_datacenter')) <= 64
            THEN 'replicate_' || (args->>'target_datacenter')
          ELSE 'replicate_' || left(encode(sha256(convert_to(args->>'target_datacenter', 'UTF8')), 'hex'), 32)
        END
    WHERE kind = 'replicate' AND queue = 'replication'
      AND state IN ('available', 'scheduled', 'retryable', 'pending');
  END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Nothing to undo: jobs in their target's queue stay there.
SELECT 1;
