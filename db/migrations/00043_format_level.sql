-- +goose Up
-- The cluster's format level (ZBP-5 R43, R44, R88; docs/quotas.md "Format
-- levels"; package formats): which journal record and checkpoint manifest
-- formats the cluster may hold. Readers read every level their build
-- knows; writers write a newer format only once the level allows it, and
-- the level is raised only by an operator's finalize (`api cluster
-- finalize`), refused while a live node reads less. Level 1: journal
-- records without "at", full (format 1) manifests only. Level 2: records
-- with "at" (upload rates) and incremental (format 2) manifests.
CREATE TABLE cluster_format (
    id        boolean     PRIMARY KEY DEFAULT true CHECK (id),
    level     smallint    NOT NULL CHECK (level >= 1),
    raised_by text,
    raised_at timestamptz
);
COMMENT ON TABLE cluster_format IS 'The cluster''s format level (one row): the newest journal and checkpoint formats writers may write. Raised by `api cluster finalize` once every live node reads it; never lowered.';
COMMENT ON COLUMN cluster_format.id IS 'Always true: the table holds one row.';
COMMENT ON COLUMN cluster_format.level IS '1: journal records without "at", full (format 1) checkpoints only. 2: records with "at" (upload rates) and incremental (format 2) checkpoint manifests.';
COMMENT ON COLUMN cluster_format.raised_by IS 'Who set the level last: the principal or operator of a finalize, or the migration that created it.';
COMMENT ON COLUMN cluster_format.raised_at IS 'When the level was set last (database clock).';

-- A fresh database (no node ever registered) holds nothing an older
-- binary wrote, and none may join it later (below): level 2. A database
-- nodes registered in is an upgrade: older binaries may still run, or be
-- rolled back to: level 1 until finalize.
INSERT INTO cluster_format (level, raised_by, raised_at)
SELECT CASE WHEN EXISTS (SELECT 1 FROM nodes) THEN 1 ELSE 2 END, 'migration 00043', now();

-- What each node's running process reads. An older binary's registration
-- (an upsert that knows neither column) sets started_at and leaves both
-- behind, so a report counts only when it was made by the registration
-- that started the running process (reads_format_started_at = started_at).
ALTER TABLE nodes
    ADD COLUMN reads_format smallint CHECK (reads_format >= 1),
    ADD COLUMN reads_format_started_at timestamptz;
COMMENT ON COLUMN nodes.reads_format IS 'The highest cluster format level the node''s build reads (formats.Reads), reported at registration; NULL: a build from before levels (reads level 1). Counts only while reads_format_started_at = started_at.';
COMMENT ON COLUMN nodes.reads_format_started_at IS 'The started_at of the registration that reported reads_format: an older binary''s registration moves started_at and not this, and its process reads level 1.';

-- A process that cannot read the cluster's level does not register (its
-- binary refuses to start): after finalize, rolling back past it is
-- refused here rather than left to quarantine records and drop
-- checkpoints it cannot read (R88).
-- +goose StatementBegin
CREATE FUNCTION nodes_reads_cluster_format() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_level smallint;
    v_reads smallint;
BEGIN
    SELECT level INTO v_level FROM cluster_format;
    v_reads := CASE WHEN NEW.reads_format_started_at = NEW.started_at THEN NEW.reads_format END;
    IF coalesce(v_reads, 1) < v_level THEN
        RAISE EXCEPTION 'node % reads cluster format level %, and this cluster is finalized at level %: run a release that reads it (a rollback past `api cluster finalize` is not supported)',
            NEW.node_id, coalesce(v_reads, 1), v_level
            USING ERRCODE = 'BPF01';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION nodes_reads_cluster_format() IS 'Refuses the registration of a node whose build does not read the cluster''s format level (SQLSTATE BPF01).';
CREATE TRIGGER nodes_reads_cluster_format BEFORE INSERT OR UPDATE OF started_at ON nodes
    FOR EACH ROW EXECUTE FUNCTION nodes_reads_cluster_format();

-- +goose Down
DROP TRIGGER nodes_reads_cluster_format ON nodes;
DROP FUNCTION nodes_reads_cluster_format();
ALTER TABLE nodes DROP COLUMN reads_format_started_at, DROP COLUMN reads_format;
DROP TABLE cluster_format;
