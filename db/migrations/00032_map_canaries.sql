-- +goose Up
-- Staged map publication (issue 30; ZBP-5 R120–R122): a map version may be
-- published as a canary, adopted only by the nodes named here until the
-- controller, having observed them against the stated outcome, promotes
-- it to everyone or withdraws it (a newer version with the previous
-- content follows). A version with no row here is everyone's.
CREATE TABLE map_canaries (
    version          bigint      PRIMARY KEY REFERENCES partition_maps (version),
    nodes            text[]      NOT NULL CHECK (cardinality(nodes) > 0),
    state            text        NOT NULL DEFAULT 'canary' CHECK (state IN ('canary', 'promoted', 'withdrawn')),
    max_error_ratio  float8      NOT NULL CHECK (max_error_ratio >= 0 AND max_error_ratio <= 1),
    window_ms        bigint      NOT NULL CHECK (window_ms > 0),
    started_at       timestamptz NOT NULL DEFAULT now(),
    decided_at       timestamptz,
    decision         text,
    CHECK ((state = 'canary') = (decided_at IS NULL))
);

COMMENT ON TABLE map_canaries IS 'Map versions published as canaries (ZBP-5 R120-R122): adopted only by nodes until promoted; a withdrawn one is followed by a newer version with the previous content. Notifies blobplane_map on promotion and withdrawal.';
COMMENT ON COLUMN map_canaries.version IS 'The canary map version.';
COMMENT ON COLUMN map_canaries.nodes IS 'The api nodes that adopt it while it is a canary.';
COMMENT ON COLUMN map_canaries.state IS 'canary (only nodes adopt it), promoted (everyone), withdrawn (nobody; superseded).';
COMMENT ON COLUMN map_canaries.max_error_ratio IS 'The stated outcome: most 5xx answers per request on the canary nodes during the window (R121).';
COMMENT ON COLUMN map_canaries.window_ms IS 'How long the canary nodes are observed after they adopted it.';
COMMENT ON COLUMN map_canaries.started_at IS 'Database time the canary was published.';
COMMENT ON COLUMN map_canaries.decided_at IS 'Database time it was promoted or withdrawn.';
COMMENT ON COLUMN map_canaries.decision IS 'What was observed, and why it was promoted or withdrawn.';

-- +goose StatementBegin
CREATE FUNCTION map_canaries_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        PERFORM pg_notify('blobplane_map', NEW.version::text);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION map_canaries_notify() IS 'NOTIFY blobplane_map when a canary is promoted or withdrawn: every node refreshes its map at once.';

CREATE TRIGGER map_canaries_notify AFTER UPDATE ON map_canaries
    FOR EACH ROW EXECUTE FUNCTION map_canaries_notify();

-- +goose Down
DROP TRIGGER map_canaries_notify ON map_canaries;
DROP FUNCTION map_canaries_notify();
DROP TABLE map_canaries;
