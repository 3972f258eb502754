-- name: CreateHandoff :one
-- A move starts (A.4 step 1, A.3). At most one per partition is in flight
-- (handoffs_active_key): a second is a unique violation.
INSERT INTO handoffs (plan_id, group_id, partition_id, kind, from_node, from_epoch, to_node, to_endpoint, reason, deadline, unavailable_since)
SELECT nullif(@plan_id::bigint, 0), nullif(@group_id::bigint, 0), @partition_id, @kind, @from_node, @from_epoch, @to_node, @to_endpoint, @reason,
       now() + d.ms * interval '1 millisecond', nullif(@outage_since::timestamptz, '-infinity'::timestamptz)
FROM (SELECT @deadline_ms::bigint AS ms) AS d
RETURNING *;

-- name: ActiveHandoffs :many
SELECT * FROM handoffs WHERE state IN ('preparing', 'synced', 'sealed', 'ready') ORDER BY handoff_id;

-- name: HandoffsForNode :many
-- What a keeper acts on: the moves in flight from or to it.
SELECT * FROM handoffs
WHERE state IN ('preparing', 'synced', 'sealed', 'ready') AND (from_node = @node OR to_node = @node)
ORDER BY handoff_id;

-- name: GetHandoff :one
SELECT * FROM handoffs WHERE handoff_id = @handoff_id;

-- name: RecentHandoffs :many
SELECT * FROM handoffs ORDER BY handoff_id DESC LIMIT @max_rows;

-- name: MarkHandoffSynced :execrows
-- A.4 step 3: the target is ready to take the partition. Blobplane's
-- partitions are DERIVED (their state is in Postgres), so there is nothing
-- to restore or catch up (R78 holds at once): synced says the target is
-- alive and will claim the sealed lease.
UPDATE handoffs SET state = 'synced'
WHERE handoff_id = @handoff_id AND to_node = @node AND kind IN ('handoff', 'split', 'merge') AND state = 'preparing' AND deadline > now();

-- name: SealHandoff :one
-- A.4 step 4, first half: the handoff moves to sealed while it is synced
-- and inside its deadline, else no row and nothing changes (R75). The
-- caller seals the lease in the same transaction (SealLeaseForHandoff).
UPDATE handoffs SET state = 'sealed', sealed_at = now(), unavailable_since = now()
WHERE handoff_id = @handoff_id AND from_node = @node AND from_epoch = @epoch AND state = 'synced' AND deadline > now()
  AND kind = 'handoff'
RETURNING partition_id;

-- name: NextHandoffGroup :one
SELECT nextval('handoff_groups')::bigint;

-- name: InsertHandoffChild :exec
INSERT INTO handoff_children (group_id, child_id, generation, epoch, slots, parents)
VALUES (@group_id, @child_id, @generation, @epoch, @slots, @parents);

-- name: GroupChildren :many
SELECT * FROM handoff_children WHERE group_id = ANY(@group_ids::bigint[]) ORDER BY group_id, child_id;

-- name: SealGroupHandoffs :many
-- A.5 step 4 / A.6: every parent of a split or merge group moves to
-- sealed in one statement, all from node, synced and inside their
-- deadline; the caller seals their leases in the same transaction and
-- commits only if every parent of the group did (nothing otherwise, R75).
UPDATE handoffs SET state = 'sealed', sealed_at = now(), unavailable_since = now()
WHERE group_id = @group_id::bigint AND from_node = @node AND state = 'synced' AND deadline > now()
RETURNING partition_id, from_epoch;

-- name: CountGroupHandoffs :one
SELECT count(*) FROM handoffs WHERE group_id = @group_id::bigint AND state <> 'aborted';

-- name: ClaimChildLease :one
-- A.5 step 5 / A.6: the group's target creates the child's lease at its
-- planned epoch, above every parent's (R16), only when every parent of the
-- group is sealed at the epoch it was planned from (R74): no slot is ever
-- served by a parent and a child at once.
INSERT INTO leases (partition_id, epoch, owner_node, owner_endpoint, state,
                    lease_ttl_ms, renew_interval_ms, expires_at, renewed_at)
SELECT c.child_id, c.epoch, @node, @endpoint, 'RESTORING',
       t.ttl_ms, @renew_ms, now() + t.ttl_ms * interval '1 millisecond', now()
FROM handoff_children c, (SELECT @ttl_ms::bigint AS ttl_ms) AS t
WHERE c.child_id = @child_id
  AND EXISTS (SELECT 1 FROM handoffs h WHERE h.group_id = c.group_id)
  AND NOT EXISTS (SELECT 1 FROM handoffs h WHERE h.group_id = c.group_id AND (h.state <> 'sealed' OR h.to_node <> @node))
  AND NOT EXISTS (SELECT 1 FROM handoffs h JOIN leases l ON l.partition_id = h.partition_id
                  WHERE h.group_id = c.group_id AND (l.state <> 'SEALED' OR l.epoch <> h.from_epoch))
ON CONFLICT (partition_id) DO NOTHING
RETURNING *;

-- name: MarkChildReady :execrows
UPDATE handoff_children AS c SET ready_at = now()
WHERE c.child_id = @child_id AND c.ready_at IS NULL
  AND EXISTS (SELECT 1 FROM handoffs h WHERE h.group_id = c.group_id AND h.to_node = @node AND h.state = 'sealed')
  AND EXISTS (SELECT 1 FROM leases l WHERE l.partition_id = c.child_id AND l.owner_node = @node AND l.epoch = c.epoch AND l.state = 'SERVING');

-- name: MarkGroupReady :execrows
-- Every child serves: the group's parents are ready to be replaced by its
-- children in the next map (R79).
UPDATE handoffs AS h SET state = 'ready', ready_at = now(),
       to_epoch = (SELECT max(c.epoch) FROM handoff_children c WHERE c.group_id = h.group_id)
WHERE h.group_id = @group_id::bigint AND h.state = 'sealed'
  AND NOT EXISTS (SELECT 1 FROM handoff_children c WHERE c.group_id = h.group_id AND c.ready_at IS NULL);

-- name: SealLeaseForHandoff :one
-- A.4 step 4, second half: FENCE state SEALED under the outgoing primary's
-- epoch (R74). state is a key column (migration 00029), so this waits for
-- every write fenced under the epoch and none lands after it.
UPDATE leases SET state = 'SEALED', sealed_lsn = 0
WHERE partition_id = @partition_id AND epoch = @epoch AND owner_node = @node AND state <> 'SEALED'
RETURNING *;

-- name: ClaimSealedLease :one
-- A.4 step 7: the handoff's target ACQUIREs the sealed lease at epoch + 1
-- (R15, R27) without waiting for its expiry: the seal ended the outgoing
-- primary's writes. Only the target named by a sealed handoff of this
-- epoch may.
UPDATE leases
SET epoch = leases.epoch + 1,
    owner_node = @node,
    owner_endpoint = @endpoint,
    state = 'RESTORING',
    lease_ttl_ms = t.ttl_ms,
    renew_interval_ms = @renew_ms,
    expires_at = now() + t.ttl_ms * interval '1 millisecond',
    renewed_at = now()
FROM (SELECT @ttl_ms::bigint AS ttl_ms) AS t
WHERE leases.partition_id = @partition_id AND leases.state = 'SEALED'
  AND EXISTS (SELECT 1 FROM handoffs h
              WHERE h.handoff_id = @handoff_id AND h.partition_id = leases.partition_id AND h.to_node = @node
                AND h.state = 'sealed' AND h.from_epoch = leases.epoch)
RETURNING leases.*;

-- name: MarkHandoffReady :execrows
-- A.4 step 7 / A.3 step 10: the target serves under to_epoch; the
-- controller may now publish a map naming it (R79).
UPDATE handoffs SET state = 'ready', ready_at = now(), to_epoch = @to_epoch::bigint
WHERE handoff_id = @handoff_id AND to_node = @node
  AND (state = 'sealed' OR (kind = 'recover' AND state = 'preparing'))
  AND @to_epoch::bigint > from_epoch;

-- name: PublishedHandoffs :many
-- A.4 step 8: the map naming the targets is published. Returns the
-- outage of each: from unavailable_since (the seal, or the last renewal)
-- to finished_at.
UPDATE handoffs SET state = 'published', map_version = @map_version::bigint, finished_at = now()
WHERE handoff_id = ANY(@handoff_ids::bigint[]) AND state IN ('ready', 'sealed')
RETURNING *;

-- name: AbortHandoff :execrows
-- Before the seal a handoff is abandoned at no cost (R75); after it, never
-- (R76): no row.
UPDATE handoffs SET state = 'aborted', abort_reason = @abort_reason::text, finished_at = now()
WHERE handoff_id = @handoff_id AND state IN ('preparing', 'synced');

-- name: InsertControllerPlan :one
INSERT INTO controller_plans (trigger, moves, moved_slots, total_slots, override_by, override_reason, applied_by)
VALUES (@trigger, @moves, @moved_slots, @total_slots, sqlc.narg(override_by), sqlc.narg(override_reason), @applied_by)
RETURNING plan_id;

-- name: Freeze :exec
INSERT INTO controller_freeze (frozen_by, reason) VALUES (@frozen_by, @reason)
ON CONFLICT (singleton) DO UPDATE SET frozen_by = EXCLUDED.frozen_by, reason = EXCLUDED.reason, frozen_at = now();

-- name: Unfreeze :execrows
DELETE FROM controller_freeze;

-- name: GetFreeze :many
SELECT * FROM controller_freeze;

-- name: MarkNodeDraining :execrows
UPDATE nodes SET draining_since = coalesce(draining_since, now()) WHERE node_id = @node_id;

-- name: ForcedLeasesFor :many
-- Leases an operator forced onto node (R26) that are live: its keeper
-- adopts them at once instead of waiting for a map to name it.
SELECT * FROM leases
WHERE owner_node = @node AND taken_epoch = epoch AND expires_at > now() AND state <> 'SEALED'
ORDER BY partition_id;

-- name: PlacementNodes :many
-- The controller's view of the fleet, on the database clock.
SELECT node_id, datacenter, endpoint, class, capacity, state, (draining_since IS NOT NULL)::boolean AS draining,
       (extract(epoch FROM now() - heartbeat_at) * 1000)::bigint AS heartbeat_age_ms
FROM nodes WHERE role = 'api' ORDER BY node_id;

-- name: InsertMapCanary :exec
INSERT INTO map_canaries (version, nodes, max_error_ratio, window_ms)
VALUES (@version, @nodes::text[], @max_error_ratio, @window_ms);

-- name: DecideMapCanary :execrows
UPDATE map_canaries SET state = @state, decided_at = now(), decision = @decision
WHERE version = @version AND state = 'canary';

-- name: PendingMapCanaries :many
SELECT * FROM map_canaries WHERE state = 'canary' ORDER BY version;

-- name: SupersedeMapCanaries :execrows
-- R122: a map completing a move past its seal is never held back by a
-- canary; the canaries it supersedes are withdrawn.
UPDATE map_canaries SET state = 'withdrawn', decided_at = now(), decision = @decision
WHERE state = 'canary' AND version < @version;

-- name: SetNodeDraining :execrows
-- An operator's or a schedule's drain (R125), or its undoing.
UPDATE nodes SET draining_since = CASE WHEN @draining::boolean THEN coalesce(draining_since, now()) END
WHERE node_id = @node_id AND role = 'api';

-- name: UpsertSchedule :exec
INSERT INTO controller_schedules (name, cron, action, args, lead_ms, created_by, reason, next_run_at)
VALUES (@name, @cron, @action, @args, @lead_ms, @created_by, @reason, @next_run_at)
ON CONFLICT (name) DO UPDATE SET cron = EXCLUDED.cron, action = EXCLUDED.action, args = EXCLUDED.args,
    lead_ms = EXCLUDED.lead_ms, created_by = EXCLUDED.created_by, reason = EXCLUDED.reason, next_run_at = EXCLUDED.next_run_at;

-- name: ListSchedules :many
SELECT * FROM controller_schedules ORDER BY next_run_at, name;

-- name: DeleteSchedule :execrows
DELETE FROM controller_schedules WHERE name = @name;

-- name: DueSchedules :many
SELECT * FROM controller_schedules WHERE next_run_at <= now() ORDER BY next_run_at, name;

-- name: RecordScheduleRun :execrows
UPDATE controller_schedules SET last_run_at = now(), last_result = @last_result, next_run_at = @next_run_at
WHERE name = @name AND next_run_at = @due;

-- name: MeasuredMoveSeconds :one
-- R128: the p99 duration (started → published) of the recent moves of a
-- kind, and how many there were.
SELECT count(*)::bigint AS n,
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)), 0)::float8 AS p99
FROM handoffs WHERE state = 'published' AND kind = @kind AND finished_at > now() - interval '30 days';

-- name: RequestApply :one
INSERT INTO controller_apply_requests (kinds, requested_by, override_reason)
VALUES (@kinds::text[], @requested_by, nullif(@override_reason::text, ''))
RETURNING request_id;

-- name: TakeApplyRequests :many
UPDATE controller_apply_requests SET taken_at = now()
WHERE taken_at IS NULL
RETURNING request_id, kinds, requested_by, coalesce(override_reason, '')::text AS override_reason;

-- name: SetApplyRequestPlan :exec
UPDATE controller_apply_requests SET plan_id = @plan_id WHERE request_id = ANY(@ids::bigint[]);

-- name: GetApplyRequest :one
SELECT (taken_at IS NOT NULL)::boolean AS taken, coalesce(plan_id, 0)::bigint AS plan_id FROM controller_apply_requests WHERE request_id = @id;
