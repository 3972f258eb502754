-- +goose Up
-- Repositories, principals, tokens and grants: who may do what to which
-- repository. Token secrets never enter the database, only their SHA-256.
-- See docs/auth.md for the model and the queries DBAs run against it.

CREATE TABLE repositories (
    name        text        PRIMARY KEY CHECK (
                    length(name) <= 255
                    AND name ~ '^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$'),
    created_at  timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE repositories IS 'Named namespaces of references (team/app), the partition key of the authority runtime. Names follow the OCI distribution name grammar (checked here and in auth.ValidRepository).';
COMMENT ON COLUMN repositories.name IS 'Repository name: lowercase path components [a-z0-9]+ joined by ., _, __ or dashes, separated by /; at most 255 characters.';
COMMENT ON COLUMN repositories.created_at IS 'Database time the repository was created (api repo create or POST /v1/admin/repositories).';

CREATE TABLE principals (
    name        text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$'),
    created_at  timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE principals IS 'Identities that hold tokens and grants (a person, a CI system, a node). Created on first token issue; intents record the principal that opened them.';
COMMENT ON COLUMN principals.name IS 'Principal name: 1-128 letters, digits, ., _, @, : or -, starting with a letter or digit.';
COMMENT ON COLUMN principals.created_at IS 'Database time the principal was first seen.';

CREATE TABLE tokens (
    id             text        PRIMARY KEY CHECK (id ~ '^[a-z2-7]{16}$'),
    principal      text        NOT NULL REFERENCES principals (name),
    secret_sha256  bytea       NOT NULL CHECK (length(secret_sha256) = 32),
    created_at     timestamptz NOT NULL DEFAULT now(),
    revoked_at     timestamptz,
    last_used_at   timestamptz
);
CREATE INDEX tokens_principal_idx ON tokens (principal);

COMMENT ON TABLE tokens IS 'API tokens (bp_<id>_<secret>). Only the SHA-256 of the secret is stored; the secret is shown once at creation. Authentication looks a token up by id (primary key) and compares hashes in constant time.';
COMMENT ON COLUMN tokens.id IS 'Public token id: 16 lowercase base32 characters, the middle part of the token string. Safe to log and to show.';
COMMENT ON COLUMN tokens.principal IS 'The principal the token authenticates as.';
COMMENT ON COLUMN tokens.secret_sha256 IS 'SHA-256 of the token''s secret part (32 bytes). The secret itself is never stored.';
COMMENT ON COLUMN tokens.created_at IS 'Database time the token was issued.';
COMMENT ON COLUMN tokens.revoked_at IS 'Database time the token was revoked (api token revoke); a revoked token authenticates nothing. NULL while valid.';
COMMENT ON COLUMN tokens.last_used_at IS 'Database time of a recent successful authentication, refreshed at most once a minute; NULL if never used.';

CREATE TABLE grants (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token_id    text        REFERENCES tokens (id) ON DELETE CASCADE,
    principal   text        REFERENCES principals (name) ON DELETE CASCADE,
    pattern     text        NOT NULL CHECK (
                    pattern = '*'
                    OR (length(pattern) <= 257
                        AND pattern ~ '^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*(/\*)?$')),
    permission  text        NOT NULL CHECK (permission IN ('read', 'write', 'admin')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (num_nonnulls(token_id, principal) = 1),
    UNIQUE NULLS NOT DISTINCT (token_id, principal, pattern, permission)
);
CREATE INDEX grants_token_idx ON grants (token_id) WHERE token_id IS NOT NULL;
CREATE INDEX grants_principal_idx ON grants (principal) WHERE principal IS NOT NULL;

COMMENT ON TABLE grants IS 'Permissions on repositories, held by one token or by a principal (then every valid token of the principal has it). admin implies write implies read. A token''s effective rights are its own grants plus its principal''s.';
COMMENT ON COLUMN grants.id IS 'Surrogate key (insertion order).';
COMMENT ON COLUMN grants.token_id IS 'The token holding the grant; NULL when the principal holds it. Exactly one of token_id and principal is set.';
COMMENT ON COLUMN grants.principal IS 'The principal holding the grant; NULL when a single token holds it.';
COMMENT ON COLUMN grants.pattern IS 'Repositories covered: an exact name (team/app), a prefix wildcard (team/* covers team/app and team/a/b, not team itself nor teamx/app), or * for every repository.';
COMMENT ON COLUMN grants.permission IS 'read, write or admin; each implies the ones before it.';
COMMENT ON COLUMN grants.created_at IS 'Database time the grant was created.';

-- +goose Down
DROP TABLE grants;
DROP TABLE tokens;
DROP TABLE principals;
DROP TABLE repositories;
