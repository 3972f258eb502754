package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/journal"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// The tail of each partition's journal (issue 33, migration 00038,
// docs/adr/0009-quotas-as-partition-state.md): records are appended in
// the transaction that makes the change they record, at dense, gapless
// LSNs (ZBP-5-R35), fenced on the epoch the head row holds.

// JournalHead is where a partition's journal stands.
type JournalHead struct {
	Generation int64
	Epoch      uint64 // the epoch allowed to append
	NextLSN    uint64 // the LSN the next record gets
}

// FenceJournal makes the journal of partition appendable at epoch, which
// the caller has just claimed (its lease record holds epoch): the head's
// epoch moves up to it, waiting for an append in flight at an older epoch
// to finish, so every record of the displaced primary is committed and
// readable once it returns, and any later append of theirs changes no
// row. It returns the head. Errors: stale_epoch (the lease record does not
// hold epoch, or the head is already past it), unavailable.
func (s *Store) FenceJournal(ctx context.Context, partition string, epoch uint64) (JournalHead, error) {
	const op = "fence journal"
	if partition == "" || epoch == 0 {
		return JournalHead{}, blobplane.Errorf(blobplane.CodeInvalid, "%s: partition and epoch are required", op)
	}
	row, err := s.q.FenceJournal(ctx, s.pool, dbsqlc.FenceJournalParams{PartitionID: partition, Epoch: int64(epoch)})
	if errors.Is(err, pgx.ErrNoRows) {
		cause := fmt.Errorf("the journal of %s cannot be taken at epoch %d: the lease is not at it, or the journal is past it: %w", partition, epoch, authority.ErrStaleEpoch)
		return JournalHead{}, &blobplane.Error{Code: blobplane.CodeStaleEpoch, Op: op, Message: cause.Error(), Err: cause}
	}
	if err != nil {
		return JournalHead{}, dbErr(op, err)
	}
	return JournalHead{Generation: row.Generation, Epoch: epoch, NextLSN: uint64(row.NextLsn)}, nil
}

// JournalAppend is one record to append: its type (journal.Apply unless
// a MARK or SEAL), its slot and its payload.
type JournalAppend struct {
	Type    journal.Type
	Slot    uint32
	Payload []byte
}

// AppendJournalTx appends recs to partition's journal in tx at epoch, in
// order, and returns the generation and the LSN of the first. The head's
// row lock is held until tx ends: appends of one partition commit in LSN
// order, and a rollback returns its LSNs. Errors: invalid, stale_epoch
// (another epoch holds the journal), unavailable.
func (s *Store) AppendJournalTx(ctx context.Context, tx pgx.Tx, partition string, epoch uint64, recs []JournalAppend) (generation int64, first uint64, err error) {
	const op = "append journal"
	if partition == "" || epoch == 0 || len(recs) == 0 {
		return 0, 0, blobplane.Errorf(blobplane.CodeInvalid, "%s: partition, epoch and at least one record are required", op)
	}
	arg := dbsqlc.AppendJournalParams{PartitionID: partition, Epoch: int64(epoch)}
	for _, r := range recs {
		if r.Type < journal.Apply || r.Type > journal.Seal || (r.Type != journal.Apply && len(r.Payload) > 0) || len(r.Payload) > journal.MaxFrame/2 {
			return 0, 0, blobplane.Errorf(blobplane.CodeInvalid, "%s: a %s record with %d payload bytes", op, r.Type, len(r.Payload))
		}
		arg.Types = append(arg.Types, int16(r.Type))
		arg.Slots = append(arg.Slots, int32(r.Slot))
		arg.Payloads = append(arg.Payloads, r.Payload)
	}
	rows, err := s.q.AppendJournal(ctx, tx, arg)
	if err != nil {
		return 0, 0, dbErr(op, err)
	}
	if len(rows) == 0 {
		cause := fmt.Errorf("%s's journal is not appendable at epoch %d: %w", partition, epoch, authority.ErrStaleEpoch)
		return 0, 0, &blobplane.Error{Code: blobplane.CodeStaleEpoch, Op: op, Message: cause.Error(), Err: cause}
	}
	first = uint64(rows[0].Lsn)
	for _, r := range rows {
		first = min(first, uint64(r.Lsn))
	}
	return rows[0].Generation, first, nil
}

// ReadJournal returns up to limit records of partition's generation after
// LSN after, in LSN order, as journal records (their Marks empty:
// Blobplane's partitions consume no input stream). Errors: unavailable.
func (s *Store) ReadJournal(ctx context.Context, partition string, generation int64, after uint64, limit int) ([]journal.Record, error) {
	rows, err := s.q.ReadJournal(ctx, s.pool, dbsqlc.ReadJournalParams{PartitionID: partition, Generation: generation, AfterLsn: int64(after), MaxRows: int32(min(max(limit, 1), 1<<20))})
	if err != nil {
		return nil, dbErr("read journal", err)
	}
	out := make([]journal.Record, len(rows))
	for i, r := range rows {
		out[i] = journal.Record{Type: journal.Type(r.RecordType), LSN: uint64(r.Lsn), Epoch: uint64(r.Epoch), Slot: uint32(r.Slot)}
		if len(r.Payload) > 0 {
			out[i].Payload = r.Payload
		}
	}
	return out, nil
}

// JournalHeadOf reads partition's journal head. Errors: not_found (no
// primary ever fenced it), unavailable.
func (s *Store) JournalHeadOf(ctx context.Context, partition string) (JournalHead, error) {
	r, err := s.q.JournalHead(ctx, s.pool, partition)
	if err != nil {
		return JournalHead{}, dbErr("journal head", err)
	}
	return JournalHead{Generation: r.Generation, Epoch: uint64(r.Epoch), NextLSN: uint64(r.NextLsn)}, nil
}
