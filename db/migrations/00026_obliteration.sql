-- +goose Up
-- Obliteration by an operator (issue 29, docs/obliteration.md; ADR-00018
-- "obliteration ordering is load-bearing": the mark is taken before any
-- reference is removed).
--
-- The mark is blobs.state = 'obliterated' (00005 reserved it; nothing set
-- it before). POST /v1/admin/blobs/{digest}/obliterate (or `api blob
-- obliterate`) takes it, records who, when and why here, removes every
-- reference and inserts the River job `obliterate` in ONE transaction; the
-- job then abandons the uploads claiming the digest, revokes every
-- placement, records one deletion per placement and enqueues the
-- per-datacenter delete_bytes jobs (00007's machinery), each step its own
-- idempotent transaction. While the mark holds, no upload, mount or
-- publication of the digest succeeds: the claims refuse it in their own
-- statements (db/queries/uploads.sql) and Finalize refuses it on the blob
-- row it locks. DELETE .../obliterate (`api blob unmark`) lifts the mark,
-- recorded here as well.
--
-- This table is the audit trail a DBA queries: append-only (Blobplane
-- never updates a row except to set finished_at once, never deletes one).

CREATE TABLE blob_obliterations (
    id           bigint         GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    digest       sha256_digest  NOT NULL,
    action       text           NOT NULL CHECK (action IN ('obliterate', 'unmark')),
    principal    principal_name NOT NULL,
    reason       text           NOT NULL CHECK (octet_length(reason) BETWEEN 1 AND 1024 AND reason !~ '[[:cntrl:]]' AND btrim(reason) <> ''),
    at           timestamptz    NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    CHECK (action = 'obliterate' OR finished_at IS NULL),
    CHECK (finished_at IS NULL OR finished_at >= at)
);
-- The history of one digest, newest first; the current mark is the newest
-- row when the blob row is obliterated.
CREATE INDEX blob_obliterations_digest_idx ON blob_obliterations (digest, id DESC);
-- Obliterations whose job has not finished yet (docs/obliteration.md).
CREATE INDEX blob_obliterations_unfinished_idx ON blob_obliterations (at) WHERE action = 'obliterate' AND finished_at IS NULL;

COMMENT ON TABLE blob_obliterations IS 'Audit trail of obliterations and unmarks (issue 29, docs/obliteration.md): one row per action, who, when and why; append-only. The current mark of an obliterated digest (blobs.state = obliterated) is its newest row, with action obliterate.';
COMMENT ON COLUMN blob_obliterations.id IS 'Surrogate key, ascending in commit order per digest; the obliterate job names the mark it finishes by this id.';
COMMENT ON COLUMN blob_obliterations.digest IS 'The digest obliterated or unmarked (a blobs row).';
COMMENT ON COLUMN blob_obliterations.action IS 'obliterate (the mark was taken: references removed, the obliterate job enqueued) or unmark (the mark was lifted: the digest may be uploaded again).';
COMMENT ON COLUMN blob_obliterations.principal IS 'Who: the admin API caller''s principal, or the CLI''s --by.';
COMMENT ON COLUMN blob_obliterations.reason IS 'Why, as the operator wrote it (1 to 1024 bytes, no control characters). Never shown to uploaders.';
COMMENT ON COLUMN blob_obliterations.at IS 'When: database time of the committing transaction.';
COMMENT ON COLUMN blob_obliterations.finished_at IS 'For an obliterate row: database time the obliterate job found nothing left to do (no reference, no pending upload, every placement revoked, its deletions recorded and enqueued); NULL while it runs, and always for unmark rows. The bytes themselves are deleted by delete_bytes jobs (table deletions).';

COMMENT ON COLUMN blobs.state IS 'live; collected (no reference and no claim was left: its placements are revoked and its bytes deleted or being deleted; a publication is refused retryably until a placement verifies again, then revives it); or obliterated by an operator (blob_obliterations: no repository may upload, mount, publish or serve it; unmarking makes it collected, or live while a placement is left unrevoked).';

-- +goose Down
COMMENT ON COLUMN blobs.state IS 'live; collected (no reference and no claim was left: its placements are revoked and its bytes deleted or being deleted; a publication is refused retryably until a placement verifies again, then revives it); or obliterated by an operator (then no repository may publish or serve it).';
DROP TABLE blob_obliterations;
