-- +goose Up
-- Where the next collection pass starts (store.CollectUnreferenced). A pass
-- walks live blob rows in digest order from here to the end, then wraps
-- around to here; a pass cut short by its batch limit leaves the cursor at
-- its last candidate. Without it every pass began at the first digest and
-- stepped over every referenced row before it again: over a backlog of
-- 1M candidates, quadratic. Concurrent collectors may share the cursor
-- (SKIP LOCKED keeps their decisions apart); a lost update only makes a
-- pass look again at rows another one passed.

CREATE TABLE collector_cursor (
    id            int         PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    after_digest  text        NOT NULL CHECK (after_digest = '' OR after_digest ~ '^sha256:[0-9a-f]{64}$'),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE collector_cursor IS 'The single row saying where the next collection pass starts: candidates are scanned in digest order after after_digest, wrapping around.';
COMMENT ON COLUMN collector_cursor.id IS 'Always 1: there is one cursor.';
COMMENT ON COLUMN collector_cursor.after_digest IS 'The last digest the previous pass examined, or empty to start from the first digest.';
COMMENT ON COLUMN collector_cursor.updated_at IS 'Database time the last pass saved it.';

-- +goose Down
DROP TABLE collector_cursor;
