-- +goose Up
-- Collection of unreferenced content (issue 7, DESIGN flow 5, S1, S6, L1,
-- ../shared/spec/publication-across-two-stores.md "content-addressed keys
-- break the base model").
--
-- A digest is collected only when nothing owns it: no reference (refcount
-- over blob_references) and no claim (a pending intent naming it, or a
-- pending placement: a close in progress). The decision is made on the
-- blob state row, locked FOR UPDATE, the same row a publication locks in
-- EnsureBlob, so publication and collection serialize: the row becomes
-- 'collected', every placement is revoked (reclamation) and a deletion
-- record per placement is written, all in one transaction. Bytes are
-- deleted only after that commit, per placement, by River jobs.

ALTER TABLE blobs DROP CONSTRAINT blobs_state_check;
ALTER TABLE blobs ADD CONSTRAINT blobs_state_check CHECK (state IN ('live', 'collected', 'obliterated'));
COMMENT ON COLUMN blobs.state IS 'live; collected (no reference and no claim was left: its placements are revoked and its bytes deleted or being deleted; a publication is refused retryably until a placement verifies again, then revives it); or obliterated by an operator (then no repository may publish or serve it).';

CREATE TABLE deletions (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    digest      text        NOT NULL REFERENCES blobs (digest),
    backend     text        NOT NULL CHECK (backend ~ '^[a-z0-9][a-z0-9_-]{0,31}$'),
    datacenter  text        NOT NULL CHECK (datacenter ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    location    text        NOT NULL CHECK (octet_length(location) BETWEEN 1 AND 1024 AND location !~ '[[:cntrl:]]'),
    size_bytes  bigint      NOT NULL CHECK (size_bytes >= 0),
    decided_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz,
    result      text        CHECK (result IN ('deleted', 'superseded')),
    CHECK ((deleted_at IS NULL) = (result IS NULL))
);
-- At most one unfinished deletion per placement key; the byte-deletion job
-- is unique by the same key.
CREATE UNIQUE INDEX deletions_unfinished_key_idx ON deletions (digest, backend, datacenter, location) WHERE deleted_at IS NULL;
CREATE INDEX deletions_unfinished_decided_idx ON deletions (decided_at) WHERE deleted_at IS NULL;

COMMENT ON TABLE deletions IS 'Durable record of a collection decision, one per revoked placement: written in the transaction that marks the blob collected, finished by the byte-deletion job. An unfinished row is work still owed to the byte store.';
COMMENT ON COLUMN deletions.id IS 'Surrogate key.';
COMMENT ON COLUMN deletions.digest IS 'The collected digest (a blobs row in state collected when decided).';
COMMENT ON COLUMN deletions.backend IS 'Backend name of the revoked placement.';
COMMENT ON COLUMN deletions.datacenter IS 'Datacenter of the revoked placement.';
COMMENT ON COLUMN deletions.location IS 'Location of the revoked placement inside its backend.';
COMMENT ON COLUMN deletions.size_bytes IS 'Content size recorded on the placement, counted as reclaimed bytes when deleted.';
COMMENT ON COLUMN deletions.decided_at IS 'Database time of the collection decision.';
COMMENT ON COLUMN deletions.deleted_at IS 'Database time the job finished: bytes deleted (missing counts as deleted) or the deletion superseded; NULL while owed.';
COMMENT ON COLUMN deletions.result IS 'deleted (the bytes are gone) or superseded (the placement was re-staged or the digest claimed again before the job ran, so the bytes were kept); NULL while owed.';

-- +goose Down
DROP TABLE deletions;
UPDATE blobs SET state = 'live' WHERE state = 'collected';
ALTER TABLE blobs DROP CONSTRAINT blobs_state_check;
ALTER TABLE blobs ADD CONSTRAINT blobs_state_check CHECK (state IN ('live', 'obliterated'));
