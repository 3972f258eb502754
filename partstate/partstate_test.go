package partstate_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
var fullClass = partstate.Class{Name: "full", Mode: authority.ModeMixed, CommitTier: partstate.Durable, Checkpoint: partstate.FullCheckpoints, Diversity: partstate.DiversityNone}

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
	f.failover(t, p, slots)
}

// failover restores the partition at epoch 3 and checks that it holds
// p's state, which it returns.
func (f *fixture) failover(t *testing.T, p *partstate.Partition, slots []authority.SlotRange) string {
	t.Helper()
	ctx := context.Background()
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
	return string(next.Snapshot(12))
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
// archive and the store as its pointers and its format level.
func (f *fixture) archived(epoch uint64, arch *fsbackend.Backend) *partstate.Partition {
	p := partstate.New(f.st, f.p, epoch, 12, all, nil)
	p.Archive, p.Pointers, p.Formats = arch, f.st, f.st
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
	f.pruneLeaves(t, p, arch, 4, "the oldest checkpoint (manifest and part) and the two segments up to LSN 10",
		"ckpt-000000000010.manifest.json", "ckpt-000000000010/part-0000",
		"ckpt-000000000015.manifest.json", "ckpt-000000000015/part-0000",
		"journal/seg-000000000011-000000000015")
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

// A class declares its standby count and the failure-domain diversity
// between a primary and each standby, "none" said out loud (ZBP-5 R60,
// R61): a class without a diversity does not start.
func TestClassDeclaresItsStandbys(t *testing.T) {
	t.Parallel()
	q := partstate.QuotaClass
	if q.Standbys != 1 || q.Diversity != partstate.DiversityNode {
		t.Fatalf("QuotaClass: %d standbys, diversity %q", q.Standbys, q.Diversity)
	}
	silent := q
	silent.Name, silent.Diversity = "silent", ""
	madeUp := q
	madeUp.Name, madeUp.Diversity = "rack", "rack"
	negative := q
	negative.Name, negative.Standbys = "negative", -1
	for _, c := range []partstate.Class{silent, madeUp, negative} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), c.Name) || !strings.Contains(err.Error(), "R6") {
			t.Errorf("class %+v: %v, want a refusal naming it and the requirement", c, err)
		}
	}
	none := q
	none.Diversity, none.Standbys = partstate.DiversityNone, 0
	if err := none.Validate(); err != nil {
		t.Fatalf("a class that says none: %v", err)
	}
	for d, want := range map[partstate.Diversity]string{partstate.DiversityNone: "", partstate.DiversityNode: "api-1", partstate.DiversityDatacenter: "dc-a"} {
		if got := d.Domain("api-1", "dc-a"); got != want {
			t.Errorf("%s: the domain of api-1 in dc-a is %q, want %q", d, got, want)
		}
	}
}

// restoreAt moves the lease to epoch and restores the partition there
// from arch.
func (f *fixture) restoreAt(t *testing.T, arch *fsbackend.Backend, epoch uint64) *partstate.Partition {
	t.Helper()
	ctx := context.Background()
	if _, err := f.db.Pool.Exec(ctx, `UPDATE leases SET epoch = $2 WHERE partition_id = $1`, f.p, epoch); err != nil {
		t.Fatal(err)
	}
	next := f.archived(epoch, arch)
	if err := next.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	return next
}

// manifest reads a checkpoint manifest from arch.
func manifest(t *testing.T, arch *fsbackend.Backend, name string) partstate.Manifest {
	t.Helper()
	b, err := arch.GetArchived(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	var m partstate.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// step journals payloads, catches p up and checkpoints it; it returns
// the checkpoint's name.
func (f *fixture) step(t *testing.T, p *partstate.Partition, arch *fsbackend.Backend, payloads ...[]byte) string {
	t.Helper()
	ctx := context.Background()
	if len(payloads) > 0 {
		if _, err := f.append(t, f.epo, payloads...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	name, err := p.Checkpoint(ctx, arch, f.st, "api-a")
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// chainFixture is a partition at f.epo over arch holding three
// repositories, checkpointed as a base (LSN 3), then three deltas: a
// quota set and more usage (LSN 6), other/x emptied with no quota, so
// deleted (LSN 7), a quota changed and team/db's usage down (LSN 9),
// after a checkpoint whose pointer did not move (its changes must reach
// the next delta). It returns the partition and the four names.
func (f *fixture) chainFixture(t *testing.T, arch *fsbackend.Backend) (*partstate.Partition, []string) {
	t.Helper()
	ctx := context.Background()
	if _, err := f.append(t, f.epo,
		rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(1), Size: 10}),
		rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/db", Digest: digestN(2), Size: 20}),
		rec(t, quota.Record{Op: quota.RefAdded, Repository: "other/x", Digest: digestN(3), Size: 30}),
	); err != nil {
		t.Fatal(err)
	}
	p := f.archived(f.epo, arch)
	if err := p.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	names := []string{f.step(t, p, arch)}
	names = append(names, f.step(t, p, arch,
		rec(t, quota.Record{Op: quota.SetQuota, Repository: "team/db", Limit: &quota.Limit{Bytes: 1000, Blobs: 5}}),
		rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(4), Size: 40}),
		rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/db", Digest: digestN(5), Size: 50})))
	names = append(names, f.step(t, p, arch, rec(t, quota.Record{Op: quota.RefRemoved, Repository: "other/x", Digest: digestN(3), Size: 30})))
	if _, err := f.append(t, f.epo, rec(t, quota.Record{Op: quota.SetQuota, Repository: "team/db", Limit: &quota.Limit{Bytes: 70}})); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Checkpoint(ctx, arch, failingPointers{f.st}, "api-a"); err == nil {
		t.Fatal("a checkpoint whose pointer cannot move succeeded")
	}
	names = append(names, f.step(t, p, arch, rec(t, quota.Record{Op: quota.RefRemoved, Repository: "team/db", Digest: digestN(2), Size: 20})))
	return p, names
}

// failingPointers refuses to move the pointer.
type failingPointers struct{ partstate.Pointers }

func (failingPointers) FenceLeaseWrite(context.Context, string, string, uint64, store.LeaseFenceWrite) (authority.LeaseRecord, error) {
	return authority.LeaseRecord{}, errors.New("the lease store is down")
}

// ZBP-5-R39, R40: an incremental class's checkpoints are a base, then
// deltas naming the base and the delta before them, each with its
// digest, the kind recorded in every manifest; a restore through the
// base and every delta equals the live state — a repository deleted, a
// quota changed, and the changes of a checkpoint whose pointer did not
// move carried by the next delta — and replays only what follows.
func TestIncrementalRestoreThroughTheChain(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, arch := f.archive(t)
	p, names := f.chainFixture(t, arch)
	if m := manifest(t, arch, names[0]); m.Kind != "full" || m.FormatVersion != 1 || m.Base != "" || len(m.Parts) != 1 {
		t.Fatalf("the base's manifest: %+v", m)
	}
	m := manifest(t, arch, names[3])
	if m.Kind != "incremental" || m.FormatVersion != 2 || m.Base != names[0] || len(m.Deltas) != 3 || len(m.Parts) != 0 || m.JournalLSN != 9 {
		t.Fatalf("the chain's manifest: %+v", m)
	}
	for i, d := range m.Deltas {
		if want := fmt.Sprintf("%s/g1/e4/delta-%012d", f.p, []uint64{6, 7, 9}[i]); d.Key != want || d.SHA256 == "" {
			t.Fatalf("delta %d: %+v, want %s", i, d, want)
		}
		if (i == 0) != (d.After == nil) || (i > 0 && *d.After != m.Deltas[i-1].Key) {
			t.Fatalf("delta %d follows %v", i, d.After)
		}
	}
	f.addRefs(t, 2, 100) // after the chain: replayed from the journal
	if _, err := p.CatchUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	next := f.restoreAt(t, arch, 5)
	if got, want := string(next.Snapshot(12)), string(p.Snapshot(12)); got != want {
		t.Fatalf("through the chain:\n%s\nwant\n%s", got, want)
	}
	if fed, fellBack := next.Restored(); fed != 2 || fellBack {
		t.Fatalf("through the chain: %d records replayed (fell back %v), want the 2 after it", fed, fellBack)
	}
	if u, l := next.Usage("other/x"); u != (quota.Usage{}) || l != (quota.Limit{}) || strings.Contains(string(next.Snapshot(12)), "other/x") {
		t.Fatalf("other/x, emptied: %+v %+v", u, l)
	}
	if u, l := next.Usage("team/db"); u != (quota.Usage{Bytes: 50, Blobs: 1}) || l != (quota.Limit{Bytes: 70}) {
		t.Fatalf("team/db: %+v %+v", u, l)
	}
	// The next epoch's first checkpoint is a base of its own.
	if _, err := next.Checkpoint(context.Background(), arch, f.st, "api-a"); err != nil {
		t.Fatal(err)
	}
	if m := manifest(t, arch, fmt.Sprintf("%s/g1/e5/ckpt-%012d.manifest.json", f.p, 11)); m.Kind != "full" {
		t.Fatalf("a new epoch's first checkpoint: kind %s", m.Kind)
	}
}

// ZBP-5-R41: a chain is compacted into a new base before it reaches
// MaxDeltaChain; the restore from the new base equals the state.
func TestChainCompactsAtItsBound(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, arch := f.archive(t)
	p, _ := f.checkpointed(t, arch, 1)
	p.Class.MaxDeltaChain = 3
	var kinds []string
	for i := range 5 {
		name := f.step(t, p, arch, rec(t, quota.Record{Op: quota.RefAdded, Repository: fmt.Sprintf("team/r%d", i), Digest: digestN(50 + i), Size: 3}))
		m := manifest(t, arch, name)
		kinds = append(kinds, fmt.Sprintf("%s/%d", m.Kind, len(m.Deltas)))
	}
	if got := strings.Join(kinds, " "); got != "incremental/1 incremental/2 full/0 incremental/1 incremental/2" {
		t.Fatalf("checkpoints after the first base: %s; want two deltas, a new base, two deltas", got)
	}
	if got, want := string(f.restoreAt(t, arch, 5).Snapshot(12)), string(p.Snapshot(12)); got != want {
		t.Fatalf("after a compaction:\n%s\nwant\n%s", got, want)
	}
}

// ZBP-5-R40, R37: a delta whose bytes changed, or a chain's base gone,
// makes the whole chain absent: the restore falls back to the newest
// checkpoint it can verify whole (here the chain's first delta), then to
// the whole journal, and ends equal to the journal's truth either way.
func TestABrokenChainIsAbsent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	dir, arch := f.archive(t)
	p, names := f.chainFixture(t, arch)
	want := string(p.Snapshot(12))
	plain := partstate.New(f.st, f.p, f.epo, 12, all, nil) // no archive: the whole journal
	if err := plain.Restore(context.Background()); err != nil || string(plain.Snapshot(12)) != want {
		t.Fatalf("the journal's truth differs from the live state: %v\n%s", err, plain.Snapshot(12))
	}
	obj := func(key string) string { return filepath.Join(dir, "archive", filepath.FromSlash(key)) }
	delta := obj(manifest(t, arch, names[3]).Deltas[1].Key)
	b, err := os.ReadFile(delta)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(delta, b, 0o640); err != nil {
		t.Fatal(err)
	}
	next := f.restoreAt(t, arch, 5)
	if got := string(next.Snapshot(12)); got != want {
		t.Fatalf("from a chain with a corrupt delta:\n%s\nwant\n%s", got, want)
	}
	// LSN 9's chain and LSN 7's both hold the corrupt delta; LSN 6's
	// (the base and the first delta) restores, and 3 records follow it.
	if fed, fellBack := next.Restored(); fed != 3 || !fellBack {
		t.Fatalf("from a chain with a corrupt delta: %d records replayed (fell back %v), want the 3 after LSN 6", fed, fellBack)
	}
	if err := os.Remove(obj(strings.TrimSuffix(names[0], ".manifest.json") + "/part-0000")); err != nil {
		t.Fatal(err)
	}
	whole := f.restoreAt(t, arch, 6)
	if got := string(whole.Snapshot(12)); got != want {
		t.Fatalf("with the base's part gone:\n%s\nwant\n%s", got, want)
	}
	if fed, fellBack := whole.Restored(); fed != 9 || !fellBack {
		t.Fatalf("with the base's part gone: %d records replayed (fell back %v), want all 9", fed, fellBack)
	}
}

// ZBP-5-R42: Prune walks both lineages. A base older than the two
// newest checkpoints stays while a live chain's delta needs it, with
// the segments after it; once a compaction superseded the chain, its
// deltas, its manifests and its base go, and what remains restores.
func TestPruneWalksBothLineages(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	_, arch := f.archive(t)
	p, _ := f.checkpointed(t, arch, 5)
	p.Class.MaxDeltaChain = 3
	seal := func(lsn uint64) {
		t.Helper()
		if _, err := p.Seal(ctx, arch, f.st, lsn); err != nil {
			t.Fatal(err)
		}
	}
	seal(5)
	for round := 1; round <= 4; round++ { // deltas at 10 and 15, a base at 20, a delta at 25
		f.addRefs(t, 5, 5*round)
		f.step(t, p, arch)
		seal(uint64(5 * (round + 1)))
		if round != 2 {
			continue
		}
		// The chain base(5), delta(10), delta(15): its base is the
		// oldest checkpoint, but both live ones need it.
		if n, err := p.Prune(ctx, arch); err != nil || n != 1 {
			t.Fatalf("prune of a live chain: %d objects, %v; want the segment up to its base only", n, err)
		}
		for _, keep := range []string{"ckpt-000000000005.manifest.json", "ckpt-000000000005/part-0000", "delta-000000000010", "journal/seg-000000000006-000000000010"} {
			if _, err := arch.GetArchived(ctx, f.p+"/g1/e4/"+keep); err != nil {
				t.Fatalf("%s, needed by the live chain: %v", keep, err)
			}
		}
	}
	want := string(p.Snapshot(12))
	f.pruneLeaves(t, p, arch, 9, "a superseded chain's 3 manifests, 2 deltas, base part and 3 segments",
		"ckpt-000000000020.manifest.json", "ckpt-000000000020/part-0000",
		"ckpt-000000000025.manifest.json", "delta-000000000025",
		"journal/seg-000000000021-000000000025")
	if p.Unreachable() != 0 {
		t.Fatalf("%d unreachable objects left, want none", p.Unreachable())
	}
	// R46: an object no live checkpoint names but newer than them all
	// (a delta whose manifest was never written) stays, and is counted
	// until a later prune finds it older than every live checkpoint.
	if err := arch.PutArchived(ctx, f.p+"/g1/e4/delta-000000000099", []byte("{}\n")); err != nil {
		t.Fatal(err)
	}
	if n, err := p.Prune(ctx, arch); err != nil || n != 0 || p.Unreachable() != 1 {
		t.Fatalf("prune with a stray delta: %d deleted, %d unreachable, %v; want 0 deleted, 1 counted", n, p.Unreachable(), err)
	}
	if got := string(f.restoreAt(t, arch, 5).Snapshot(12)); got != want {
		t.Fatalf("after pruning:\n%s\nwant\n%s", got, want)
	}
}

// ZBP-5-R44, R43: a format 1 manifest, as the release before wrote it,
// still restores; a manifest of a version this binary does not know, or
// a kind its version does not have, is refused and the journal replayed.
func TestManifestFormats(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	_, arch := f.archive(t)
	f.addRefs(t, 4, 0)
	p := f.archived(f.epo, arch)
	if err := p.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	body := p.Snapshot(12)
	sum := sha256.Sum256(body)
	digest := hex.EncodeToString(sum[:])
	base := fmt.Sprintf("%s/g1/e%d/ckpt-%012d", f.p, f.epo, 4)
	if err := arch.PutArchived(ctx, base+"/part-0000", body); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		format int
		kind   string
		fed    int
	}{{1, "full", 0}, {3, "full", 4}, {1, "incremental", 4}} {
		name := fmt.Sprintf("%s/g1/e%d/ckpt-%012d.manifest.json", f.p, f.epo, 4+i)
		// Format 1, byte for byte as the previous release wrote it.
		m := fmt.Sprintf(`{"partition":%q,"generation":1,"epoch":%d,"format_version":%d,"kind":%q,"journal_lsn":4,"input_positions":{},"slot_bits":12,"slots":[[0,4095]],"size_bytes":%d,"sha256":%q,"parts":[{"slot_low":0,"slot_high":4095,"key":%q,"sha256":%q}]}`,
			f.p, f.epo, tc.format, tc.kind, len(body), digest, base+"/part-0000", digest)
		if err := arch.PutArchived(ctx, name, []byte(m)); err != nil {
			t.Fatal(err)
		}
		if err := arch.DeleteArchived(ctx, fmt.Sprintf("%s/g1/e%d/ckpt-%012d.manifest.json", f.p, f.epo, 3+i)); err != nil && i > 0 {
			t.Fatal(err) // only the manifest under test may be a fallback
		}
		if _, err := f.st.FenceLeaseWrite(ctx, f.p, "api-a", f.epo, store.LeaseFenceWrite{CheckpointPointer: &name}); err != nil {
			t.Fatal(err)
		}
		next := partstate.New(f.st, f.p, f.epo, 12, all, nil)
		next.Archive, next.Pointers = arch, f.st
		if err := next.Restore(ctx); err != nil {
			t.Fatal(err)
		}
		if fed, fellBack := next.Restored(); fed != tc.fed || fellBack != (tc.fed > 0) || string(next.Snapshot(12)) != string(body) {
			t.Fatalf("format %d, kind %s: %d records replayed (fell back %v), want %d", tc.format, tc.kind, fed, fellBack, tc.fed)
		}
	}
}

// ZBP-5-R39, R41: the checkpoint kind is declared, never defaulted, and
// an incremental class states its chain bound; Blobplane's class is
// incremental with a bound derived from the shutdown budget, and a
// budget too short for a chain refuses it.
func TestClassDeclaresItsCheckpointKind(t *testing.T) {
	t.Parallel()
	q := partstate.QuotaClass
	if q.Checkpoint != partstate.IncrementalCheckpoints || q.MaxDeltaChain != partstate.MaxDeltaChainFor(partstate.DefaultShutdownBudget) || q.MaxDeltaChain < 2 {
		t.Fatalf("QuotaClass: %+v", q)
	}
	if got := partstate.MaxDeltaChainFor(60 * time.Second); got != 16 {
		t.Fatalf("the bound for 60 s: %d, want 60 s / 12 / 300 ms = 16", got)
	}
	if c := q.ForShutdownBudget(120 * time.Second); c.MaxDeltaChain != 33 || c.Validate() != nil {
		t.Fatalf("for 120 s: %+v, %v", c, c.Validate())
	}
	for _, c := range []partstate.Class{
		{Name: "no-kind", Mode: authority.ModeMixed, CommitTier: partstate.Durable},
		{Name: "unbounded", Mode: authority.ModeMixed, CommitTier: partstate.Durable, Checkpoint: partstate.IncrementalCheckpoints},
		{Name: "one", Mode: authority.ModeMixed, CommitTier: partstate.Durable, Checkpoint: partstate.IncrementalCheckpoints, MaxDeltaChain: 1},
		{Name: "full-bounded", Mode: authority.ModeMixed, CommitTier: partstate.Durable, Checkpoint: partstate.FullCheckpoints, MaxDeltaChain: 8},
		{Name: "made-up", Mode: authority.ModeMixed, CommitTier: partstate.Durable, Checkpoint: "differential", MaxDeltaChain: 8},
		q.ForShutdownBudget(5 * time.Second),
	} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), c.Name) {
			t.Errorf("class %+v: %v, want a refusal naming it", c, err)
		}
	}
	if err := fullClass.Validate(); err != nil {
		t.Fatal(err)
	}
}

// Upload rates (issue 33): a reference added to a repository whose quota
// bounds its rate is journalled with the time its transaction wrote it,
// on the database's clock (ZBP-5-R34: captured, never the replaying
// node's), and only then: a repository without a rate keeps the record
// format the release before wrote (R44). The home's window counts those
// times, so a restore at the next epoch holds the same window, and a
// reservation is refused until the window slides past them.
func TestTheUploadRateIsJournalledWithTheLedgersClock(t *testing.T) {
	t.Parallel()
	f, slots := ledgerFixture(t)
	ctx := context.Background()
	exec := func(repo string, d int, size int64) {
		q, args := refSQL(repo, d, size)
		if _, err := f.db.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	// Before the journal exists: the bootstrap journals both quotas, the
	// rate included (blobplane_quota_limit).
	if _, err := f.st.SetRepositoryQuota(ctx, "team/app", quota.Limit{BlobsPerMinute: 2}, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.SetRepositoryQuota(ctx, "team/db", quota.Limit{Bytes: 1 << 20}, "test"); err != nil {
		t.Fatal(err)
	}
	p := partstate.New(f.st, f.p, f.epo, 12, slots, nil)
	if err := p.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if _, l := p.Usage("team/app"); l != (quota.Limit{BlobsPerMinute: 2}) {
		t.Fatalf("bootstrapped limit %+v, want 2 blobs per minute", l)
	}
	var before, after time.Time
	if err := f.db.Pool.QueryRow(ctx, `SELECT date_trunc('milliseconds', clock_timestamp())`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	exec("team/app", 1, 10)
	exec("team/app", 2, 10)
	exec("team/db", 1, 10)
	if err := f.db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := f.db.Pool.Query(ctx, `SELECT convert_from(payload, 'UTF8') FROM partition_journal
		WHERE partition_id = $1 AND convert_from(payload, 'UTF8')::jsonb->>'op' = 'ref+' ORDER BY append_id`, f.p)
	if err != nil {
		t.Fatal(err)
	}
	payloads, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var at int64
	for _, pl := range payloads {
		r, err := quota.Decode([]byte(pl))
		if err != nil {
			t.Fatalf("%s: %v", pl, err)
		}
		switch {
		case r.Repository == "team/db" && r.At != 0:
			t.Fatalf("a repository without a rate: %s carries at (R44: the format the release before reads)", pl)
		case r.Repository == "team/app" && (r.At < before.UnixMilli() || r.At > after.UnixMilli()):
			t.Fatalf("%s: at %d outside the database clock's [%d, %d]", pl, r.At, before.UnixMilli(), after.UnixMilli())
		case r.Repository == "team/app":
			at = max(at, r.At)
		}
	}
	if at == 0 {
		t.Fatalf("no ref+ of team/app in %q", payloads)
	}
	// Two blobs in the window: a third is refused until the newest
	// leaves it, and the refusal says when.
	last := time.UnixMilli(at)
	_, err = p.Reserve("team/app", 1, last)
	var rated *quota.RateError
	if !errors.As(err, &rated) || rated.Measure != "blobs" || rated.PerMinute != 2 || rated.RetryAfter <= 0 || rated.RetryAfter > quota.Window {
		t.Fatalf("a third blob in a minute: %v, want a RateError of 2 blobs per minute with a retry within a minute", err)
	}
	if rel, err := p.Reserve("team/app", 1, last.Add(quota.Window+time.Second)); err != nil {
		t.Fatalf("a minute later: %v", err)
	} else {
		rel()
	}
	if rel, err := p.Reserve("team/db", 1, last); err != nil {
		t.Fatalf("another repository's rate: %v", err)
	} else if rel != nil {
		rel()
	}
	// A rate set later applies to the publications after it.
	if _, err := f.db.Pool.Exec(ctx, `UPDATE repository_quotas SET max_bytes_per_minute = 15 WHERE repository = 'team/db'`); err != nil {
		t.Fatal(err)
	}
	exec("team/db", 2, 10)
	if _, err := p.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Reserve("team/db", 6, time.Now()); !errors.As(err, &rated) || rated.Measure != "bytes" {
		t.Fatalf("16 bytes in a minute of 15: %v", err)
	}
	if p.Quarantined() != 0 {
		t.Fatalf("%d records quarantined", p.Quarantined())
	}
	// The next epoch's restore replays the same times: the same windows.
	if snap := f.failover(t, p, slots); !strings.Contains(snap, `"window"`) {
		t.Fatalf("no window in %s", snap)
	}
}

// Replay equivalence on the live partition (ZBP-5-R137, R48): after a
// checkpoint, the checkpoint before it, restored from the archive and
// replayed forward through the journal's segments and table, equals the
// new checkpoint restored from the archive; a checkpoint that does not
// hold what its LSN says (here forged, digests and all) is told apart.
func TestReplayCheckComparesCheckpointsThroughTheJournal(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	dir, arch := f.archive(t)
	p, first := f.checkpointed(t, arch, 5)
	if _, _, err := p.VerifyReplay(ctx, arch, f.st, first); !errors.Is(err, partstate.ErrNoEarlierCheckpoint) {
		t.Fatalf("the generation's first checkpoint: %v, want ErrNoEarlierCheckpoint", err)
	}
	second := f.step(t, p, arch,
		rec(t, quota.Record{Op: quota.SetQuota, Repository: "team/app", Limit: &quota.Limit{Bytes: 1 << 20, BlobsPerMinute: 100}}),
		rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(10), Size: 10, At: 1_700_000_000_000}),
		rec(t, quota.Record{Op: quota.RefRemoved, Repository: "team/app", Digest: digestN(0), Size: 1}),
		rec(t, quota.Record{Op: quota.RefAdded, Repository: "other/x", Digest: digestN(11), Size: 11}))
	third := f.step(t, p, arch,
		rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(12), Size: 12, At: 1_700_000_030_000}),
		rec(t, quota.Record{Op: quota.SetQuota, Repository: "other/x", Limit: &quota.Limit{Blobs: 9}}))
	// The records up to the third are sealed into segments and trimmed
	// from the table: the replay reads them back from the archive.
	if _, err := p.Seal(ctx, arch, f.st, manifest(t, arch, third).JournalLSN); err != nil {
		t.Fatal(err)
	}
	from, to, err := p.VerifyReplay(ctx, arch, f.st, third)
	if err != nil || from != manifest(t, arch, second).JournalLSN || to != manifest(t, arch, third).JournalLSN {
		t.Fatalf("replay check of %s: %d..%d, %v; want equal from %s", third, from, to, err, second)
	}
	// One more, read from the table, and its replay equal too.
	fourth := f.step(t, p, arch, rec(t, quota.Record{Op: quota.RefRemoved, Repository: "other/x", Digest: digestN(11), Size: 11}))
	if _, _, err := p.VerifyReplay(ctx, arch, f.st, fourth); err != nil {
		t.Fatalf("replay check of %s: %v", fourth, err)
	}
	// Forge the fourth: one more blob in its delta, digests rewritten so
	// that it restores; the replay check tells it from the journal's.
	m := manifest(t, arch, fourth)
	obj := func(key string) string { return filepath.Join(dir, "archive", filepath.FromSlash(key)) }
	last := &m.Deltas[len(m.Deltas)-1]
	body, err := os.ReadFile(obj(last.Key))
	if err != nil || !strings.Contains(string(body), `"blobs":`) {
		t.Fatalf("delta %s: %v %q", last.Key, err, body)
	}
	forged := strings.Replace(string(body), `"blobs":`, `"blobs":1`, 1)
	sum := sha256.Sum256([]byte(forged))
	last.SHA256, last.SizeBytes, m.SHA256, m.SizeBytes = hex.EncodeToString(sum[:]), int64(len(forged)), hex.EncodeToString(sum[:]), int64(len(forged))
	mb, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(obj(last.Key), []byte(forged), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(obj(fourth), mb, 0o640); err != nil {
		t.Fatal(err)
	}
	_, _, err = p.VerifyReplay(ctx, arch, f.st, fourth)
	var differs *partstate.ReplayDiffersError
	if !errors.As(err, &differs) || differs.Replayed == differs.Restored || differs.Checkpoint != fourth {
		t.Fatalf("a forged checkpoint: %v, want ReplayDiffersError", err)
	}
}

// pruneLeaves prunes p, which must delete n objects (what), and leave
// exactly left (names under the partition's g1/e4/).
func (f *fixture) pruneLeaves(t *testing.T, p *partstate.Partition, arch *fsbackend.Backend, n int, what string, left ...string) {
	t.Helper()
	ctx := context.Background()
	if got, err := p.Prune(ctx, arch); err != nil || got != n {
		t.Fatalf("prune: %d objects, %v; want %d: %s", got, err, n, what)
	}
	got, err := arch.ListArchived(ctx, f.p+"/")
	if err != nil {
		t.Fatal(err)
	}
	for i := range left {
		left[i] = f.p + "/g1/e4/" + left[i]
	}
	if strings.Join(got, "\n") != strings.Join(left, "\n") {
		t.Fatalf("left after pruning:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(left, "\n"))
	}
}
