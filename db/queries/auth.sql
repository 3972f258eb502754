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

-- name: ListTokens :many
-- Every token (or one principal's), newest first, with its own grants;
-- never the secret (only its hash is stored).
SELECT t.id, t.principal, t.created_at, t.revoked_at, t.last_used_at,
       coalesce(array_agg(g.pattern || ':' || g.permission ORDER BY g.pattern, g.permission) FILTER (WHERE g.id IS NOT NULL), '{}')::text[] AS grants
FROM tokens t LEFT JOIN grants g ON g.token_id = t.id
WHERE (@principal::text = '' OR t.principal = @principal::text)
GROUP BY t.id
ORDER BY t.created_at DESC, t.id;

-- name: ListPrincipalGrantRows :many
-- Grants given to principals (api grant add), by principal.
SELECT principal::text AS principal, pattern, permission, created_at
FROM grants
WHERE principal IS NOT NULL AND (@principal::text = '' OR principal = @principal::text)
ORDER BY principal, pattern, permission;

-- name: DeleteRepository :one
-- Deletes a repository with no blob references, no upload in flight and
-- no abandoned upload whose staged bytes the reaper has still to delete:
-- its finished uploads (published or abandoned) and their outcomes go
-- with it, in this one statement (the foreign keys are checked at its
-- end). Returns what still holds it when it is not empty (nothing is
-- deleted then); deleted = true when it was.
WITH holds AS (
    SELECT (SELECT count(*) FROM blob_references b WHERE b.repository = @name::text)::bigint AS refs,
           (SELECT count(*) FROM intents i WHERE i.repository = @name::text
                AND (i.state = 'pending' OR (i.state = 'abandoned' AND i.staged_location IS NOT NULL AND i.staged_deleted_at IS NULL)))::bigint AS intents
), outcomes AS (
    DELETE FROM operation_outcomes o USING holds
    WHERE o.repository = @name::text AND holds.refs = 0 AND holds.intents = 0
    RETURNING 1
), finished AS (
    DELETE FROM intents i USING holds
    WHERE i.repository = @name::text AND holds.refs = 0 AND holds.intents = 0
    RETURNING 1
), gone AS (
    DELETE FROM repositories r USING holds
    WHERE r.name = @name::text AND holds.refs = 0 AND holds.intents = 0
    RETURNING 1
)
SELECT holds.refs, holds.intents, EXISTS (SELECT 1 FROM gone)::boolean AS deleted FROM holds;
