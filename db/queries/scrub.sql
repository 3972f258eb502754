-- The scrub (issue 28): verified placements of one datacenter, the ones
-- checked longest ago (or never) first, after the first @skip of them (a
-- pass's own skipped placements, which stay in front).

-- name: ScrubCandidates :many
SELECT p.digest, p.backend, p.datacenter, p.location, p.size_bytes, p.epoch,
       coalesce(c.checked_at, p.verified_at, p.created_at)::timestamptz AS last_checked
FROM placements p
LEFT JOIN placement_checks c
  ON c.digest = p.digest AND c.backend = p.backend AND c.datacenter = p.datacenter AND c.location = p.location
WHERE coalesce(p.datacenter, '') = @datacenter::text AND coalesce(p.state, '') = 'verified'
ORDER BY c.checked_at NULLS FIRST, p.verified_at, p.digest
OFFSET @skip LIMIT @max_rows;

-- name: RecordPlacementChecks :exec
-- The checks of a page of a scrub pass, one array per key column, all
-- with @outcome, in one statement and one commit (a commit per check
-- held a pass over small blobs to ~170 placements/s: docs/performance.md,
-- "Issue 28"). No key twice: a pass checks each placement once.
INSERT INTO placement_checks (digest, backend, datacenter, location, checked_at, outcome)
SELECT k.digest, k.backend, k.datacenter, k.location, now(), @outcome
FROM (SELECT unnest(@digests::text[]) AS digest, unnest(@backends::text[]) AS backend,
             unnest(@datacenters::text[]) AS datacenter, unnest(@locations::text[]) AS location) k
ON CONFLICT (digest, backend, datacenter, location)
DO UPDATE SET checked_at = excluded.checked_at, outcome = excluded.outcome;

-- name: ScrubLoad :one
-- What a scrub pass plans from (replication.PlanPass): the bytes of a
-- datacenter's verified placements, those last checked (or verified)
-- before now() + @due_in_seconds (due before the next pass; negative: in
-- the past), the age of the least recently checked one (how far behind
-- the scrub is), and the database's clock, which every check time is on.
SELECT now()::timestamptz AS db_now,
       coalesce(sum(p.size_bytes), 0)::bigint AS total_bytes,
       coalesce(sum(p.size_bytes) FILTER (
         WHERE coalesce(c.checked_at, p.verified_at, p.created_at) < now() + make_interval(secs => @due_in_seconds::float8)), 0)::bigint AS due_bytes,
       coalesce(extract(epoch FROM now() - min(coalesce(c.checked_at, p.verified_at, p.created_at))), 0)::float8 AS oldest_age_seconds
FROM placements p
LEFT JOIN placement_checks c
  ON c.digest = p.digest AND c.backend = p.backend AND c.datacenter = p.datacenter AND c.location = p.location
WHERE coalesce(p.datacenter, '') = @datacenter::text AND coalesce(p.state, '') = 'verified';
