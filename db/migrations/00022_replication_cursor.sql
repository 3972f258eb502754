-- +goose Up
-- Where the replication reconciler's next pass starts (issue 28): it walks
-- live blobs in digest order from here, a bounded batch per pass, and
-- wraps around at the end, so every blob is compared with its policy
-- again and again without any pass growing with the store.
CREATE TABLE replication_cursor (
    id            int         PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    after_digest  text        NOT NULL CHECK (after_digest = '' OR after_digest ~ '^sha256:[0-9a-f]{64}$'),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE replication_cursor IS 'The single row saying where the next replication reconciler pass starts: live blobs are compared with their policy in digest order after after_digest, wrapping around.';
COMMENT ON COLUMN replication_cursor.id IS 'Always 1: there is one cursor.';
COMMENT ON COLUMN replication_cursor.after_digest IS 'The last digest the previous pass compared, or empty to start from the first digest.';
COMMENT ON COLUMN replication_cursor.updated_at IS 'Database time the last pass saved it.';

-- +goose Down
DROP TABLE replication_cursor;
