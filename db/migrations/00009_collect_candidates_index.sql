-- +goose NO TRANSACTION
-- +goose Up
-- The collector's candidate scan walks live blob rows in digest order
-- (LockCollectCandidates). Without this index every pass also stepped over
-- every row it had already collected, so passes got slower as collected
-- rows accumulated (quadratic over a backlog: measured at 1M rows).
-- CONCURRENTLY: building it does not block publications on a large table.
CREATE INDEX CONCURRENTLY IF NOT EXISTS blobs_live_digest_idx ON blobs (digest) WHERE state = 'live';
COMMENT ON INDEX blobs_live_digest_idx IS 'Live blob rows in digest order: the collector''s candidate scan, which skips collected and obliterated rows without visiting them.';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS blobs_live_digest_idx;
