-- +goose Up
-- Issue 29, "No leaked bytes" (L1; docs/sweeps.md, docs/backends.md).
--
-- 1. Which database a backend belongs to. The inventory deletes objects
--    nothing in Postgres accounts for; pointed at a fresh or restored
--    database it would take every object of the backend. Each backend now
--    carries a marker (backend.Janitor: a file at its root, an object
--    beside its keys) naming this database's identity, the datacenter,
--    the backend's name and the last inventory pass; these rows are this
--    database's side of it. The inventory deletes nothing when the two
--    disagree (sweep.Judge).
CREATE TABLE cluster_identity (
    singleton   boolean     PRIMARY KEY DEFAULT true CONSTRAINT cluster_identity_one_row CHECK (singleton),
    cluster_id  uuid        NOT NULL DEFAULT gen_random_uuid(),
    created_at  timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE cluster_identity IS 'The identity of this Blobplane database (the cluster of record): one row, made by the first inventory pass that adopts a backend. Backend markers name it; a database restored into another cluster keeps it only if this row came with it.';
COMMENT ON COLUMN cluster_identity.singleton IS 'Always true: there is one row.';
COMMENT ON COLUMN cluster_identity.cluster_id IS 'Random identity written into every backend marker this database adopts.';
COMMENT ON COLUMN cluster_identity.created_at IS 'Database time the identity was made.';

CREATE TABLE backend_markers (
    datacenter         dc_label      NOT NULL,
    backend            backend_label NOT NULL,
    pass               bigint        NOT NULL DEFAULT 1 CONSTRAINT backend_markers_pass_positive CHECK (pass >= 1),
    adopted_at         timestamptz   NOT NULL DEFAULT now(),
    marker_written_at  timestamptz,
    capped_pass        bigint        CONSTRAINT backend_markers_capped_pass_positive CHECK (capped_pass >= 1),
    updated_at         timestamptz   NOT NULL DEFAULT now(),
    CONSTRAINT backend_markers_pkey PRIMARY KEY (datacenter, backend)
);

COMMENT ON TABLE backend_markers IS 'This database''s record of the ownership marker it wrote on each backend of each datacenter (issue 29). The inventory deletes on a backend only when the backend''s marker names this database, this datacenter and this backend, and a pass no later than this row''s: a marker ahead of the row means the database was restored from before that pass.';
COMMENT ON COLUMN backend_markers.datacenter IS 'Datacenter whose workers inventory the backend.';
COMMENT ON COLUMN backend_markers.backend IS 'The backend''s configured name (BLOBPLANE_BACKENDS).';
COMMENT ON COLUMN backend_markers.pass IS 'Inventory passes that found the marker in agreement, counted from 1 (adoption). Advanced before the marker is rewritten with it, so the marker never runs ahead of a database that was not restored.';
COMMENT ON COLUMN backend_markers.adopted_at IS 'Database time the first inventory pass (or an operator''s re-adoption) claimed the backend.';
COMMENT ON COLUMN backend_markers.marker_written_at IS 'Database time the marker was last confirmed written on the backend; NULL while an adoption has recorded this row but not yet written the marker.';
COMMENT ON COLUMN backend_markers.capped_pass IS 'The pass that found more deletions due than one pass may make (the cap) and only reported them (a dry run); later passes delete up to the cap each. NULL once a pass finds no more than the cap.';
COMMENT ON COLUMN backend_markers.updated_at IS 'Database time of the last change.';

-- 2. Whether a transfer into a placement is still under way. A pending
--    placement is evidence of a write in flight; its writer is an upload
--    (whose intent claims the digest while it is pending) or a
--    replication transfer, which runs as a River job of kind replicate
--    (jobs.ReplicateArgs, unique per digest and target datacenter) and has
--    no intent. The collector fails a pending placement only when neither
--    is left (store.SettleStalePlacements). River's tables are created
--    after goose's migrations, hence plpgsql (resolved when called) and
--    the check for the table.
-- +goose StatementBegin
CREATE FUNCTION transfer_unfinished(target_digest text, target_datacenter text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF to_regclass('river_job') IS NULL THEN
        RETURN false;
    END IF;
    RETURN EXISTS (
        SELECT 1 FROM river_job
        WHERE kind = 'replicate'
          AND state IN ('available', 'pending', 'retryable', 'running', 'scheduled')
          AND args @> jsonb_build_object('digest', target_digest, 'target_datacenter', target_datacenter));
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION transfer_unfinished(text, text) IS 'True while a replicate River job for the digest into the datacenter is not finished (available, pending, retryable, running or scheduled): its transfer may still write and verify the placement it staged. Uses river_job_args_index (GIN on args).';

-- +goose Down
DROP FUNCTION transfer_unfinished(text, text);
DROP TABLE backend_markers;
DROP TABLE cluster_identity;
