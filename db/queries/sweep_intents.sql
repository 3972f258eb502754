-- The reaper of expired intents (db/migrations/00006_sweep_intents.sql).

-- name: ReapExpiredIntents :many
-- Decide abandonment of a bounded batch of expired pending intents of one
-- ingress datacenter, oldest first, by the database clock. A row another
-- transaction holds (a chunk being recorded, a publication) is skipped, and
-- the UPDATE re-checks pending on the locked row, so publish and abandon
-- stay mutually exclusive (S5) and concurrent reapers never share a row.
--
-- The UPDATE finds the claimed rows by primary key whatever the planner
-- believes: the ids as an array (= ANY), and the pending re-check written
-- so that it does not match the partial index on pending intents (state is
-- NOT NULL: coalesce changes nothing but the plan). Written as a join on
-- the claimed rows, with statistics from before a burst of new pending
-- intents (autovacuum had not analyzed them yet) Postgres estimated one
-- pending row and joined by scanning every pending intent for every
-- claimed one: 11 s per pass of 1000 among 100,000 (docs/sweeps.md).
WITH claimed AS (
    SELECT p.operation_id FROM intents p
    WHERE p.state = 'pending' AND p.ingress_datacenter = @ingress_datacenter AND p.expires_at < now()
      AND p.accepted_at IS NULL -- answered 202: never reaped (issue 27)
    ORDER BY p.expires_at
    LIMIT @batch
    FOR UPDATE SKIP LOCKED
)
UPDATE intents i SET state = 'abandoned', updated_at = now()
WHERE i.operation_id = ANY (ARRAY(SELECT c.operation_id FROM claimed c))
  AND coalesce(i.state, '') = 'pending' AND i.accepted_at IS NULL
RETURNING i.*;

-- name: ExpiredIntents :many
-- What ReapExpiredIntents would decide now (dry run): no lock, no change.
SELECT * FROM intents
WHERE state = 'pending' AND ingress_datacenter = @ingress_datacenter AND expires_at < now() AND accepted_at IS NULL
ORDER BY expires_at
LIMIT @batch;

-- name: UndeletedStagedIntents :many
-- Abandoned intents whose staged bytes are not confirmed deleted: reaped by
-- a pass that crashed or failed before its delete, or abandoned by a
-- handler whose own abort failed.
SELECT * FROM intents
WHERE state = 'abandoned' AND staged_deleted_at IS NULL AND staged_location IS NOT NULL
  AND ingress_datacenter = @ingress_datacenter
ORDER BY updated_at
LIMIT @batch;

-- name: MarkStagedDeleted :execrows
-- One statement for a pass's confirmed deletes.
UPDATE intents SET staged_deleted_at = now()
WHERE operation_id = ANY(@operation_ids::uuid[]) AND state = 'abandoned' AND staged_deleted_at IS NULL;

-- name: SweepIntentBacklog :one
-- The oldest overdue item of one datacenter: an expired pending intent (age
-- past its expiry) or an abandoned intent whose staged bytes remain (age
-- since abandonment), in seconds; 0 when there is none.
SELECT coalesce(extract(epoch FROM now() - least(
    (SELECT min(p.expires_at) FROM intents p
     WHERE p.state = 'pending' AND p.ingress_datacenter = @ingress_datacenter AND p.expires_at < now()),
    (SELECT min(a.updated_at) FROM intents a
     WHERE a.state = 'abandoned' AND a.staged_deleted_at IS NULL AND a.staged_location IS NOT NULL
       AND a.ingress_datacenter = @ingress_datacenter)
)), 0)::float8 AS oldest_overdue_seconds;
