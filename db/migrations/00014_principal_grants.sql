-- +goose Up
-- The grants a principal holds now: its own, and those of its tokens that
-- are not revoked. Finalize re-checks them on every publication
-- (FinalizeContext) and LoadPrincipal reads them (PrincipalGrants), both
-- through this view. A grant belongs to a principal or to a token, never
-- both (grants_check), so the two halves are disjoint. Postgres pushes a
-- WHERE principal = ... into each half, which makes each an index lookup
-- (grants_principal_idx; tokens_principal_idx, then grants_token_idx).
-- Written as one join of grants with tokens and an OR across the two
-- tables, the same set cost a scan of both tables on every read
-- (docs/performance.md, item 24).
CREATE VIEW principal_grants AS
SELECT g.principal, g.id AS grant_id, (g.pattern || ':' || g.permission)::text AS grant_text
FROM grants g
WHERE g.principal IS NOT NULL
UNION ALL
SELECT t.principal, g.id, (g.pattern || ':' || g.permission)::text
FROM tokens t
JOIN grants g ON g.token_id = t.id
WHERE t.revoked_at IS NULL;

COMMENT ON VIEW principal_grants IS 'The grants each principal holds now: its own and those of its unrevoked tokens, one row per grant. Query it with WHERE principal = ...; see docs/auth.md.';
COMMENT ON COLUMN principal_grants.principal IS 'The principal holding the grant (directly, or through one of its tokens).';
COMMENT ON COLUMN principal_grants.grant_id IS 'grants.id of the grant: the order grants were given in.';
COMMENT ON COLUMN principal_grants.grant_text IS 'The grant as pattern:permission, e.g. team/*:write.';

-- +goose Down
DROP VIEW principal_grants;
