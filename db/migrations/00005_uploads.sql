-- +goose Up
-- Admission and publication (DESIGN flows 1-2, ../shared/spec/
-- finalizing-admitted-content.md, publication-across-two-stores.md).
--
-- An intent is committed before any byte is staged, so every staged key is
-- claimed by a row the sweeper can see. Publication and abandonment are both
-- decided on that row under FOR UPDATE, so they are mutually exclusive (S5).
-- A publication writes blob_references, blobs, the replication jobs, the
-- operation outcome and the intent transition in one transaction.

CREATE TABLE intents (
    operation_id        uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    repository          text        NOT NULL REFERENCES repositories (name),
    principal           text        NOT NULL CHECK (principal ~ '^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$'),
    expected_digest     text        CHECK (expected_digest ~ '^sha256:[0-9a-f]{64}$'),
    expected_size       bigint      CHECK (expected_size >= 0),
    ingress_datacenter  text        NOT NULL CHECK (ingress_datacenter ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    backend             text        NOT NULL CHECK (backend ~ '^[a-z0-9][a-z0-9_-]{0,31}$'),
    staged_location     text        CHECK (octet_length(staged_location) BETWEEN 1 AND 1024 AND staged_location !~ '[[:cntrl:]]'),
    state               text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'admitted', 'abandoned')),
    received_bytes      bigint      NOT NULL DEFAULT 0 CHECK (received_bytes >= 0),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz NOT NULL,
    CHECK (expires_at > created_at)
);
-- The sweeper claims expired pending intents oldest first.
CREATE INDEX intents_pending_expiry_idx ON intents (expires_at) WHERE state = 'pending';
-- Ownership for sweeps of content-addressed keys: an unfinished intent
-- naming a digest claims its bytes (S6).
CREATE INDEX intents_pending_digest_idx ON intents (expected_digest) WHERE state = 'pending' AND expected_digest IS NOT NULL;

COMMENT ON TABLE intents IS 'One upload/admission attempt (an OCI upload session), keyed by its operation id. Committed before any byte is staged, so every staged key is claimed. Terminal states admitted and abandoned are mutually exclusive and decided on this row under FOR UPDATE (S5).';
COMMENT ON COLUMN intents.operation_id IS 'Operation id: the upload session id clients see and the idempotency key of finalization (operation_outcomes.operation_id).';
COMMENT ON COLUMN intents.repository IS 'Repository the upload publishes into.';
COMMENT ON COLUMN intents.principal IS 'Principal that opened the upload; finalization re-checks that it still has write access to the repository.';
COMMENT ON COLUMN intents.expected_digest IS 'Content digest the upload claims: known at creation for a monolithic upload, recorded at close otherwise; NULL until then. Finalization publishes only this digest.';
COMMENT ON COLUMN intents.expected_size IS 'Content size in bytes the upload claims, with expected_digest; NULL until known.';
COMMENT ON COLUMN intents.ingress_datacenter IS 'Datacenter whose node accepted the bytes.';
COMMENT ON COLUMN intents.backend IS 'Name of the ingress datacenter''s byte backend holding the staged bytes.';
COMMENT ON COLUMN intents.staged_location IS 'The backend''s staged upload id; NULL until staging starts (always after this row commits).';
COMMENT ON COLUMN intents.state IS 'pending (accepting bytes or awaiting finalization), admitted (published; terminal) or abandoned (cancelled or reaped; terminal, never publishes).';
COMMENT ON COLUMN intents.received_bytes IS 'Bytes staged so far, as of the last chunk.';
COMMENT ON COLUMN intents.created_at IS 'Database time the intent was created.';
COMMENT ON COLUMN intents.updated_at IS 'Database time of the last change (chunk, close, transition).';
COMMENT ON COLUMN intents.expires_at IS 'Database time after which a pending intent may be reaped: now() + TTL, moved forward by every chunk. Expiry permits reclamation; it does not prove the writer gone.';

CREATE TABLE blobs (
    digest      text        PRIMARY KEY CHECK (digest ~ '^sha256:[0-9a-f]{64}$'),
    size_bytes  bigint      NOT NULL CHECK (size_bytes >= 0),
    state       text        NOT NULL DEFAULT 'live' CHECK (state IN ('live', 'obliterated')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE blobs IS 'The blob state row: one per published digest, its existence and obliteration state, never its representation (which travels on the object, ADR-00018). Publication never clears an obliteration mark.';
COMMENT ON COLUMN blobs.digest IS 'Canonical content digest sha256:<64 lowercase hex>.';
COMMENT ON COLUMN blobs.size_bytes IS 'Content size in bytes (of the decoded content).';
COMMENT ON COLUMN blobs.state IS 'live, or obliterated by an operator (then no repository may publish or serve it).';
COMMENT ON COLUMN blobs.created_at IS 'Database time of the first publication of the digest.';
COMMENT ON COLUMN blobs.updated_at IS 'Database time of the last state change.';

-- "references" is an SQL reserved word; blob_references spares every query
-- the quoting.
CREATE TABLE blob_references (
    repository    text        NOT NULL REFERENCES repositories (name),
    digest        text        NOT NULL REFERENCES blobs (digest),
    created_at    timestamptz NOT NULL DEFAULT now(),
    operation_id  uuid        NOT NULL,
    PRIMARY KEY (repository, digest)
);
-- Refcount for sweeps: every reference to a digest.
CREATE INDEX blob_references_digest_idx ON blob_references (digest);

COMMENT ON TABLE blob_references IS 'References: repository R publishes digest D, which makes the blob visible to R''s readers. Written only by finalization (S1, S8).';
COMMENT ON COLUMN blob_references.repository IS 'The publishing repository.';
COMMENT ON COLUMN blob_references.digest IS 'The published digest (a blobs row).';
COMMENT ON COLUMN blob_references.created_at IS 'Database time of the publication.';
COMMENT ON COLUMN blob_references.operation_id IS 'Operation id of the finalization that created the reference.';

CREATE TABLE operation_outcomes (
    operation_id  uuid        PRIMARY KEY REFERENCES intents (operation_id),
    repository    text        NOT NULL REFERENCES repositories (name),
    digest        text        NOT NULL REFERENCES blobs (digest),
    size_bytes    bigint      NOT NULL CHECK (size_bytes >= 0),
    published_at  timestamptz NOT NULL DEFAULT now(),
    result        jsonb       NOT NULL CHECK (jsonb_typeof(result) = 'object')
);

COMMENT ON TABLE operation_outcomes IS 'The stored acknowledgement of each successful publication, keyed by operation id: a retry returns it instead of publishing again (S4). A refusal stores nothing.';
COMMENT ON COLUMN operation_outcomes.operation_id IS 'The admission operation id (intents.operation_id).';
COMMENT ON COLUMN operation_outcomes.repository IS 'Repository published into.';
COMMENT ON COLUMN operation_outcomes.digest IS 'Digest published.';
COMMENT ON COLUMN operation_outcomes.size_bytes IS 'Content size published, in bytes.';
COMMENT ON COLUMN operation_outcomes.published_at IS 'Database time of the publishing transaction.';
COMMENT ON COLUMN operation_outcomes.result IS 'The acknowledgement as returned to clients: authority partition and epoch, whether the reference was new, replication targets enqueued.';

-- +goose Down
DROP TABLE operation_outcomes;
DROP TABLE blob_references;
DROP TABLE blobs;
DROP TABLE intents;
