-- +goose Up
-- Closed, never published (issue 7, L1): an upload claims its digest on
-- its intent before any byte lands at the digest's key, and when such an
-- intent is abandoned its verified bytes are handed back to the collector
-- through the blob state row (store.handBack). Only comments change.

COMMENT ON TABLE blobs IS 'The blob state row: one per digest that was published, or whose verified bytes an abandoned upload left behind (handed back to the collector, so state live with no reference); its existence, collection and obliteration state, never its representation (which travels on the object, ADR-00018). Publication never clears an obliteration mark. Sized only from verified content.';
COMMENT ON COLUMN intents.expected_digest IS 'Content digest the upload claims: known at creation for a monolithic upload or a mount, recorded at close (before the bytes are promoted to the digest''s key) otherwise; NULL until then. While pending, the intent claims this digest for the collector (S6). Finalization publishes only this digest.';

-- +goose Down
COMMENT ON TABLE blobs IS 'The blob state row: one per published digest, its existence and obliteration state, never its representation (which travels on the object, ADR-00018). Publication never clears an obliteration mark.';
COMMENT ON COLUMN intents.expected_digest IS 'Content digest the upload claims: known at creation for a monolithic upload, recorded at close otherwise; NULL until then. Finalization publishes only this digest.';
