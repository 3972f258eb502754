-- +goose Up
-- Issue 28: the scrub re-reads and re-hashes verified placements, oldest
-- checked first, and records here when each was last checked (and what
-- it found). A row of its own rather than a column of placements: the
-- ledger is an optional persistence domain that goose does not create
-- (db/schema/placements.sql), and a check is the scrub's record, not a
-- transition of the placement.
CREATE TABLE placement_checks (
    digest      sha256_digest   NOT NULL,
    backend     backend_label   NOT NULL,
    datacenter  dc_label        NOT NULL,
    location    object_location NOT NULL,
    checked_at  timestamptz     NOT NULL DEFAULT now(),
    outcome     text            NOT NULL CONSTRAINT placement_checks_outcome_known CHECK (outcome IN ('intact', 'digest_mismatch', 'missing')),
    CONSTRAINT placement_checks_pkey PRIMARY KEY (digest, backend, datacenter, location)
);

COMMENT ON COLUMN placement_checks.digest IS 'The checked placement''s digest (with backend, datacenter and location: its key in placements).';
COMMENT ON COLUMN placement_checks.backend IS 'The checked placement''s backend label.';
COMMENT ON COLUMN placement_checks.datacenter IS 'The checked placement''s datacenter: the scrub of that datacenter''s workers wrote this row.';
COMMENT ON COLUMN placement_checks.location IS 'The checked placement''s object location.';
COMMENT ON COLUMN placement_checks.checked_at IS 'When the scrub last re-read and re-hashed the placement''s bytes (database clock).';
COMMENT ON COLUMN placement_checks.outcome IS 'What that check found: intact, digest_mismatch (other bytes, short, or undecodable) or missing (the object was gone).';
COMMENT ON TABLE placement_checks IS 'The scrub''s last check of each placement it re-read: when, and whether the bytes hashed to the digest (intact), to something else or short (digest_mismatch), or were gone (missing).';

-- +goose Down
DROP TABLE placement_checks;
