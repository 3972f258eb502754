-- +goose Up
-- The label and digest columns written on every upload take their shape
-- from domains instead of table CHECK constraints. Same rules, same
-- check_violation (SQLSTATE 23514) for a malformed value, but cheaper:
-- Postgres re-reads and re-plans a table's CHECK expressions from their
-- stored text for every INSERT and UPDATE (all of them, whichever columns
-- changed), while a domain's check is kept prepared in the type cache and
-- runs only on a value assigned to the column. An upload inserts and
-- updates intents and placements and inserts a blob row; their regular
-- expressions were about a fifth of Postgres' CPU per upload
-- (docs/performance.md, item 23).
--
-- Converting a column checks every row under an ACCESS EXCLUSIVE lock on
-- its table: on a large installation, migrate in a quiet window.
CREATE DOMAIN sha256_digest AS text
    CONSTRAINT sha256_digest_canonical CHECK (VALUE ~ '^sha256:[0-9a-f]{64}$');
CREATE DOMAIN principal_name AS text
    CONSTRAINT principal_name_shape CHECK (VALUE ~ '^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$');
CREATE DOMAIN dc_label AS text
    CONSTRAINT dc_label_shape CHECK (VALUE ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$');
CREATE DOMAIN backend_label AS text
    CONSTRAINT backend_label_shape CHECK (VALUE ~ '^[a-z0-9][a-z0-9_-]{0,31}$');
CREATE DOMAIN object_location AS text
    CONSTRAINT object_location_shape CHECK (octet_length(VALUE) BETWEEN 1 AND 1024 AND VALUE !~ '[[:cntrl:]]');

COMMENT ON DOMAIN sha256_digest IS 'Canonical content digest: sha256:<64 lowercase hex>.';
COMMENT ON DOMAIN principal_name IS 'A principal''s name (principals.name''s shape).';
COMMENT ON DOMAIN dc_label IS 'Datacenter label: lowercase alphanumerics and inner hyphens, at most 63.';
COMMENT ON DOMAIN backend_label IS 'Backend label: lowercase alphanumerics, _ and -, at most 32.';
COMMENT ON DOMAIN object_location IS 'Object key or store-relative path: 1 to 1024 bytes, no control characters.';

ALTER TABLE intents
    DROP CONSTRAINT intents_principal_check,
    DROP CONSTRAINT intents_expected_digest_check,
    DROP CONSTRAINT intents_ingress_datacenter_check,
    DROP CONSTRAINT intents_backend_check,
    DROP CONSTRAINT intents_staged_location_check,
    ALTER COLUMN principal TYPE principal_name,
    ALTER COLUMN expected_digest TYPE sha256_digest,
    ALTER COLUMN ingress_datacenter TYPE dc_label,
    ALTER COLUMN backend TYPE backend_label,
    ALTER COLUMN staged_location TYPE object_location;

ALTER TABLE blobs
    DROP CONSTRAINT blobs_digest_check,
    ALTER COLUMN digest TYPE sha256_digest;

-- The placement ledger is created on the first placement write
-- (db/schema/placements.sql, which now uses the domains); a ledger created
-- before this migration is converted here. Its view depends on the
-- columns: it is dropped and recreated by the next first write.
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('placements') IS NOT NULL THEN
        DROP VIEW IF EXISTS placement_summary;
        ALTER TABLE placements
            DROP CONSTRAINT placements_digest_canonical,
            DROP CONSTRAINT placements_backend_label,
            DROP CONSTRAINT placements_datacenter_label,
            DROP CONSTRAINT placements_location_shape,
            ALTER COLUMN digest TYPE sha256_digest,
            ALTER COLUMN backend TYPE backend_label,
            ALTER COLUMN datacenter TYPE dc_label,
            ALTER COLUMN location TYPE object_location;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('placements') IS NOT NULL THEN
        DROP VIEW IF EXISTS placement_summary;
        ALTER TABLE placements
            ALTER COLUMN digest TYPE text,
            ALTER COLUMN backend TYPE text,
            ALTER COLUMN datacenter TYPE text,
            ALTER COLUMN location TYPE text,
            ADD CONSTRAINT placements_digest_canonical CHECK (digest ~ '^sha256:[0-9a-f]{64}$'),
            ADD CONSTRAINT placements_backend_label CHECK (backend ~ '^[a-z0-9][a-z0-9_-]{0,31}$'),
            ADD CONSTRAINT placements_datacenter_label CHECK (datacenter ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
            ADD CONSTRAINT placements_location_shape CHECK (octet_length(location) BETWEEN 1 AND 1024 AND location !~ '[[:cntrl:]]');
    END IF;
END
$$;
-- +goose StatementEnd

ALTER TABLE blobs
    ALTER COLUMN digest TYPE text,
    ADD CONSTRAINT blobs_digest_check CHECK (digest ~ '^sha256:[0-9a-f]{64}$');

ALTER TABLE intents
    ALTER COLUMN principal TYPE text,
    ALTER COLUMN expected_digest TYPE text,
    ALTER COLUMN ingress_datacenter TYPE text,
    ALTER COLUMN backend TYPE text,
    ALTER COLUMN staged_location TYPE text,
    ADD CONSTRAINT intents_principal_check CHECK (principal ~ '^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$'),
    ADD CONSTRAINT intents_expected_digest_check CHECK (expected_digest ~ '^sha256:[0-9a-f]{64}$'),
    ADD CONSTRAINT intents_ingress_datacenter_check CHECK (ingress_datacenter ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    ADD CONSTRAINT intents_backend_check CHECK (backend ~ '^[a-z0-9][a-z0-9_-]{0,31}$'),
    ADD CONSTRAINT intents_staged_location_check CHECK (octet_length(staged_location) BETWEEN 1 AND 1024 AND staged_location !~ '[[:cntrl:]]');

DROP DOMAIN object_location;
DROP DOMAIN backend_label;
DROP DOMAIN dc_label;
DROP DOMAIN principal_name;
DROP DOMAIN sha256_digest;
