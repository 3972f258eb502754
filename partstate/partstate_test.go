package partstate_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/journal"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/quota"
	"github.com/blobplane/blobplane/store"
)

type fixture struct {
	st  *store.Store
	db  *pgtest.DB
	p   string
	epo uint64
}

func setup(t *testing.T) *fixture {
	t.Helper()
	d := pgtest.New(t)
	f := &fixture{st: store.New(d.Pool, nil), db: d, p: "p_0001", epo: 4}
	if _, err := d.Pool.Exec(context.Background(), `INSERT INTO leases (partition_id, epoch, owner_node, owner_endpoint, lease_ttl_ms, renew_interval_ms, expires_at)
		VALUES ($1, $2, 'api-a', 'api-a:7443', 15000, 5000, now() + interval '1 minute')`, f.p, f.epo); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.FenceJournal(context.Background(), f.p, f.epo); err != nil {
		t.Fatal(err)
	}
	return f
}

func digestN(i int) blobplane.Digest {
	sum := sha256.Sum256([]byte(fmt.Sprint("blob ", i)))
	return blobplane.Digest("sha256:" + hex.EncodeToString(sum[:]))
}

// append journals payloads at epoch in one transaction and returns the
// append id of the first.
func (f *fixture) append(t *testing.T, epoch uint64, payloads ...[]byte) (int64, error) {
	t.Helper()
	var ids []int64
	err := pgx.BeginFunc(context.Background(), f.db.Pool, func(tx pgx.Tx) error {
		recs := make([]store.JournalAppend, len(payloads))
		for i, p := range payloads {
			recs[i] = store.JournalAppend{Type: journal.Apply, Payload: p}
		}
		var err error
		ids, err = f.st.AppendJournalTx(context.Background(), tx, f.p, epoch, recs)
		return err
	})
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

func rec(t *testing.T, r quota.Record) []byte {
	t.Helper()
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A partition restores its state from the journal before it serves
// (ZBP-5-R23): usage and quotas as journalled, a record the applier cannot
// apply quarantined and counted, never a crash; a new epoch restores the
// same state (failover), and the displaced epoch can append nothing more.
func TestRestoreQuarantineAndFailover(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	if _, err := f.append(t, f.epo,
		rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(1), Size: 60}),
		rec(t, quota.Record{Op: quota.SetQuota, Repository: "team/app", Limit: &quota.Limit{Bytes: 100}}),
		[]byte(`{"v":9,"op":"ref+"}`), // poison: another format
		rec(t, quota.Record{Op: quota.RefRemoved, Repository: "team/db", Digest: digestN(2), Size: 5}), // poison: more than it holds
		rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/db", Digest: digestN(3), Size: 7}),
	); err != nil {
		t.Fatal(err)
	}
	p := partstate.New(f.st, f.p, f.epo, nil)
	if _, err := p.Reserve("team/app", 1); !errors.Is(err, partstate.ErrNotReady) {
		t.Fatalf("before the restore: %v, want not ready", err)
	}
	if err := p.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if p.Status() != partstate.Serving || p.LSN() != 5 || p.Quarantined() != 2 {
		t.Fatalf("after the restore: %s at LSN %d, %d quarantined", p.Status(), p.LSN(), p.Quarantined())
	}
	if u, l := p.Usage("team/app"); u != (quota.Usage{Bytes: 60, Blobs: 1}) || l.Bytes != 100 {
		t.Fatalf("team/app: %+v, %+v", u, l)
	}
	if u, _ := p.Usage("team/db"); u != (quota.Usage{Bytes: 7, Blobs: 1}) {
		t.Fatalf("team/db: %+v (the poison record must change nothing)", u)
	}

	// Failover: the next primary claims epoch 5 and restores the same
	// state; the displaced one appends nothing more.
	if _, err := f.db.Pool.Exec(ctx, `UPDATE leases SET epoch = 5, owner_node = 'api-b', owner_endpoint = 'api-b:7443' WHERE partition_id = $1`, f.p); err != nil {
		t.Fatal(err)
	}
	next := partstate.New(f.st, f.p, 5, nil)
	if err := next.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if string(next.Snapshot(12)) != string(p.Snapshot(12)) {
		t.Fatalf("the new primary's state differs:\n%s\n%s", next.Snapshot(12), p.Snapshot(12))
	}
	if _, err := f.append(t, f.epo, rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(9), Size: 1})); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("the displaced primary's append: %v", err)
	}
	stale := partstate.New(f.st, f.p, f.epo, nil)
	if err := stale.Restore(ctx); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("a restore at the displaced epoch: %v", err)
	}
}

// Admission with reservations: concurrent publications into one
// repository never together pass its quota, and a released reservation
// frees its room; the refusal names the quota.
func TestReserveNeverOvershoots(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	if _, err := f.append(t, f.epo,
		rec(t, quota.Record{Op: quota.SetQuota, Repository: "team/app", Limit: &quota.Limit{Bytes: 100}}),
		rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(1), Size: 60}),
	); err != nil {
		t.Fatal(err)
	}
	p := partstate.New(f.st, f.p, f.epo, nil)
	if err := p.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	var ok atomic.Int32
	var releases sync.Map
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			rel, err := p.Reserve("team/app", 10)
			var ex *quota.ExceededError
			switch {
			case err == nil:
				ok.Add(1)
				releases.Store(i, rel)
			case !errors.As(err, &ex) || ex.Limit != 100 || ex.Measure != "bytes":
				t.Errorf("refusal: %v", err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 4 {
		t.Fatalf("%d reservations of 10 bytes admitted over 60 of 100 used, want 4", ok.Load())
	}
	releases.Range(func(_, v any) bool { v.(func())(); return false }) // one released
	if _, err := p.Reserve("team/app", 10); err != nil {
		t.Fatalf("after one release: %v", err)
	}
	if _, err := p.Reserve("other/x", 1<<40); err != nil {
		t.Fatalf("a repository with no quota: %v", err)
	}
}

// Read-your-writes (ZBP-5-R107): a writer that committed a record learns
// its LSN once the state has applied it, and then sees its change; a
// reader presenting that LSN is answered at once.
func TestWaitForAppliesTheWritersRecord(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	p := partstate.New(f.st, f.p, f.epo, nil)
	if err := p.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	id, err := f.append(t, f.epo, rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(1), Size: 3}))
	if err != nil {
		t.Fatal(err)
	}
	lsn, err := p.WaitForAppend(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WaitFor(ctx, lsn); err != nil {
		t.Fatal(err)
	}
	if u, _ := p.Usage("team/app"); u.Bytes != 3 || p.LSN() != lsn {
		t.Fatalf("after WaitFor(%d): %+v at LSN %d", lsn, u, p.LSN())
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.WaitFor(cctx, lsn+5); !errors.Is(err, context.Canceled) {
		t.Fatalf("a position never written, ctx cancelled: %v", err)
	}
}
