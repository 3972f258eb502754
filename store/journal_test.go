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
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/journal"
	"github.com/blobplane/blobplane/store"
)

var allSlots = []authority.SlotRange{{Low: 0, High: 4095}}

// appendJournal appends payloads in a transaction of its own.
func appendJournal(ctx context.Context, s *store.Store, pool *pgxpool.Pool, p string, epoch uint64, payloads ...string) ([]int64, error) {
	var ids []int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		recs := make([]store.JournalAppend, len(payloads))
		for i, pl := range payloads {
			recs[i] = store.JournalAppend{Type: journal.Apply, Slot: uint32(i), Payload: []byte(pl)}
		}
		var err error
		ids, err = s.AppendJournalTx(ctx, tx, p, epoch, recs)
		return err
	})
	return ids, err
}

// sequenceAll sequences until nothing more is ready.
func sequenceAll(t *testing.T, ctx context.Context, s *store.Store, p string, epoch uint64) []store.Sequenced {
	t.Helper()
	var all []store.Sequenced
	for {
		got, err := s.SequenceJournal(ctx, p, epoch, 7) // small pages: several rounds
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			return all
		}
		all = append(all, got...)
	}
}

// Issue 33, ZBP-5-R35: records appended by concurrent transactions get
// dense, gapless LSNs once sequenced, each exactly once, a batch's in its
// order; a rolled-back append never gets one.
func TestJournalLSNsDenseAndGapless(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := setupLeases(t)
	const p = "p_journal"
	seedLease(t, pool, p, seed{epoch: 3, owner: "A", expiresIn: time.Minute})
	if h, err := s.FenceJournal(ctx, p, 3, 12, allSlots); err != nil || h.NextLSN != 1 || h.Generation != 1 {
		t.Fatalf("fence: %+v, %v", h, err)
	}
	var rolledBack []int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if rolledBack, err = s.AppendJournalTx(ctx, tx, p, 3, []store.JournalAppend{{Type: journal.Apply, Payload: []byte("rolled back")}}); err != nil {
			t.Error(err)
		}
		return fmt.Errorf("roll back")
	})
	if err == nil {
		t.Fatal("the transaction committed")
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		batches [][]int64
	)
	const writers, each = 8, 10
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				pls := make([]string, 1+(w+i)%3)
				for j := range pls {
					pls[j] = fmt.Sprintf("w%d-%d-%d", w, i, j)
				}
				ids, err := appendJournal(ctx, s, pool, p, 3, pls...)
				if err != nil {
					errs <- err
					continue
				}
				mu.Lock()
				batches = append(batches, ids)
				mu.Unlock()
			}
			if w%2 == 0 { // a sequencer racing the appenders
				if _, err := s.SequenceJournal(ctx, p, 3, 5); err != nil {
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
	sequenceAll(t, ctx, s, p, 3)
	recs, err := s.ReadJournal(ctx, p, 1, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, b := range batches {
		want += len(b)
	}
	if len(recs) != want {
		t.Fatalf("%d records sequenced, want %d", len(recs), want)
	}
	lsnOf := map[int64]uint64{}
	for i, r := range recs {
		if r.LSN != uint64(i+1) || r.Epoch != 3 || r.Type != journal.Apply || len(r.Payload) == 0 {
			t.Fatalf("record %d: %+v", i, r)
		}
		if _, dup := lsnOf[r.AppendID]; dup {
			t.Fatalf("append %d sequenced twice", r.AppendID)
		}
		lsnOf[r.AppendID] = r.LSN
	}
	if _, ok := lsnOf[rolledBack[0]]; ok {
		t.Fatal("a rolled-back record got an LSN")
	}
	for _, b := range batches {
		for i := 1; i < len(b); i++ {
			if lsnOf[b[i]] <= lsnOf[b[i-1]] {
				t.Fatalf("batch %v out of order: %d then %d", b, lsnOf[b[i-1]], lsnOf[b[i]])
			}
		}
	}
	if h, err := s.JournalHeadOf(ctx, p); err != nil || h.NextLSN != uint64(want+1) || h.Epoch != 3 {
		t.Fatalf("head %+v, %v", h, err)
	}
}

// The journal's order is the order records became visible to the
// sequencer: a transaction that appended first but is still running when
// a later one has committed is sequenced after it, and nothing waits for
// it.
func TestJournalOrderIsVisibilityOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := setupLeases(t)
	const p = "p_order"
	seedLease(t, pool, p, seed{epoch: 1, owner: "A", expiresIn: time.Minute})
	if _, err := s.FenceJournal(ctx, p, 1, 12, allSlots); err != nil {
		t.Fatal(err)
	}
	older, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = older.Rollback(context.Background()) })
	olderIDs, err := s.AppendJournalTx(ctx, older, p, 1, []store.JournalAppend{{Type: journal.Apply, Payload: []byte("appended first, committed last")}})
	if err != nil {
		t.Fatal(err)
	}
	newerIDs, err := appendJournal(ctx, s, pool, p, 1, "appended last, committed first")
	if err != nil {
		t.Fatal(err)
	}
	if got := sequenceAll(t, ctx, s, p, 1); len(got) != 1 || got[0].AppendID != newerIDs[0] || got[0].LSN != 1 {
		t.Fatalf("with the older transaction running: %+v; want the committed record at LSN 1", got)
	}
	if err := older.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sequenceAll(t, ctx, s, p, 1); len(got) != 1 || got[0].AppendID != olderIDs[0] || got[0].LSN != 2 {
		t.Fatalf("after its commit: %+v; want it at LSN 2", got)
	}
}

// The fence (ZBP-5-R20, R24): a displaced primary's append in flight
// holds the lease row's key share lock, so the claim of a higher epoch
// waits for it; once the new primary has fenced the journal it sequences
// that record, and the displaced primary can neither append nor sequence
// again. An epoch the lease does not hold never takes the journal.
func TestJournalFenceWaitsForTheDisplacedPrimary(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, pool := setupLeases(t)
	const p = "p_fence"
	seedLease(t, pool, p, seed{epoch: 7, owner: "A", expiresIn: time.Minute})
	if _, err := s.FenceJournal(ctx, p, 8, 12, allSlots); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("an epoch no one claimed: %v", err)
	}
	if _, err := s.FenceJournal(ctx, p, 7, 12, allSlots); err != nil {
		t.Fatal(err)
	}
	old, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = old.Rollback(context.Background()) })
	if _, err := s.AppendJournalTx(ctx, old, p, 7, []store.JournalAppend{{Type: journal.Apply, Payload: []byte("in flight")}}); err != nil {
		t.Fatal(err)
	}
	claimed := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, `UPDATE leases SET epoch = 8, owner_node = 'B', owner_endpoint = 'B:7443' WHERE partition_id = $1`, p)
		claimed <- err
	}()
	waitBlocked(t, ctx, pool, "%UPDATE leases SET epoch = 8%")
	if err := old.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-claimed; err != nil {
		t.Fatal(err)
	}
	if _, err := s.FenceJournal(ctx, p, 8, 12, allSlots); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SequenceJournal(ctx, p, 7, 10); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("the displaced primary sequencing: %v", err)
	}
	got := sequenceAll(t, ctx, s, p, 8)
	recs, err := s.ReadJournal(ctx, p, 1, 0, 10)
	if err != nil || len(got) != 1 || len(recs) != 1 || string(recs[0].Payload) != "in flight" || recs[0].Epoch != 7 {
		t.Fatalf("what B sequences after its fence: %+v, %+v, %v", got, recs, err)
	}
	if _, err := appendJournal(ctx, s, pool, p, 7, "too late"); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("the displaced primary's next append: %v, want stale_epoch", err)
	}
	if _, err := appendJournal(ctx, s, pool, p, 8, "B's first"); err != nil {
		t.Fatal(err)
	}
	if got := sequenceAll(t, ctx, s, p, 8); len(got) != 1 || got[0].LSN != 2 {
		t.Fatalf("B's first record: %+v", got)
	}
	if _, err := s.FenceJournal(ctx, p, 7, 12, allSlots); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
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
		t.Fatalf("no lease: %v", err)
	}
	if _, err := s.SequenceJournal(ctx, p, 1, 1); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("no head: %v", err)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, recs := range [][]store.JournalAppend{nil, {{Type: journal.Mark, Payload: []byte("x")}}, {{Type: 9}}} {
			if _, err := s.AppendJournalTx(ctx, tx, p, 1, recs); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
				t.Errorf("%+v: %v", recs, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
