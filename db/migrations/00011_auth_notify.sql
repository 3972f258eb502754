-- +goose Up
-- The API's authentication cache (store/authcache.go, docs/auth.md) keeps
-- successful token lookups in memory and must forget them the moment what
-- authentication reads changes. Every change to tokens, grants or
-- principals NOTIFYs blobplane_auth (store.AuthChannel); a listening API
-- process clears its whole cache on each notification. Changes are rare
-- (token issue and revoke, grants), so one channel and "clear everything"
-- is enough, and a DBA's hand-written UPDATE is covered like the api's.
--
-- NOTIFY is delivered only when the writing transaction commits, once per
-- transaction however many statements or rows fired it (identical
-- notifications within a transaction are folded into one).
--
-- The one frequent write is left out on purpose: authentication refreshes
-- tokens.last_used_at at most once a minute per token (TouchToken), and
-- that must not clear every API process's cache. So UPDATE on tokens is a
-- row-level trigger whose WHEN compares the whole row except last_used_at
-- (a column added later is covered without touching this trigger); for a
-- last_used_at-only update the WHEN is false and nothing is queued. Every
-- other event is a statement-level trigger: it fires once per statement,
-- even one that changed no row (harmless: a spurious clear).

-- +goose StatementBegin
CREATE FUNCTION auth_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('blobplane_auth', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION auth_notify() IS 'NOTIFY blobplane_auth (empty payload) from a transaction that changes tokens, grants or principals; API processes clear their authentication cache when it commits.';

CREATE TRIGGER tokens_auth_notify AFTER INSERT OR DELETE OR TRUNCATE ON tokens
    FOR EACH STATEMENT EXECUTE FUNCTION auth_notify();
CREATE TRIGGER tokens_auth_notify_update AFTER UPDATE ON tokens
    FOR EACH ROW
    WHEN ((to_jsonb(OLD) - 'last_used_at') IS DISTINCT FROM (to_jsonb(NEW) - 'last_used_at'))
    EXECUTE FUNCTION auth_notify();
CREATE TRIGGER grants_auth_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON grants
    FOR EACH STATEMENT EXECUTE FUNCTION auth_notify();
CREATE TRIGGER principals_auth_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON principals
    FOR EACH STATEMENT EXECUTE FUNCTION auth_notify();

COMMENT ON TRIGGER tokens_auth_notify ON tokens IS 'Issuing, deleting or truncating tokens clears the API authentication caches (NOTIFY blobplane_auth on commit).';
COMMENT ON TRIGGER tokens_auth_notify_update ON tokens IS 'An UPDATE that changes anything but last_used_at (revocation above all) clears the API authentication caches; the once-a-minute last_used_at refresh does not.';
COMMENT ON TRIGGER grants_auth_notify ON grants IS 'Any change to grants clears the API authentication caches (NOTIFY blobplane_auth on commit).';
COMMENT ON TRIGGER principals_auth_notify ON principals IS 'Any change to principals clears the API authentication caches (NOTIFY blobplane_auth on commit).';

-- +goose Down
DROP TRIGGER principals_auth_notify ON principals;
DROP TRIGGER grants_auth_notify ON grants;
DROP TRIGGER tokens_auth_notify_update ON tokens;
DROP TRIGGER tokens_auth_notify ON tokens;
DROP FUNCTION auth_notify();
