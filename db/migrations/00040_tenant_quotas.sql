-- +goose Up
-- Tenant quotas (issue 33, docs/quotas.md, ADR 0009 item 6): a limit on
-- what every repository under a prefix holds together. A tenant's
-- repositories live at many homes, so its usage is not partition state:
-- it is this row, kept by a trigger in the transaction that writes each
-- reference row, under the row's lock, which makes the check exact
-- (publications into one tenant with a quota serialize on it).
CREATE TABLE tenant_quotas (
    prefix     text        PRIMARY KEY CHECK (
                   length(prefix) <= 255
                   AND prefix ~ '^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*/$'),
    max_bytes  bigint      NOT NULL DEFAULT 0 CHECK (max_bytes >= 0),
    max_blobs  bigint      NOT NULL DEFAULT 0 CHECK (max_blobs >= 0),
    used_bytes bigint      NOT NULL DEFAULT 0 CHECK (used_bytes >= 0),
    used_blobs bigint      NOT NULL DEFAULT 0 CHECK (used_blobs >= 0),
    set_by     text        NOT NULL CHECK (set_by <> ''),
    set_at     timestamptz NOT NULL DEFAULT now(),
    CHECK (max_bytes > 0 OR max_blobs > 0)
);
COMMENT ON TABLE tenant_quotas IS 'Admin-set limits on what the repositories under a prefix (a tenant: team/) hold together, with their usage, kept exact by blob_references_tenant_usage in each reference write''s transaction.';
COMMENT ON COLUMN tenant_quotas.prefix IS 'The tenant: a repository name prefix ending in /; every repository whose name starts with it counts.';
COMMENT ON COLUMN tenant_quotas.max_bytes IS 'Most bytes the tenant''s repositories may reference together (each repository counting each distinct digest once); 0: no limit on bytes.';
COMMENT ON COLUMN tenant_quotas.max_blobs IS 'Most references the tenant''s repositories may hold together; 0: no limit on blobs.';
COMMENT ON COLUMN tenant_quotas.used_bytes IS 'What they hold now: set from the ledger when the quota is created, then moved by the trigger.';
COMMENT ON COLUMN tenant_quotas.used_blobs IS 'References they hold now (as used_bytes).';
COMMENT ON COLUMN tenant_quotas.set_by IS 'The principal that last set the quota.';
COMMENT ON COLUMN tenant_quotas.set_at IS 'When the quota was last set (database clock).';

-- Each reference row created or removed moves the usage of every tenant
-- quota whose prefix its repository starts with; a creation that takes a
-- tenant past its quota fails its transaction with SQLSTATE BPQ01 (the
-- publication is refused: store maps it to forbidden, OCI DENIED).
-- +goose StatementBegin
CREATE FUNCTION blob_references_tenant_usage() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r      blob_references;
    v_sign integer;
    v_size bigint;
    q      record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tenant_quotas) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN r := NEW; v_sign := 1; ELSE r := OLD; v_sign := -1; END IF;
    SELECT b.size_bytes INTO v_size FROM blobs b WHERE b.digest = r.digest;
    FOR q IN
        UPDATE tenant_quotas t
        SET used_bytes = t.used_bytes + v_sign * v_size, used_blobs = t.used_blobs + v_sign
        WHERE starts_with(r.repository, t.prefix)
        RETURNING t.prefix, t.max_bytes, t.max_blobs, t.used_bytes, t.used_blobs
    LOOP
        IF v_sign > 0 AND q.max_bytes > 0 AND q.used_bytes > q.max_bytes THEN
            RAISE EXCEPTION 'tenant % is over its quota of % bytes: it holds %, and this upload adds %',
                q.prefix, q.max_bytes, q.used_bytes - v_size, v_size USING ERRCODE = 'BPQ01';
        END IF;
        IF v_sign > 0 AND q.max_blobs > 0 AND q.used_blobs > q.max_blobs THEN
            RAISE EXCEPTION 'tenant % is over its quota of % blobs: it holds %, and this upload adds 1',
                q.prefix, q.max_blobs, q.used_blobs - 1 USING ERRCODE = 'BPQ01';
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION blob_references_tenant_usage() IS 'Keeps tenant_quotas.used_* exact and refuses (SQLSTATE BPQ01) a reference that takes a tenant past its quota (issue 33).';
CREATE TRIGGER blob_references_tenant_usage AFTER INSERT OR DELETE ON blob_references
FOR EACH ROW EXECUTE FUNCTION blob_references_tenant_usage();

-- +goose Down
DROP TRIGGER blob_references_tenant_usage ON blob_references;
DROP FUNCTION blob_references_tenant_usage();
DROP TABLE tenant_quotas;
