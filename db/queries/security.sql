-- name: ListReadablePlacements :many
-- The routing query as a principal may see it (issue 26 point 3): d's
-- placements only when some repository the principal can read references
-- d (a global admin or a node takes ListPlacements) — a name in @exact, or
-- one starting with a prefix in @prefixes ("team/" for the grant
-- "team/*", "" for "*"). Anything else gets no rows: the same answer as
-- an unknown digest. One statement, one round trip; the EXISTS stops at
-- the first readable reference however many repositories share d.
SELECT p.* FROM placements p
WHERE p.digest = @digest
  AND (EXISTS (
    SELECT 1 FROM blob_references r
    WHERE r.digest = @digest
      AND (r.repository = ANY (@exact::text[])
        OR EXISTS (SELECT 1 FROM unnest(@prefixes::text[]) AS g (prefix) WHERE starts_with(r.repository, g.prefix)))))
ORDER BY p.datacenter, p.backend, p.location;

-- name: ListLeasesOnDatabaseClock :many
-- Every lease with whether it is live by the database's clock (issue 26
-- point 11): expires_at was written from now(), so only now() may judge
-- it; a node whose clock runs slow must not call an expired lease owned.
SELECT sqlc.embed(leases), (leases.expires_at > now())::bool AS live
FROM leases ORDER BY leases.partition_id;
