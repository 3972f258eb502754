-- +goose Up
-- A renewal that publications cannot starve.
--
-- A publication fences itself on its partition's lease row, locked until
-- it commits (EnsureBlobUnderLease, EnsureBlobsUnderLease), so that a
-- claim of a higher epoch waits for it and it lands under the epoch it
-- was fenced with (R20; store TestTransferWaitsForFencedPublication).
-- That lock was FOR SHARE, which conflicts with every UPDATE of the row,
-- the owner's own renewal included; and Postgres lets a new share locker
-- join the ones holding a row ahead of a waiting writer. Under a steady
-- stream of publications that overlap without a gap, RenewLease waited
-- behind them (up to 8 s, measured with 16 clients on a loaded machine,
-- docs/performance.md "Issue 28"), missed its self-fence margin, and the
-- home stopped serving its own partition: every upload kept (202).
--
-- The fence now takes FOR KEY SHARE, which conflicts only with writes
-- that change a key column, and this constraint makes epoch a key column
-- (a column of a unique index). So:
--   - a claim or a takeover (AcquireLease, ForceLease: epoch + 1, and an
--     owner changes only with its epoch, leases_guard) changes a key and
--     still waits for every publication fenced under the old epoch;
--   - a renewal (expires_at, renewed_at) and the other writes under the
--     same epoch (FenceLease, FenceLeaseWrite) change no key and do not.
-- (partition_id, epoch) is unique already: partition_id is the primary key.
ALTER TABLE leases ADD CONSTRAINT leases_partition_epoch_key UNIQUE (partition_id, epoch);

COMMENT ON CONSTRAINT leases_partition_epoch_key ON leases IS 'Makes epoch a key column, so that a publication''s fence (FOR KEY SHARE on this row) holds off every epoch change (a claim, a takeover: R20) but not the owner''s renewal (migration 00028).';

-- +goose Down
ALTER TABLE leases DROP CONSTRAINT leases_partition_epoch_key;
