package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/journal"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// The tail of each partition's journal (issue 33, migration 00038,
// docs/adr/0009-quotas-as-partition-state.md). A record is inserted in the
// transaction that makes the change it records, without an LSN and without
// any lock that concurrent appenders wait for; the partition's primary then
// gives the committed records dense, gapless LSNs (ZBP-5-R35) in the order
// they became visible (SequenceJournal). No lock is held across a commit,
// so a partition's publications keep sharing WAL flushes (the alternative,
// an LSN taken under the head row's lock, cost 85 % of sixteen writers'
// commits: ADR 0009, "Measured").

// JournalHead is where a partition's journal stands.
type JournalHead struct {
	Generation int64
	Epoch      uint64 // the epoch allowed to append
	NextLSN    uint64 // the LSN the next record gets
}

// FenceJournal makes partition's journal sequenceable at epoch, which the
// caller has just claimed (its lease record holds epoch), with the
// partition's slots (inclusive ranges at slotBits): the head's epoch moves
// up to it. A displaced primary's appends took the lease row's key share
// lock, so the claim waited for them: they are all committed (or rolled
// back) by now, and the next SequenceJournal numbers them.
//
// The first fence of a partition creates its journal. It waits for every
// transaction writing references and holds new ones back (a SHARE lock on
// blob_references) while it journals each repository of its slots with
// the usage the ledger holds, so that those counts and the records the
// trigger writes from then on cover each reference once (ADR 0009 item
// 11). Errors: invalid, stale_epoch (the lease record does not hold epoch,
// or the head is already past it), unavailable.
func (s *Store) FenceJournal(ctx context.Context, partition string, epoch uint64, slotBits int, ranges []authority.SlotRange) (JournalHead, error) {
	const op = "fence journal"
	return s.journalAtEpoch(ctx, op, partition, epoch, slotBits, ranges, func(tx pgx.Tx, slots string, head *JournalHead) error {
		moved, err := s.q.MoveJournalHead(ctx, tx, dbsqlc.MoveJournalHeadParams{Epoch: int64(epoch), SlotBits: int32(slotBits), Slots: slots, PartitionID: partition})
		if err == nil {
			*head = JournalHead{Generation: moved.Generation, Epoch: epoch, NextLSN: uint64(moved.NextLsn)}
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if found, err := s.q.JournalHeadExists(ctx, tx, partition); err != nil || found {
			if found {
				return staleJournal(op, partition, epoch) // a newer epoch holds it
			}
			return err
		}
		if err := s.q.LockReferencesForBootstrap(ctx, tx); err != nil {
			return err
		}
		created, err := s.q.CreateJournalHead(ctx, tx, dbsqlc.CreateJournalHeadParams{PartitionID: partition, Epoch: int64(epoch), SlotBits: int32(slotBits), Slots: slots})
		if errors.Is(err, pgx.ErrNoRows) { // another fence created it meanwhile
			return &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Retryable: true, Message: fmt.Sprintf("the journal of %s was created concurrently: fence again", partition)}
		}
		if err != nil {
			return err
		}
		if _, err := s.q.RetireOverlappingHeads(ctx, tx, dbsqlc.RetireOverlappingHeadsParams{PartitionID: partition, Slots: slots}); err != nil {
			return err
		}
		if err := s.bootstrapJournal(ctx, tx, partition, epoch, slotBits, slots); err != nil {
			return err
		}
		*head = JournalHead{Generation: created.Generation, Epoch: epoch, NextLSN: uint64(created.NextLsn)}
		return nil
	})
}

// bootstrapJournal journals, under the SHARE locks of
// LockReferencesForBootstrap, each repository of slots with the usage the
// ledger holds and the quota the table holds (ADR 0009 item 11).
func (s *Store) bootstrapJournal(ctx context.Context, tx pgx.Tx, partition string, epoch uint64, slotBits int, slots string) error {
	n, err := s.q.JournalBootstrap(ctx, tx, dbsqlc.JournalBootstrapParams{PartitionID: partition, Epoch: int64(epoch), SlotBits: int32(slotBits), Slots: slots})
	if err != nil {
		return err
	}
	q, err := s.q.JournalBootstrapQuotas(ctx, tx, dbsqlc.JournalBootstrapQuotasParams{PartitionID: partition, Epoch: int64(epoch), SlotBits: int32(slotBits), Slots: slots})
	if err != nil {
		return err
	}
	s.logger.InfoContext(ctx, "journal bootstrapped: each repository's usage and quota recorded from the ledger", "partition", partition, "epoch", epoch, "repositories", n, "quotas", q)
	return nil
}

// RestartJournal starts a new generation of partition's journal at epoch
// (held by the caller's lease), from the ledger: every record of earlier
// generations and every unsequenced one is dropped, and the new
// generation opens with each repository's usage and quota as the ledger
// holds them, under the same SHARE locks as a journal's creation. A home
// restarts a journal whose history it cannot read (a segment or
// checkpoint in another datacenter's archive, or lost): the ledger is the
// source of truth, and the journal is derived from it (ADR 0009). Errors:
// as FenceJournal's.
func (s *Store) RestartJournal(ctx context.Context, partition string, epoch uint64, slotBits int, ranges []authority.SlotRange) (JournalHead, error) {
	const op = "restart journal"
	return s.journalAtEpoch(ctx, op, partition, epoch, slotBits, ranges, func(tx pgx.Tx, slots string, head *JournalHead) error {
		if err := s.q.LockReferencesForBootstrap(ctx, tx); err != nil {
			return err
		}
		h, err := s.q.RestartJournalHead(ctx, tx, dbsqlc.RestartJournalHeadParams{Epoch: int64(epoch), SlotBits: int32(slotBits), Slots: slots, PartitionID: partition})
		if errors.Is(err, pgx.ErrNoRows) {
			return staleJournal(op, partition, epoch)
		}
		if err != nil {
			return err
		}
		if _, err := s.q.DropJournalRecords(ctx, tx, dbsqlc.DropJournalRecordsParams{PartitionID: partition, Generation: h.Generation}); err != nil {
			return err
		}
		if err := s.bootstrapJournal(ctx, tx, partition, epoch, slotBits, slots); err != nil {
			return err
		}
		*head = JournalHead{Generation: h.Generation, Epoch: epoch, NextLSN: uint64(h.NextLsn)}
		return nil
	})
}

// journalAtEpoch runs fn in a transaction that holds partition's lease
// record at epoch (key share: a claim of a higher epoch waits for it),
// with ranges rendered as a multirange. Errors: invalid, stale_epoch
// (the lease record does not hold epoch), fn's, unavailable.
func (s *Store) journalAtEpoch(ctx context.Context, op, partition string, epoch uint64, slotBits int, ranges []authority.SlotRange, fn func(tx pgx.Tx, slots string, head *JournalHead) error) (JournalHead, error) {
	if partition == "" || epoch == 0 || !authority.ValidSlotBits(slotBits) || len(ranges) == 0 {
		return JournalHead{}, blobplane.Errorf(blobplane.CodeInvalid, "%s: partition, epoch, slot bits and slot ranges are required", op)
	}
	slots, err := multirange(ranges, slotBits)
	if err != nil {
		return JournalHead{}, err
	}
	var head JournalHead
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := s.q.LeaseAtEpoch(ctx, tx, dbsqlc.LeaseAtEpochParams{PartitionID: partition, Epoch: int64(epoch)}); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return staleJournal(op, partition, epoch)
			}
			return err
		}
		return fn(tx, slots, &head)
	})
	if err != nil {
		var be *blobplane.Error
		if errors.As(err, &be) {
			return JournalHead{}, err
		}
		return JournalHead{}, dbErr(op, err)
	}
	return head, nil
}

// multirange renders inclusive slot ranges as a Postgres int4multirange.
func multirange(ranges []authority.SlotRange, slotBits int) (string, error) {
	parts := make([]string, len(ranges))
	for i, r := range ranges {
		if r.Low > r.High || r.High > authority.MaxSlot(slotBits) {
			return "", blobplane.Errorf(blobplane.CodeInvalid, "slot range [%d, %d] at %d bits", r.Low, r.High, slotBits)
		}
		parts[i] = fmt.Sprintf("[%d,%d)", r.Low, uint64(r.High)+1)
	}
	return "{" + strings.Join(parts, ",") + "}", nil
}

func staleJournal(op, partition string, epoch uint64) error {
	cause := fmt.Errorf("the journal of %s is not at epoch %d: %w", partition, epoch, authority.ErrStaleEpoch)
	return &blobplane.Error{Code: blobplane.CodeStaleEpoch, Op: op, Message: cause.Error(), Err: cause}
}

// JournalAppend is one record to append: its type (journal.Apply unless
// a MARK or SEAL), its slot and its payload.
type JournalAppend struct {
	Type    journal.Type
	Slot    uint32
	Payload []byte
}

// AppendJournalTx inserts recs into partition's journal in tx, in order,
// while the lease record holds epoch (key-share-locked to the end of tx,
// as a publication's fence is: a claim of a higher epoch waits for tx),
// and returns their append ids. They have no LSN until the primary
// sequences them after tx commits. Errors: invalid, stale_epoch (the
// lease moved on), unavailable.
func (s *Store) AppendJournalTx(ctx context.Context, tx pgx.Tx, partition string, epoch uint64, recs []JournalAppend) ([]int64, error) {
	const op = "append journal"
	if partition == "" || epoch == 0 || len(recs) == 0 {
		return nil, blobplane.Errorf(blobplane.CodeInvalid, "%s: partition, epoch and at least one record are required", op)
	}
	arg := dbsqlc.AppendJournalParams{PartitionID: partition, Epoch: int64(epoch)}
	for _, r := range recs {
		if r.Type < journal.Apply || r.Type > journal.Seal || (r.Type != journal.Apply && len(r.Payload) > 0) || len(r.Payload) > journal.MaxFrame/2 {
			return nil, blobplane.Errorf(blobplane.CodeInvalid, "%s: a %s record with %d payload bytes", op, r.Type, len(r.Payload))
		}
		arg.Types = append(arg.Types, int16(r.Type))
		arg.Slots = append(arg.Slots, int32(r.Slot))
		if r.Payload == nil {
			r.Payload = []byte{}
		}
		arg.Payloads = append(arg.Payloads, r.Payload)
	}
	ids, err := s.q.AppendJournal(ctx, tx, arg)
	if err != nil {
		return nil, dbErr(op, err)
	}
	if len(ids) == 0 {
		return nil, staleJournal(op, partition, epoch)
	}
	return ids, nil
}

// Sequenced is one record given its LSN.
type Sequenced struct {
	AppendID int64
	LSN      uint64
}

// SequenceJournal gives up to limit committed, unsequenced records of
// partition the next LSNs, as the primary at epoch, and returns them in
// LSN order. A record that commits after this call gets a later LSN from
// a later one: the journal's order is the order records became visible
// to its one sequencer (readers see only sequenced records). Errors: stale_epoch (another epoch sequences the journal), unavailable.
func (s *Store) SequenceJournal(ctx context.Context, partition string, epoch uint64, limit int) ([]Sequenced, error) {
	const op = "sequence journal"
	var out []Sequenced
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		head, err := s.q.LockJournalHead(ctx, tx, dbsqlc.LockJournalHeadParams{PartitionID: partition, Epoch: int64(epoch)})
		if errors.Is(err, pgx.ErrNoRows) {
			return staleJournal(op, partition, epoch)
		}
		if err != nil {
			return err
		}
		rows, err := s.q.SequenceJournal(ctx, tx, dbsqlc.SequenceJournalParams{PartitionID: partition, MaxRows: int32(min(max(limit, 1), 1<<20)),
			NextLsn: head.NextLsn, Generation: head.Generation})
		if err != nil {
			return err
		}
		out = make([]Sequenced, len(rows))
		for i, r := range rows {
			out[i] = Sequenced{AppendID: r.AppendID, LSN: uint64(r.Lsn)}
		}
		return nil
	})
	if err != nil {
		var be *blobplane.Error
		if errors.As(err, &be) {
			return nil, err
		}
		return nil, dbErr(op, err)
	}
	return out, nil
}

// JournalEntry is a sequenced record and the append id it was inserted
// with.
type JournalEntry struct {
	AppendID int64
	journal.Record
}

// ReadJournal returns up to limit sequenced records of partition's
// generation after LSN after, in LSN order (their Marks empty: Blobplane's
// partitions consume no input stream). Errors: unavailable.
func (s *Store) ReadJournal(ctx context.Context, partition string, generation int64, after uint64, limit int) ([]JournalEntry, error) {
	rows, err := s.q.ReadJournal(ctx, s.pool, dbsqlc.ReadJournalParams{PartitionID: partition, Generation: generation, AfterLsn: int64(after), MaxRows: int32(min(max(limit, 1), 1<<20))})
	if err != nil {
		return nil, dbErr("read journal", err)
	}
	out := make([]JournalEntry, len(rows))
	for i, r := range rows {
		out[i] = JournalEntry{AppendID: r.AppendID, Record: journal.Record{Type: journal.Type(r.RecordType), LSN: uint64(r.Lsn), Epoch: uint64(r.Epoch), Slot: uint32(r.Slot)}}
		if len(r.Payload) > 0 {
			out[i].Record.Payload = r.Payload
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

// JournalFloor is the lowest sequenced LSN of partition's generation
// still in the table (0: none): the records below it were sealed into
// segment objects. Errors: unavailable.
func (s *Store) JournalFloor(ctx context.Context, partition string, generation int64) (uint64, error) {
	n, err := s.q.JournalFloor(ctx, s.pool, dbsqlc.JournalFloorParams{PartitionID: partition, Generation: generation})
	return uint64(n), dbErr("journal floor", err)
}

// TrimJournal deletes partition's sequenced records of generation up to
// LSN upto, which a segment object holds now, and returns how many.
// Errors: unavailable.
func (s *Store) TrimJournal(ctx context.Context, partition string, generation int64, upto uint64) (int64, error) {
	n, err := s.q.TrimJournal(ctx, s.pool, dbsqlc.TrimJournalParams{PartitionID: partition, Generation: generation, UptoLsn: int64(upto)})
	return n, dbErr("trim journal", err)
}
