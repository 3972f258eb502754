-- name: CreateRepository :execrows
INSERT INTO repositories (name) VALUES (@name) ON CONFLICT (name) DO NOTHING;

-- name: CreateRepositoryBy :one
-- A push's creation of its repository (issue 31): true when this
-- statement created it.
WITH created AS (
    INSERT INTO repositories (name, created_by) VALUES (@name, @created_by)
    ON CONFLICT (name) DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM created)::boolean AS created;

-- name: ListRepositories :many
SELECT * FROM repositories ORDER BY name;

-- name: RepositoryExists :one
SELECT EXISTS (SELECT 1 FROM repositories WHERE name = @name);

-- name: EnsurePrincipal :exec
INSERT INTO principals (name) VALUES (@name) ON CONFLICT (name) DO NOTHING;

-- name: InsertToken :exec
INSERT INTO tokens (id, principal, secret_sha256) VALUES (@id, @principal, @secret_sha256);

-- name: InsertGrants :exec
-- Grants (pattern:permission strings) for exactly one of token_id and
-- principal (the table checks it).
INSERT INTO grants (token_id, principal, pattern, permission)
SELECT sqlc.narg(token_id)::text, sqlc.narg(principal)::text, split_part(g, ':', 1), split_part(g, ':', 2)
FROM unnest(@grants::text[]) AS g
ON CONFLICT DO NOTHING;

-- name: DeletePrincipalGrants :execrows
DELETE FROM grants
WHERE principal = @principal AND pattern || ':' || permission = ANY (@grants::text[]);

-- name: RevokeToken :one
UPDATE tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = @id RETURNING revoked_at;

-- name: TokenForAuth :one
-- The authentication hot path: one primary-key lookup carrying the token's
-- effective grants (its own plus its principal's) as pattern:permission.
SELECT t.id, t.principal, t.secret_sha256, (t.revoked_at IS NOT NULL)::boolean AS revoked,
       (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute')::boolean AS touch,
       ARRAY(
           SELECT g.pattern || ':' || g.permission FROM grants g
           WHERE g.token_id = t.id OR g.principal = t.principal
           ORDER BY g.id
       )::text[] AS grants
FROM tokens t
WHERE t.id = @id;

-- name: TouchToken :exec
UPDATE tokens SET last_used_at = now() WHERE id = @id AND revoked_at IS NULL;

-- name: PrincipalGrants :many
-- Every grant a principal holds now: its own and those of its valid tokens
-- (the view principal_grants, two index lookups).
SELECT grant_text::text FROM principal_grants WHERE principal = @principal::text ORDER BY grant_id;

-- name: PrincipalExists :one
SELECT EXISTS (SELECT 1 FROM principals WHERE name = @name);

-- name: LockBootstrap :exec
SELECT pg_advisory_xact_lock(7300512662436216171);

-- name: ValidAdminTokenExists :one
-- A valid token holding *:admin, itself or through its principal.
SELECT EXISTS (
    SELECT 1 FROM tokens t
    JOIN grants g ON g.token_id = t.id OR g.principal = t.principal
    WHERE t.revoked_at IS NULL AND g.pattern = '*' AND g.permission = 'admin'
);
