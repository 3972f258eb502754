-- The placement ledger (../shared/spec/blob-placement.md).
--
-- An optional persistence domain: goose migrations do NOT create it. The
-- spec: "Opening a metadata store does not create them. The first placement
-- write creates the required table; reads before that write return no
-- placements." store embeds this file (db.PlacementsSchema) and runs it once,
-- under a transaction-scoped advisory lock, on the first placement write.
-- sqlc generates from it too (sqlc.yaml), so every statement must be
-- idempotent and plain DDL.

-- The digest, backend, datacenter and location columns take their shape
-- from the domains of migration 00013 (checked once per assigned value,
-- not re-planned per statement like a table CHECK).
CREATE TABLE IF NOT EXISTS placements (
    digest        sha256_digest   NOT NULL,
    backend       backend_label   NOT NULL,
    datacenter    dc_label        NOT NULL,
    location      object_location NOT NULL,
    state         text        NOT NULL CONSTRAINT placements_state_known CHECK (state IN ('pending', 'verified', 'failed', 'revoked')),
    reason        text        CONSTRAINT placements_reason_known CHECK (reason IN ('source_unavailable', 'digest_mismatch', 'backend_refused')),
    revoke_reason text        CONSTRAINT placements_revoke_reason_known CHECK (revoke_reason IN ('reclamation', 'administrative')),
    size_bytes    bigint      NOT NULL CONSTRAINT placements_size_nonnegative CHECK (size_bytes >= 0),
    epoch         bigint      NOT NULL CONSTRAINT placements_epoch_nonnegative CHECK (epoch >= 0),
    generation    bigint      NOT NULL DEFAULT 1 CONSTRAINT placements_generation_positive CHECK (generation >= 1),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    verified_at   timestamptz,
    CONSTRAINT placements_pkey PRIMARY KEY (digest, backend, datacenter, location),
    -- A failure reason exists only and always with the failed state.
    CONSTRAINT placements_reason_iff_failed CHECK ((reason IS NOT NULL) = (state = 'failed')),
    CONSTRAINT placements_revoke_reason_iff_revoked CHECK ((revoke_reason IS NOT NULL) = (state = 'revoked')),
    CONSTRAINT placements_verified_has_time CHECK (state <> 'verified' OR verified_at IS NOT NULL)
);

-- The primary key (digest first) serves the routing query and the per-digest
-- bound. These serve the DBA queries in docs/placements.md.
CREATE INDEX IF NOT EXISTS placements_pending_idx ON placements (updated_at) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS placements_failed_idx ON placements (reason, updated_at) WHERE state = 'failed';
CREATE INDEX IF NOT EXISTS placements_datacenter_state_idx ON placements (datacenter, state);

CREATE OR REPLACE VIEW placement_summary AS
SELECT digest,
       datacenter,
       count(*) FILTER (WHERE state = 'pending')  AS pending,
       count(*) FILTER (WHERE state = 'verified') AS verified,
       count(*) FILTER (WHERE state = 'failed')   AS failed,
       count(*) FILTER (WHERE state = 'revoked')  AS revoked,
       count(*)                                   AS total,
       max(updated_at)                            AS last_updated_at
FROM placements
GROUP BY digest, datacenter;

COMMENT ON TABLE placements IS 'Placement ledger: one row per (digest, backend, datacenter, location) that holds or is receiving a blob''s bytes. Only verified rows serve. Created on the first placement write (db/schema/placements.sql), not by migrations. See docs/placements.md.';
COMMENT ON COLUMN placements.digest IS 'Content digest, canonical sha256:<64 lowercase hex> of the uncompressed bytes.';
COMMENT ON COLUMN placements.backend IS 'Byte store kind the placement lives on (filesystem, s3).';
COMMENT ON COLUMN placements.datacenter IS 'Opaque datacenter label holding the placement.';
COMMENT ON COLUMN placements.location IS 'Object key or store-relative path inside the backend. Neutral identifier: no ecosystem metadata.';
COMMENT ON COLUMN placements.state IS 'pending (transfer in flight, never serves), verified (backend confirmed digest and size; the only serving state), failed (see reason), revoked (withdrawn from serving; see revoke_reason).';
COMMENT ON COLUMN placements.reason IS 'Failure reason, set only and always when state = failed: source_unavailable, digest_mismatch or backend_refused.';
COMMENT ON COLUMN placements.revoke_reason IS 'Why the placement was withdrawn, set only and always when state = revoked: reclamation or administrative.';
COMMENT ON COLUMN placements.size_bytes IS 'Expected content size in bytes, recorded at stage; verification must confirm it.';
COMMENT ON COLUMN placements.epoch IS 'Fencing epoch of the last accepted transition. A write under a lower epoch is rejected without change; an equal or higher epoch applies and a higher one takes over.';
COMMENT ON COLUMN placements.generation IS 'Starts at 1 and advances on every accepted transition, so readers can detect a concurrent change.';
COMMENT ON COLUMN placements.created_at IS 'Database time the row was first staged.';
COMMENT ON COLUMN placements.updated_at IS 'Database time of the last accepted transition.';
COMMENT ON COLUMN placements.verified_at IS 'Database time of the last successful verification; NULL if never verified. Kept after the row leaves verified.';

COMMENT ON VIEW placement_summary IS 'Placement counts by state per (digest, datacenter). Sum over datacenter for per-digest totals; a digest is serveable when its verified sum is > 0.';
COMMENT ON COLUMN placement_summary.digest IS 'Content digest.';
COMMENT ON COLUMN placement_summary.datacenter IS 'Datacenter label.';
COMMENT ON COLUMN placement_summary.pending IS 'Placements in state pending.';
COMMENT ON COLUMN placement_summary.verified IS 'Placements in state verified (serveable).';
COMMENT ON COLUMN placement_summary.failed IS 'Placements in state failed.';
COMMENT ON COLUMN placement_summary.revoked IS 'Placements in state revoked.';
COMMENT ON COLUMN placement_summary.total IS 'All placements of the digest in the datacenter.';
COMMENT ON COLUMN placement_summary.last_updated_at IS 'Latest updated_at among those placements.';

-- A copy leaving the serving states (issue 29): when it was a blob's
-- last verified or pending copy, HEAD answers 404 from then on
-- (GetReferencedBlob asks for one), so every API process must forget its
-- cached "found" answers (refs_notify, migration 00012). Failures and
-- revocations are rare: every such transition notifies, whether or not
-- another copy is left, so two copies failing at once cannot both miss
-- it. Migration 00025 adds it to a ledger created before it existed.
CREATE OR REPLACE TRIGGER placements_refs_notify AFTER UPDATE OF state ON placements
    FOR EACH ROW
    WHEN (OLD.state IN ('verified', 'pending') AND NEW.state IN ('failed', 'revoked'))
    EXECUTE FUNCTION refs_notify();
COMMENT ON TRIGGER placements_refs_notify ON placements IS 'A verified or pending copy failing or being revoked clears the API blob existence caches (NOTIFY blobplane_refs on commit): it may have been the blob''s last copy, after which HEAD answers 404.';
