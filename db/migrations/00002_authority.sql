-- +goose Up
-- The authority runtime's durable state (ZBP-5): the controller's public
-- signing keys, every published partition map and delta, and the lease
-- store. Private keys never enter Postgres (R10, R12); the controller keeps
-- its own state on disk and in these tables, never inside the service it
-- places (R111).

CREATE TABLE map_signing_keys (
    key_id      text        PRIMARY KEY CHECK (key_id ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    alg         text        NOT NULL DEFAULT 'ed25519' CHECK (alg = 'ed25519'),
    public_key  bytea       NOT NULL CHECK (length(public_key) = 32),
    not_before  timestamptz NOT NULL,
    not_after   timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (not_before < not_after)
);

COMMENT ON TABLE map_signing_keys IS 'Public halves of the placement controller''s map-signing keys (ZBP-5 R10-R12). Verifiers accept a key only inside [not_before, not_after); successive keys overlap so rotation never leaves a gap. The private key never enters the database.';
COMMENT ON COLUMN map_signing_keys.key_id IS 'Key id named by signature.key_id in maps and deltas.';
COMMENT ON COLUMN map_signing_keys.alg IS 'Signature algorithm; always ed25519.';
COMMENT ON COLUMN map_signing_keys.public_key IS 'The 32-byte ed25519 public key.';
COMMENT ON COLUMN map_signing_keys.not_before IS 'Start of the validity window (inclusive).';
COMMENT ON COLUMN map_signing_keys.not_after IS 'End of the validity window (exclusive).';
COMMENT ON COLUMN map_signing_keys.created_at IS 'Database time the key was published.';

CREATE TABLE partition_maps (
    version       bigint      PRIMARY KEY CHECK (version >= 1),
    document      text        NOT NULL CHECK (document::jsonb ->> 'map_version' = version::text),
    key_id        text        NOT NULL REFERENCES map_signing_keys (key_id),
    generated_at  timestamptz NOT NULL,
    published_at  timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE partition_maps IS 'Every published partition map version (ZBP-5 R5-R9), kept and addressable so that a client holding an old version can be answered with a delta. Versions strictly increase and are never reused (R6); rows are immutable. Each insert notifies channel blobplane_map with the version.';
COMMENT ON COLUMN partition_maps.version IS 'map_version of the document; strictly greater than every earlier row (enforced by trigger under a lock).';
COMMENT ON COLUMN partition_maps.document IS 'The signed map exactly as served: canonical JSON (RFC 8785) including the signature member.';
COMMENT ON COLUMN partition_maps.key_id IS 'Key that signed the document (signature.key_id).';
COMMENT ON COLUMN partition_maps.generated_at IS 'generated_at of the document (the controller''s record time).';
COMMENT ON COLUMN partition_maps.published_at IS 'Database time the version was published.';

CREATE TABLE map_deltas (
    base_version  bigint      NOT NULL REFERENCES partition_maps (version),
    version       bigint      NOT NULL REFERENCES partition_maps (version),
    document      text        NOT NULL CHECK (document::jsonb ->> 'map_version' = version::text AND document::jsonb ->> 'base_version' = base_version::text),
    key_id        text        NOT NULL REFERENCES map_signing_keys (key_id),
    published_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (base_version, version),
    CHECK (base_version < version)
);

COMMENT ON TABLE map_deltas IS 'Signed deltas between published map versions, each naming its base (ZBP-5 R9, R10). Served to a client presenting base_version; immutable.';
COMMENT ON COLUMN map_deltas.base_version IS 'The map version the delta applies to.';
COMMENT ON COLUMN map_deltas.version IS 'The map version the delta produces.';
COMMENT ON COLUMN map_deltas.document IS 'The signed delta exactly as served: canonical JSON including the signature member.';
COMMENT ON COLUMN map_deltas.key_id IS 'Key that signed the delta (signature.key_id).';
COMMENT ON COLUMN map_deltas.published_at IS 'Database time the delta was published (with its map version).';

-- +goose StatementBegin
CREATE FUNCTION partition_maps_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    latest bigint;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION 'published map versions are immutable and kept (R6, R9): % refused on %', TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF TG_TABLE_NAME = 'partition_maps' THEN
        -- Serialise publishers, then compare with the newest committed
        -- version: a volatile function takes a fresh snapshot per statement,
        -- so the check sees a concurrent publisher's commit once it has the lock.
        PERFORM pg_advisory_xact_lock(hashtext('blobplane_map_publish'));
        SELECT max(version) INTO latest FROM partition_maps;
        IF latest IS NOT NULL AND NEW.version <= latest THEN
            RAISE EXCEPTION 'map version % does not advance past %: versions are never reused (R6)', NEW.version, latest
                USING ERRCODE = 'unique_violation';
        END IF;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION partition_maps_guard() IS 'Refuses a map version that does not exceed every published one (R6), and any UPDATE or DELETE of published maps and deltas (R9).';

CREATE TRIGGER partition_maps_guard BEFORE INSERT OR UPDATE OR DELETE ON partition_maps
    FOR EACH ROW EXECUTE FUNCTION partition_maps_guard();
CREATE TRIGGER map_deltas_guard BEFORE UPDATE OR DELETE ON map_deltas
    FOR EACH ROW EXECUTE FUNCTION partition_maps_guard();

-- +goose StatementBegin
CREATE FUNCTION partition_maps_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('blobplane_map', NEW.version::text);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION partition_maps_notify() IS 'NOTIFY blobplane_map with the new version from the publishing transaction (delivered on commit only).';

CREATE TRIGGER partition_maps_notify AFTER INSERT ON partition_maps
    FOR EACH ROW EXECUTE FUNCTION partition_maps_notify();

-- The lease store (ZBP-5 R14-R28, "The lease record"). Logged on purpose:
-- a lease table that loses rows in a crash resets epochs (R16).
CREATE TABLE leases (
    partition_id        text        PRIMARY KEY CHECK (partition_id <> ''),
    epoch               bigint      NOT NULL CHECK (epoch >= 1),
    owner_node          text        NOT NULL CHECK (owner_node <> ''),
    owner_endpoint      text        NOT NULL CHECK (owner_endpoint <> ''),
    state               text        NOT NULL DEFAULT 'RESTORING' CHECK (state IN ('RESTORING', 'CATCHING_UP', 'SERVING', 'SEALED', 'QUARANTINED')),
    lease_ttl_ms        bigint      NOT NULL CHECK (lease_ttl_ms > 0),
    renew_interval_ms   bigint      NOT NULL CHECK (renew_interval_ms > 0 AND renew_interval_ms < lease_ttl_ms),
    expires_at          timestamptz NOT NULL,
    renewed_at          timestamptz NOT NULL DEFAULT now(),
    checkpoint_pointer  text,
    sealed_lsn          bigint      CHECK (sealed_lsn >= 0),
    taken_by            text,
    taken_reason        text,
    taken_at            timestamptz,
    CHECK ((taken_by IS NULL) = (taken_at IS NULL) AND (taken_by IS NULL) = (taken_reason IS NULL)),
    CHECK (taken_by IS NULL OR (taken_by <> '' AND taken_reason <> ''))
);

COMMENT ON TABLE leases IS 'The lease store: one record per partition holding ownership, the fencing epoch and the checkpoint pointer together (ZBP-5 R14-R28). Written only by ACQUIRE, RENEW, FENCE and FORCE, each one conditional statement on the database clock. Epochs never decrease and ownership never changes without an epoch increase (trigger); rows are never deleted.';
COMMENT ON COLUMN leases.partition_id IS 'Opaque partition id from the map (R13).';
COMMENT ON COLUMN leases.epoch IS 'Fencing token: incremented by the statement that claims the lease (R15); never decreases or is reused (R16).';
COMMENT ON COLUMN leases.owner_node IS 'Node id of the lease holder (R14).';
COMMENT ON COLUMN leases.owner_endpoint IS 'Endpoint (host:port) the holder serves on.';
COMMENT ON COLUMN leases.state IS 'Primary state: RESTORING on claim; holding the lease and being ready are distinct (R23).';
COMMENT ON COLUMN leases.lease_ttl_ms IS 'Lease TTL in milliseconds: each claim or renewal sets expires_at = now() + ttl (R14).';
COMMENT ON COLUMN leases.renew_interval_ms IS 'Renewal interval in milliseconds (R14), shorter than the TTL.';
COMMENT ON COLUMN leases.expires_at IS 'Database time the lease expires; compared only with the database clock, never a node''s (R17).';
COMMENT ON COLUMN leases.renewed_at IS 'Database time of the last claim or renewal: the store''s acknowledgement time.';
COMMENT ON COLUMN leases.checkpoint_pointer IS 'Key of the partition''s current checkpoint manifest (R22); NULL until the first checkpoint. Moves only under the epoch.';
COMMENT ON COLUMN leases.sealed_lsn IS 'LSN at which the outgoing primary sealed the partition during a handoff (R74); NULL unless sealed.';
COMMENT ON COLUMN leases.taken_by IS 'Operator of the last force-takeover (R28); NULL when none.';
COMMENT ON COLUMN leases.taken_reason IS 'Stated reason of the last force-takeover (R28).';
COMMENT ON COLUMN leases.taken_at IS 'Database time of the last force-takeover (R28).';

-- +goose StatementBegin
CREATE FUNCTION leases_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'lease %: lease records are never deleted (a new record would reset the epoch, R16)', OLD.partition_id
            USING ERRCODE = 'BPE01';
    END IF;
    IF NEW.partition_id <> OLD.partition_id THEN
        RAISE EXCEPTION 'lease %: the partition id of a lease record never changes', OLD.partition_id
            USING ERRCODE = 'BPE01';
    END IF;
    IF NEW.epoch < OLD.epoch THEN
        RAISE EXCEPTION 'lease %: epoch % would decrease to % (R16)', OLD.partition_id, OLD.epoch, NEW.epoch
            USING ERRCODE = 'BPE01';
    END IF;
    IF NEW.owner_node <> OLD.owner_node AND NEW.epoch <= OLD.epoch THEN
        RAISE EXCEPTION 'lease %: owner % would become % without an epoch increase (R27)', OLD.partition_id, OLD.owner_node, NEW.owner_node
            USING ERRCODE = 'BPE01';
    END IF;
    -- R74: after the seal the outgoing primary never serves again, and it
    -- seals once; only a new epoch moves the partition forward.
    IF NEW.epoch = OLD.epoch AND OLD.state = 'SEALED' AND NEW.state <> 'SEALED' THEN
        RAISE EXCEPTION 'lease %: sealed at epoch %, cannot become % (R74)', OLD.partition_id, OLD.epoch, NEW.state
            USING ERRCODE = 'BPS01';
    END IF;
    IF NEW.epoch = OLD.epoch AND OLD.sealed_lsn IS NOT NULL AND NEW.sealed_lsn IS DISTINCT FROM OLD.sealed_lsn THEN
        RAISE EXCEPTION 'lease %: already sealed at LSN % under epoch % (R74)', OLD.partition_id, OLD.sealed_lsn, OLD.epoch
            USING ERRCODE = 'BPS01';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION leases_guard() IS 'Refuses any lease write that decreases an epoch (R16), changes the owner without raising the epoch (R27), renames a partition or deletes a record (SQLSTATE BPE01), and un-seals or re-seals under the same epoch (R74, SQLSTATE BPS01).';

CREATE TRIGGER leases_guard BEFORE UPDATE OR DELETE ON leases
    FOR EACH ROW EXECUTE FUNCTION leases_guard();

-- +goose Down
DROP TABLE leases;
DROP FUNCTION leases_guard();
DROP TABLE map_deltas;
DROP TABLE partition_maps;
DROP FUNCTION partition_maps_notify();
DROP FUNCTION partition_maps_guard();
DROP TABLE map_signing_keys;
