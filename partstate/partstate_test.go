package partstate_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	fsbackend "github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/journal"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/quota"
	"github.com/blobplane/blobplane/store"
)

var all = []authority.SlotRange{{Low: 0, High: 4095}}

// fullClass is QuotaClass checkpointing in full (ZBP-5-R39).
var fullClass = partstate.Class{Name: "full", Mode: authority.ModeMixed, CommitTier: partstate.Durable, Checkpoint: partstate.FullCheckpoints}

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
	if _, err := f.st.FenceJournal(context.Background(), f.p, f.epo, 12, all); err != nil {
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
	p := partstate.New(f.st, f.p, f.epo, 12, all, nil)
	if _, err := p.Reserve("team/app", 1, time.Now()); !errors.Is(err, partstate.ErrNotReady) {
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
	next := partstate.New(f.st, f.p, 5, 12, all, nil)
	if err := next.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if string(next.Snapshot(12)) != string(p.Snapshot(12)) {
		t.Fatalf("the new primary's state differs:\n%s\n%s", next.Snapshot(12), p.Snapshot(12))
	}
	if _, err := f.append(t, f.epo, rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(9), Size: 1})); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("the displaced primary's append: %v", err)
	}
	stale := partstate.New(f.st, f.p, f.epo, 12, all, nil)
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
	p := partstate.New(f.st, f.p, f.epo, 12, all, nil)
	if err := p.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	var ok atomic.Int32
	var releases sync.Map
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			rel, err := p.Reserve("team/app", 10, time.Now())
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
	if _, err := p.Reserve("team/app", 10, time.Now()); err != nil {
		t.Fatalf("after one release: %v", err)
	}
	if _, err := p.Reserve("other/x", 1<<40, time.Now()); err != nil {
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
	p := partstate.New(f.st, f.p, f.epo, 12, all, nil)
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

// ledgerFixture is a partition whose journal does not exist yet, over
// repositories that exist, two of them in its slots.
func ledgerFixture(t *testing.T) (*fixture, []authority.SlotRange) {
	t.Helper()
	d := pgtest.New(t)
	f := &fixture{st: store.New(d.Pool, nil), db: d, p: "p_0002", epo: 2}
	ctx := context.Background()
	for _, r := range []string{"team/app", "team/db", "other/x"} {
		if err := f.st.CreateRepository(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Pool.Exec(ctx, `INSERT INTO leases (partition_id, epoch, owner_node, owner_endpoint, lease_ttl_ms, renew_interval_ms, expires_at)
		VALUES ($1, $2, 'api-a', 'api-a:7443', 15000, 5000, now() + interval '1 minute')`, f.p, f.epo); err != nil {
		t.Fatal(err)
	}
	var slots []authority.SlotRange
	for _, r := range []string{"team/app", "team/db"} {
		s := authority.SlotOf(r, 12)
		slots = append(slots, authority.SlotRange{Low: s, High: s})
	}
	if authority.SlotOf("other/x", 12) == slots[0].Low || authority.SlotOf("other/x", 12) == slots[1].Low {
		t.Fatal("other/x shares a slot: pick another name")
	}
	return f, slots
}

func refSQL(repo string, d int, size int64) (string, []any) {
	return `WITH b AS (INSERT INTO blobs (digest, size_bytes) VALUES ($2, $3) ON CONFLICT (digest) DO NOTHING)
		INSERT INTO blob_references (repository, digest, operation_id) VALUES ($1, $2, gen_random_uuid())
		ON CONFLICT (repository, digest) DO NOTHING`, []any{repo, string(digestN(d)), size}
}

// ledgerUsage is the SQL recomputation of a repository's usage.
func (f *fixture) ledgerUsage(t *testing.T, repo string) quota.Usage {
	t.Helper()
	var u quota.Usage
	if err := f.db.Pool.QueryRow(context.Background(), `SELECT coalesce(sum(b.size_bytes), 0)::bigint, count(*)
		FROM blob_references r JOIN blobs b ON b.digest = r.digest WHERE r.repository = $1`, repo).Scan(&u.Bytes, &u.Blobs); err != nil {
		t.Fatal(err)
	}
	return u
}

// Every reference row created or removed is journalled to its
// partition, whatever wrote it (ADR 0009 items 3 and 11): the journal's
// creation records the usage the ledger held, and from then on the state
// equals the SQL recomputation, dedup included (a second reference of the
// same content in one repository creates no row and no record; the same
// content in two repositories counts in both). A repository outside the
// partition's slots is not journalled to it.
func TestTheLedgerIsJournalled(t *testing.T) {
	t.Parallel()
	f, slots := ledgerFixture(t)
	ctx := context.Background()
	exec := func(repo string, d int, size int64) {
		q, args := refSQL(repo, d, size)
		if _, err := f.db.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec("team/app", 1, 100) // before the journal exists: bootstrap counts them
	exec("team/app", 2, 50)
	exec("other/x", 1, 100)
	p := partstate.New(f.st, f.p, f.epo, 12, slots, nil)
	if err := p.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	exec("team/app", 3, 7)
	exec("team/app", 3, 7)  // the same content again: no row, no record
	exec("team/db", 1, 100) // content team/app holds too
	exec("other/x", 4, 9)
	if _, err := f.db.Pool.Exec(ctx, `DELETE FROM blob_references WHERE repository = 'team/app' AND digest = $1`, string(digestN(2))); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"team/app", "team/db"} {
		if got, _ := p.Usage(r); got != f.ledgerUsage(t, r) {
			t.Fatalf("%s: state %+v, ledger %+v", r, got, f.ledgerUsage(t, r))
		}
	}
	if got, _ := p.Usage("other/x"); got != (quota.Usage{}) {
		t.Fatalf("other/x is not this partition's: %+v", got)
	}
	if p.Quarantined() != 0 {
		t.Fatalf("%d records quarantined: the trigger's payloads must decode", p.Quarantined())
	}
	// A restore at the next epoch (failover) reaches the same state.
	if _, err := f.db.Pool.Exec(ctx, `UPDATE leases SET epoch = 3 WHERE partition_id = $1`, f.p); err != nil {
		t.Fatal(err)
	}
	next := partstate.New(f.st, f.p, 3, 12, slots, nil)
	if err := next.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if string(next.Snapshot(12)) != string(p.Snapshot(12)) {
		t.Fatalf("after failover:\n%s\nwant\n%s", next.Snapshot(12), p.Snapshot(12))
	}
}

// The journal's creation waits for a transaction writing references and
// holds new ones back, so each reference is counted once: by the
// bootstrap when it committed before, by a record when after.
func TestJournalCreationWaitsForWritersInFlight(t *testing.T) {
	t.Parallel()
	f, slots := ledgerFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inFlight, err := f.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inFlight.Rollback(context.Background()) })
	q, args := refSQL("team/app", 1, 100)
	if _, err := inFlight.Exec(ctx, q, args...); err != nil {
		t.Fatal(err)
	}
	p := partstate.New(f.st, f.p, f.epo, 12, slots, nil)
	restored := make(chan error, 1)
	go func() { restored <- p.Restore(ctx) }()
	pgtest.WaitForLockWaiters(t, f.db.Pool, 1)
	select {
	case err := <-restored:
		t.Fatalf("the journal was created under a reference write in flight: %v", err)
	default:
	}
	if err := inFlight.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-restored; err != nil {
		t.Fatal(err)
	}
	q, args = refSQL("team/app", 2, 5)
	if _, err := f.db.Pool.Exec(ctx, q, args...); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := func() quota.Usage { u, _ := p.Usage("team/app"); return u }(), f.ledgerUsage(t, "team/app"); got != want || want.Blobs != 2 {
		t.Fatalf("state %+v, ledger %+v", got, want)
	}
}

// Concurrent catch-ups while writers append: each record is applied
// exactly once, whoever sequences and reads it.
func TestConcurrentCatchUpsApplyEachRecordOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	p := partstate.New(f.st, f.p, f.epo, 12, all, nil)
	if err := p.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	const writers, each = 4, 15
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var catchers sync.WaitGroup
	for range 3 {
		catchers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := p.CatchUp(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := f.append(t, f.epo, rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(w*100 + i), Size: 2})); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	catchers.Wait()
	if _, err := p.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if u, _ := p.Usage("team/app"); u != (quota.Usage{Bytes: 2 * writers * each, Blobs: writers * each}) || p.LSN() != writers*each {
		t.Fatalf("usage %+v at LSN %d; want %d blobs applied once each", u, p.LSN(), writers*each)
	}
}

// archive opens a filesystem backend whose archive the partition's
// checkpoints and segments go to, and returns its directory too.
func (f *fixture) archive(t *testing.T) (string, *fsbackend.Backend) {
	t.Helper()
	dir := t.TempDir()
	arch, err := fsbackend.Open(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { arch.Close() })
	return dir, arch
}

// addRefs journals n ref+ records into team/app, digests from on.
func (f *fixture) addRefs(t *testing.T, n, from int) {
	t.Helper()
	for i := range n {
		if _, err := f.append(t, f.epo, rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(from + i), Size: int64(1 + from + i)})); err != nil {
			t.Fatal(err)
		}
	}
}

// archived is the partition at epoch with arch as its checkpoints'
// archive and the store as its pointers.
func (f *fixture) archived(epoch uint64, arch *fsbackend.Backend) *partstate.Partition {
	p := partstate.New(f.st, f.p, epoch, 12, all, nil)
	p.Archive, p.Pointers = arch, f.st
	return p
}

// checkpointed journals n ref+ records, restores the partition at
// f.epo over arch and checkpoints it; it returns the partition and the
// checkpoint's name.
func (f *fixture) checkpointed(t *testing.T, arch *fsbackend.Backend, n int) (*partstate.Partition, string) {
	t.Helper()
	ctx := context.Background()
	f.addRefs(t, n, 0)
	p := f.archived(f.epo, arch)
	if err := p.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	name, err := p.Checkpoint(ctx, arch, f.st, "api-a")
	if err != nil {
		t.Fatal(err)
	}
	return p, name
}

// Checkpoints (ADR 0009 item 8, ZBP-5 R21, R22, R37): a checkpoint is
// written under a name unique to (partition, generation, epoch, LSN) and
// made current by the fenced pointer; a restore starts from it and
// replays only the records after it; a checkpoint whose part fails its
// digest is treated as absent and the whole journal replayed; a
// displaced primary cannot move the pointer.
func TestCheckpointRestoreAndFallback(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	dir, arch := f.archive(t)
	add := func(n, from int) { f.addRefs(t, n, from) }
	open := func(epoch uint64) *partstate.Partition { return f.archived(epoch, arch) }
	p, name := f.checkpointed(t, arch, 5)
	if want := fmt.Sprintf("%s/g1/e%d/ckpt-%012d.manifest.json", f.p, f.epo, 5); name != want {
		t.Fatalf("checkpoint name %q, want %q", name, want)
	}
	if rec, err := f.st.Lease(ctx, f.p); err != nil || rec.CheckpointPointer != name {
		t.Fatalf("the pointer: %q, %v", rec.CheckpointPointer, err)
	}
	add(3, 100)
	if _, err := p.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	want := string(p.Snapshot(12))

	failover := func(epoch uint64) *partstate.Partition {
		t.Helper()
		if _, err := f.db.Pool.Exec(ctx, `UPDATE leases SET epoch = $2 WHERE partition_id = $1`, f.p, epoch); err != nil {
			t.Fatal(err)
		}
		next := open(epoch)
		if err := next.Restore(ctx); err != nil {
			t.Fatal(err)
		}
		if got := string(next.Snapshot(12)); got != want {
			t.Fatalf("restored at epoch %d:\n%s\nwant\n%s", epoch, got, want)
		}
		return next
	}
	next := failover(5)
	if fed, fellBack := next.Restored(); fed != 3 || fellBack {
		t.Fatalf("from the checkpoint: %d records replayed (fell back %v), want the 3 after it", fed, fellBack)
	}
	if _, err := p.Checkpoint(ctx, arch, f.st, "api-a"); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("the displaced primary's checkpoint: %v, want stale_epoch", err)
	}

	// A part whose bytes changed is not restored: the whole journal is.
	part := filepath.Join(dir, "archive", f.p, "g1", fmt.Sprintf("e%d", f.epo), fmt.Sprintf("ckpt-%012d", 5), "part-0000")
	b, err := os.ReadFile(part)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(part, b, 0o640); err != nil {
		t.Fatal(err)
	}
	third := failover(6)
	if fed, fellBack := third.Restored(); fed != 8 || !fellBack {
		t.Fatalf("from a corrupt checkpoint: %d records replayed (fell back %v), want all 8 and a fallback", fed, fellBack)
	}
}

// Sealing (ADR 0009 item 8): the records a checkpoint covers are framed
// into one segment object and leave the table; a restore from the
// checkpoint reads neither, and one that cannot use the checkpoint
// replays the segment and then the table to the same state. A missing
// segment is a gap, never skipped.
func TestSealedSegmentsAreReplayed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	_, arch := f.archive(t)
	add := func(n, from int) { f.addRefs(t, n, from) }
	open := func(epoch uint64) *partstate.Partition { return f.archived(epoch, arch) }
	p, _ := f.checkpointed(t, arch, 10)
	if n, err := p.Seal(ctx, arch, f.st, 10); err != nil || n != 10 {
		t.Fatalf("seal: %d, %v", n, err)
	}
	if floor, err := f.st.JournalFloor(ctx, f.p, 1); err != nil || floor != 0 {
		t.Fatalf("the table after sealing: floor %d, %v", floor, err)
	}
	add(3, 100)
	if _, err := p.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	want := string(p.Snapshot(12))
	restore := func(epoch uint64) (*partstate.Partition, error) {
		if _, err := f.db.Pool.Exec(ctx, `UPDATE leases SET epoch = $2 WHERE partition_id = $1`, f.p, epoch); err != nil {
			t.Fatal(err)
		}
		next := open(epoch)
		return next, next.Restore(ctx)
	}
	next, err := restore(5)
	if err != nil || string(next.Snapshot(12)) != want {
		t.Fatalf("from the checkpoint: %v\n%s", err, next.Snapshot(12))
	}
	if fed, _ := next.Restored(); fed != 3 {
		t.Fatalf("from the checkpoint: %d records fed, want the 3 in the table", fed)
	}
	// Without the checkpoint (its pointer cleared): the segment, then the table.
	if _, err := f.db.Pool.Exec(ctx, `UPDATE leases SET checkpoint_pointer = NULL WHERE partition_id = $1`, f.p); err != nil {
		t.Fatal(err)
	}
	whole, err := restore(6)
	if err != nil || string(whole.Snapshot(12)) != want {
		t.Fatalf("from the segment and the table: %v\n%s", err, whole.Snapshot(12))
	}
	if fed, _ := whole.Restored(); fed != 13 {
		t.Fatalf("from the segment and the table: %d records fed, want 13", fed)
	}
	// The segment gone: a gap, and the restore stops.
	segs, err := arch.ListArchived(ctx, f.p+"/")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range segs {
		if strings.Contains(n, "/journal/seg-") {
			if err := arch.DeleteArchived(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := f.db.Pool.Exec(ctx, `UPDATE leases SET epoch = 7 WHERE partition_id = $1`, f.p); err != nil {
		t.Fatal(err)
	}
	gapped := partstate.New(noRestart{f.st, f.st}, f.p, 7, 12, all, nil)
	gapped.Archive, gapped.Pointers = arch, f.st
	if err := gapped.Restore(ctx); !errors.Is(err, journal.ErrGap) {
		t.Fatalf("with the segment missing: %v, want a gap", err)
	}
	// The store restarts such a journal from the ledger: a new generation
	// whose state is the ledger's (these records were appended without
	// references, so it holds nothing).
	restarted, err := restore(8)
	if err != nil || !restarted.Restarted() {
		t.Fatalf("restart from the ledger: %v (restarted %v)", err, restarted.Restarted())
	}
	if got, empty := string(restarted.Snapshot(12)), string((&quota.State{}).Checkpoint(12)); got != empty {
		t.Fatalf("restarted state:\n%s\nwant the ledger's (empty)", got)
	}
	if head, err := f.st.JournalHeadOf(ctx, f.p); err != nil || head.Generation != 2 || head.Epoch != 8 {
		t.Fatalf("head after the restart: %+v, %v; want generation 2 at epoch 8", head, err)
	}
}

// noRestart is a journal that cannot restart from the ledger.
type noRestart struct {
	partstate.Journal
	partstate.Trimmer
}

// Lineage (ZBP-5 R37, R45, R46): Prune keeps the current checkpoint and
// the previous one with the segments after it, and deletes the rest; a
// restore whose current checkpoint fails falls back to the previous one
// and replays only what follows it; with both gone, the sealed history is
// a gap and the store restarts the journal from the ledger.
func TestPruneKeepsWhatARestoreReaches(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	dir, arch := f.archive(t)
	p, _ := f.checkpointed(t, arch, 5)
	p.Class = fullClass // the full lineage; TestPruneWalksBothLineages the chains
	var names []string
	for round := range 3 {
		if round > 0 {
			f.addRefs(t, 5, 5*round)
			if _, err := p.CatchUp(ctx); err != nil {
				t.Fatal(err)
			}
		}
		name, err := p.Checkpoint(ctx, arch, f.st, "api-a")
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
		if _, err := p.Seal(ctx, arch, f.st, uint64(5*(round+1))); err != nil {
			t.Fatal(err)
		}
	}
	want := string(p.Snapshot(12))
	n, err := p.Prune(ctx, arch)
	if err != nil || n != 4 {
		t.Fatalf("prune: %d objects, %v; want the oldest checkpoint (manifest and part) and the two segments up to LSN 10", n, err)
	}
	left, err := arch.ListArchived(ctx, f.p+"/")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(left, "\n") != strings.Join([]string{
		f.p + "/g1/e4/ckpt-000000000010.manifest.json", f.p + "/g1/e4/ckpt-000000000010/part-0000",
		f.p + "/g1/e4/ckpt-000000000015.manifest.json", f.p + "/g1/e4/ckpt-000000000015/part-0000",
		f.p + "/g1/e4/journal/seg-000000000011-000000000015",
	}, "\n") {
		t.Fatalf("left after pruning:\n%s", strings.Join(left, "\n"))
	}
	if n, err := p.Prune(ctx, arch); err != nil || n != 0 {
		t.Fatalf("a second prune: %d, %v", n, err)
	}
	// The current checkpoint's part corrupted: the previous one, and the
	// segment after it.
	part := filepath.Join(dir, "archive", f.p, "g1", "e4", "ckpt-000000000015", "part-0000")
	if err := os.WriteFile(part, []byte("{}\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	restore := func(epoch uint64) (*partstate.Partition, error) {
		if _, err := f.db.Pool.Exec(ctx, `UPDATE leases SET epoch = $2 WHERE partition_id = $1`, f.p, epoch); err != nil {
			t.Fatal(err)
		}
		next := f.archived(epoch, arch)
		return next, next.Restore(ctx)
	}
	prev, err := restore(5)
	if err != nil || string(prev.Snapshot(12)) != want {
		t.Fatalf("from the previous checkpoint: %v\n%s", err, prev.Snapshot(12))
	}
	if fed, fellBack := prev.Restored(); fed != 5 || !fellBack || prev.Restarted() {
		t.Fatalf("from the previous checkpoint: %d records fed (fell back %v, restarted %v), want the 5 after it", fed, fellBack, prev.Restarted())
	}
	// Both checkpoints gone: the segments up to 10 were pruned, so the
	// store restarts the journal from the ledger.
	for _, name := range names[1:] {
		if err := arch.DeleteArchived(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	last, err := restore(6)
	if err != nil || !last.Restarted() {
		t.Fatalf("with no checkpoint left: %v (restarted %v), want a restart from the ledger", err, last.Restarted())
	}
}

// The commit tier is declared, never defaulted (ZBP-5 R66-R68): a class
// without one, with a tier that is not one of the three, or with a tier
// below what the journal gives is refused; Blobplane's class passes.
func TestClassDeclaresItsCommitTier(t *testing.T) {
	t.Parallel()
	if err := partstate.QuotaClass.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []partstate.Class{
		{Name: "none", Mode: authority.ModeJournaled},
		{Name: "local", Mode: authority.ModeJournaled, CommitTier: partstate.Local},
		{Name: "standby", Mode: authority.ModeJournaled, CommitTier: partstate.Standby},
		{Name: "made-up", Mode: authority.ModeJournaled, CommitTier: "QUORUM"},
		{Name: "derived", Mode: authority.ModeDerived, CommitTier: partstate.Durable},
	} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), c.Name) {
			t.Errorf("class %+v: %v, want a refusal naming it", c, err)
		}
	}
}
