-- Retention (issue 31; sweep.Retention): finished rows older than a
-- retention, deleted in batches of at most @batch_size, oldest first.
-- Each statement is one batch; the sweep loops while a batch comes back
-- full. Nothing a live row needs is touched.

-- name: PruneOperations :one
-- Published and abandoned uploads (an abandoned one only once its staged
-- bytes are confirmed deleted: the reaper's retry queue stays) with their
-- outcomes. GET /v1/operations/<id> answers 404 for them afterwards.
WITH victims AS (
    SELECT operation_id FROM intents
    WHERE state <> 'pending'
      AND updated_at < now() - make_interval(secs => @older_than_seconds::float8)
      AND (state = 'admitted' OR staged_location IS NULL OR staged_deleted_at IS NOT NULL)
    ORDER BY updated_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
), outcomes AS (
    DELETE FROM operation_outcomes o USING victims v WHERE o.operation_id = v.operation_id
    RETURNING 1
), gone AS (
    DELETE FROM intents i USING victims v WHERE i.operation_id = v.operation_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone)::bigint AS intents, (SELECT count(*) FROM outcomes)::bigint AS outcomes;

-- name: PruneDeletions :one
-- Finished byte deletions (deleted or superseded).
WITH victims AS (
    SELECT id FROM deletions
    WHERE deleted_at IS NOT NULL
      AND deleted_at < now() - make_interval(secs => @older_than_seconds::float8)
    ORDER BY deleted_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM deletions d USING victims v WHERE d.id = v.id
    RETURNING 1
)
SELECT count(*)::bigint FROM gone;

-- name: PruneHandoffs :one
-- Published and aborted moves, with the children of a split or merge
-- once no move of its group is left.
WITH victims AS (
    SELECT handoff_id, group_id FROM handoffs
    WHERE finished_at IS NOT NULL
      AND finished_at < now() - make_interval(secs => @older_than_seconds::float8)
    ORDER BY finished_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM handoffs h USING victims v WHERE h.handoff_id = v.handoff_id
    RETURNING h.group_id
), children AS (
    DELETE FROM handoff_children c
    WHERE c.group_id IN (SELECT group_id FROM gone WHERE group_id IS NOT NULL)
      AND NOT EXISTS (SELECT 1 FROM handoffs h WHERE h.group_id = c.group_id AND h.handoff_id NOT IN (SELECT handoff_id FROM victims))
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone)::bigint AS handoffs, (SELECT count(*) FROM children)::bigint AS children;

-- name: PrunePlans :one
-- Recorded plans no move refers to any more, and the apply requests
-- taken that long ago.
WITH victims AS (
    SELECT p.plan_id FROM controller_plans p
    WHERE p.created_at < now() - make_interval(secs => @older_than_seconds::float8)
      AND NOT EXISTS (SELECT 1 FROM handoffs h WHERE h.plan_id = p.plan_id)
    ORDER BY p.created_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
), requests AS (
    DELETE FROM controller_apply_requests r
    WHERE r.request_id IN (SELECT request_id FROM controller_apply_requests
                           WHERE taken_at < now() - make_interval(secs => @older_than_seconds::float8)
                           ORDER BY taken_at LIMIT @batch_size)
    RETURNING 1
), gone AS (
    DELETE FROM controller_plans p USING victims v WHERE p.plan_id = v.plan_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone)::bigint AS plans, (SELECT count(*) FROM requests)::bigint AS requests;
