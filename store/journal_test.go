package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/journal"
	"github.com/blobplane/blobplane/store"
)

// appendJournal appends payloads in a transaction of its own.
func appendJournal(ctx context.Context, s *store.Store, pool *pgxpool.Pool, p string, epoch uint64, payloads ...string) (uint64, error) {
	var first uint64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		recs := make([]store.JournalAppend, len(payloads))
		for i, pl := range payloads {
			recs[i] = store.JournalAppend{Type: journal.Apply, Slot: uint32(i), Payload: []byte(pl)}
		}
		var err error
		_, first, err = s.AppendJournalTx(ctx, tx, p, epoch, recs)
		return err
	})
	return first, err
}

// Issue 33, ZBP-5-R35: LSNs are dense and gapless within a partition's
// generation under concurrent appenders, a rolled-back append returns its
// LSNs, and records read back in order with what was appended.
func TestJournalLSNsDenseAndGapless(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := setupLeases(t)
	const p = "p_journal"
	seedLease(t, pool, p, seed{epoch: 3, owner: "A", expiresIn: time.Minute})
	if h, err := s.FenceJournal(ctx, p, 3); err != nil || h.NextLSN != 1 || h.Generation != 1 {
		t.Fatalf("fence: %+v, %v", h, err)
	}
	// A rollback returns its LSNs: the next append takes them.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, first, err := s.AppendJournalTx(ctx, tx, p, 3, []store.JournalAppend{{Type: journal.Apply, Payload: []byte("rolled back")}}); err != nil || first != 1 {
			t.Errorf("append: %d, %v", first, err)
		}
		return fmt.Errorf("roll back")
	})
	if err == nil {
		t.Fatal("the transaction committed")
	}
	var wg sync.WaitGroup
	const writers, each = 8, 10
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				n := 1 + (w+i)%3
				pls := make([]string, n)
				for j := range pls {
					pls[j] = fmt.Sprintf("w%d-%d-%d", w, i, j)
				}
				if _, err := appendJournal(ctx, s, pool, p, 3, pls...); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	recs, err := s.ReadJournal(ctx, p, 1, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for w := range writers {
		for i := range each {
			want += 1 + (w+i)%3
		}
	}
	if len(recs) != want {
		t.Fatalf("%d records, want %d", len(recs), want)
	}
	for i, r := range recs {
		if r.LSN != uint64(i+1) || r.Epoch != 3 || r.Type != journal.Apply || len(r.Payload) == 0 {
			t.Fatalf("record %d: %+v", i, r)
		}
	}
	// A batch's records are consecutive and in order.
	first, err := appendJournal(ctx, s, pool, p, 3, "a", "b", "c")
	if err != nil || first != uint64(want+1) {
		t.Fatalf("batch: first %d, %v", first, err)
	}
	tail, err := s.ReadJournal(ctx, p, 1, uint64(want), 10)
	if err != nil || len(tail) != 3 || string(tail[0].Payload) != "a" || string(tail[2].Payload) != "c" || tail[2].Slot != 2 {
		t.Fatalf("batch read back: %+v, %v", tail, err)
	}
	if h, err := s.JournalHeadOf(ctx, p); err != nil || h.NextLSN != uint64(want+4) || h.Epoch != 3 {
		t.Fatalf("head %+v, %v", h, err)
	}
}

// The fence (ZBP-5-R20, R24): a new primary's FenceJournal waits for an
// append in flight at the old epoch, so that append is committed and
// readable when the new primary reads the tail; any later append at the
// old epoch changes nothing and is stale_epoch. An epoch the lease does
// not hold never takes the journal.
func TestJournalFenceWaitsForTheDisplacedPrimary(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, pool := setupLeases(t)
	const p = "p_fence"
	seedLease(t, pool, p, seed{epoch: 7, owner: "A", expiresIn: time.Minute})
	if _, err := s.FenceJournal(ctx, p, 8); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("an epoch no one claimed: %v", err)
	}
	if _, err := s.FenceJournal(ctx, p, 7); err != nil {
		t.Fatal(err)
	}
	// The old primary's append, not yet committed: it holds the head.
	old, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = old.Rollback(context.Background()) })
	if _, _, err := s.AppendJournalTx(ctx, old, p, 7, []store.JournalAppend{{Type: journal.Apply, Payload: []byte("in flight")}}); err != nil {
		t.Fatal(err)
	}
	// B takes the lease over at epoch 8 and fences the journal.
	if _, err := pool.Exec(ctx, `UPDATE leases SET epoch = 8, owner_node = 'B', owner_endpoint = 'B:7443' WHERE partition_id = $1`, p); err != nil {
		t.Fatal(err)
	}
	fenced := make(chan error, 1)
	var head store.JournalHead
	go func() {
		var err error
		head, err = s.FenceJournal(ctx, p, 8)
		fenced <- err
	}()
	waitBlocked(t, ctx, pool, "%INSERT INTO partition_journal_heads%")
	select {
	case err := <-fenced:
		t.Fatalf("the fence did not wait for the append in flight: %v", err)
	default:
	}
	if err := old.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-fenced; err != nil {
		t.Fatal(err)
	}
	if head.NextLSN != 2 {
		t.Fatalf("head after the fence %+v: the in-flight record should be LSN 1", head)
	}
	recs, err := s.ReadJournal(ctx, p, 1, 0, 10)
	if err != nil || len(recs) != 1 || string(recs[0].Payload) != "in flight" || recs[0].Epoch != 7 {
		t.Fatalf("the tail B reads after its fence: %+v, %v", recs, err)
	}
	if _, err := appendJournal(ctx, s, pool, p, 7, "too late"); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("the displaced primary's next append: %v, want stale_epoch", err)
	}
	if first, err := appendJournal(ctx, s, pool, p, 8, "B's first"); err != nil || first != 2 {
		t.Fatalf("B's append: %d, %v", first, err)
	}
	if _, err := s.FenceJournal(ctx, p, 7); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("fencing back to an older epoch: %v", err)
	}
}

// waitBlocked polls (with a deadline) until a backend of this database
// whose query matches like waits on a lock.
func waitBlocked(t *testing.T, ctx context.Context, pool *pgxpool.Pool, like string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`, like).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no backend blocked on %s", like)
		}
		time.Sleep(10 * time.Millisecond) // polling pg_stat_activity
	}
}

func TestJournalAppendRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := setupLeases(t)
	const p = "p_refuse"
	if _, err := appendJournal(ctx, s, pool, p, 1, "x"); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("no head: %v", err)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, recs := range [][]store.JournalAppend{nil, {{Type: journal.Mark, Payload: []byte("x")}}, {{Type: 9}}} {
			if _, _, err := s.AppendJournalTx(ctx, tx, p, 1, recs); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
				t.Errorf("%+v: %v", recs, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
