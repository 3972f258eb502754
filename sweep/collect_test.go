package sweep_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/sweep"
	"github.com/blobplane/blobplane/upload"
)

// Deterministic adversarial schedules of issue 7 for the collector and the
// inventory, on real Postgres and a real filesystem backend. Interleavings
// are forced by holding locks in one connection (or pausing the deciding
// transaction) and stepping another; waits poll pg_stat_activity.

const (
	gcRepo      = "team/app"
	gcOther     = "team/other"
	gcPrincipal = "alice"
	gcPartition = "p-0001"
	gcNode      = "node-a"
	gcLocation  = "objects" // any valid location: the fs backend keys by digest
)

type gc struct {
	st    *store.Store
	pool  *pgxpool.Pool
	be    *fs.Backend
	lease authority.LeaseRecord
	enq   *recordingEnqueuer
}

func gcSetup(t *testing.T) *gc { return gcSetupTB(t) }

func gcSetupTB(t testing.TB) *gc {
	t.Helper()
	ctx := context.Background()
	d := pgtest.New(t)
	st := store.New(d.Pool, nil)
	for _, r := range []string{gcRepo, gcOther} {
		if err := st.CreateRepository(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	g, err := auth.ParseGrant("team/*:write")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.GrantPrincipal(ctx, gcPrincipal, []auth.Grant{g}); err != nil {
		t.Fatal(err)
	}
	lease, err := st.AcquireLease(ctx, gcPartition, gcNode, gcNode+":7443", 15*time.Second, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	be, err := fs.Open(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return &gc{st: st, pool: d.Pool, be: be, lease: lease, enq: &recordingEnqueuer{}}
}

// recordingEnqueuer stands in for River: it records the jobs the deciding
// transaction would insert; runDeletions then works them.
type recordingEnqueuer struct {
	mu  sync.Mutex
	got []store.Deletion
}

func (r *recordingEnqueuer) EnqueueDeletionsTx(_ context.Context, _ pgx.Tx, ds []store.Deletion) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, ds...)
	return nil
}

func (r *recordingEnqueuer) take() []store.Deletion {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.got
	r.got = nil
	return out
}

func (g *gc) collector(enq store.DeletionEnqueuer) *sweep.Collector {
	return &sweep.Collector{Store: g.st, Enqueuer: enq}
}

func (g *gc) deleter() *sweep.Deleter {
	return &sweep.Deleter{Store: g.st, Backends: map[string]sweep.ObjectDeleter{"fs": g.be}, Datacenter: gcDC}
}

func (g *gc) inventory() *sweep.Inventory {
	return &sweep.Inventory{Store: g.st, Backends: map[string]sweep.Lister{"fs": g.be}, Datacenter: gcDC, PageSize: 2, MinAge: time.Nanosecond}
}

const gcDC = "eu-1"

// sweepAll runs a whole sweep: collect, work the byte deletions, inventory.
func (g *gc) sweepAll(t *testing.T) (sweep.CollectReport, sweep.InventoryReport) {
	t.Helper()
	ctx := context.Background()
	crep, err := g.collector(g.enq).RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g.runDeletions(t)
	irep, err := g.inventory().Run(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	return crep, irep
}

func (g *gc) runDeletions(t *testing.T) {
	t.Helper()
	for _, d := range g.enq.take() {
		if _, err := g.deleter().Delete(context.Background(), d.Key); err != nil {
			t.Fatal(err)
		}
	}
}

func digestOf(content string) (blobplane.Digest, int64) {
	h := sha256.New()
	h.Write([]byte(content))
	return blobplane.DigestFromHash(h), int64(len(content))
}

func (g *gc) key(d blobplane.Digest) placement.Key {
	return placement.Key{Digest: d, Backend: "fs", Datacenter: gcDC, Location: gcLocation}
}

// chunked is an upload session the way the OCI handler opens one: the
// intent commits (no digest yet), then bytes are staged under the
// backend's own id.
func (g *gc) chunked(t *testing.T, repo, content string) (upload.Intent, string) {
	t.Helper()
	ctx := context.Background()
	in, err := g.st.CreateIntent(ctx, upload.NewIntent{Repository: repo, Principal: gcPrincipal, ExpectedSize: upload.SizeUnknown,
		IngressDatacenter: gcDC, Backend: "fs", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	id, err := g.be.CreateUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n, err := g.be.AppendUpload(ctx, id, 0, strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	if in, err = g.st.ExtendIntent(ctx, in.OperationID, id, n, time.Hour); err != nil {
		t.Fatal(err)
	}
	return in, id
}

// close runs the handler's close path: claim the content and stage the
// placement in one transaction (ClaimAndStage), promote the staged bytes
// to the content-addressed key, verify (unless the key was verified
// already). It returns the finalize request.
func (g *gc) close(t *testing.T, in upload.Intent, content string) upload.FinalizeRequest {
	t.Helper()
	ctx := context.Background()
	d, size := digestOf(content)
	k := g.key(d)
	st, err := g.st.ClaimAndStage(ctx, in.OperationID, k, size)
	if err != nil {
		t.Fatal(err)
	}
	info, err := g.be.PromoteUpload(ctx, in.StagedLocation, backend.WriteRequest{Digest: d, Size: size})
	if err != nil {
		t.Fatal(err)
	}
	if !st.AlreadyVerified {
		if _, err := g.st.VerifyPlacement(ctx, k, info.Digest, info.Repr.ContentSize, st.Epoch); err != nil {
			t.Fatal(err)
		}
	}
	return g.request(in.OperationID, d, size)
}

func (g *gc) request(op string, d blobplane.Digest, size int64) upload.FinalizeRequest {
	return upload.FinalizeRequest{OperationID: op, Digest: d, Size: size, Partition: gcPartition, Node: gcNode, Epoch: g.lease.Epoch, Targets: []string{}, Proven: true}
}

// uploadAndPublish is a whole chunked upload into repo.
func (g *gc) uploadAndPublish(t *testing.T, repo, content string) upload.FinalizeRequest {
	t.Helper()
	in, _ := g.chunked(t, repo, content)
	req := g.close(t, in, content)
	if _, err := g.st.Finalize(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	return req
}

// dereferenced publishes content in gcRepo and deletes that only
// reference: live, unreferenced, unclaimed, its bytes still stored.
func (g *gc) dereferenced(t *testing.T, content string) upload.FinalizeRequest {
	t.Helper()
	req := g.uploadAndPublish(t, gcRepo, content)
	if err := g.st.DeleteReference(context.Background(), gcRepo, req.Digest); err != nil {
		t.Fatal(err)
	}
	return req
}

// mount is the handler's mount path after its ReferencedBlob check: an
// intent naming the digest, then finalization; a refusal abandons it.
func (g *gc) mount(to string, d blobplane.Digest, size int64) error {
	ctx := context.Background()
	in, err := g.st.CreateIntent(ctx, upload.NewIntent{Repository: to, Principal: gcPrincipal, ExpectedDigest: d, ExpectedSize: size,
		IngressDatacenter: gcDC, Backend: "fs", TTL: time.Hour})
	if err != nil {
		return err
	}
	_, err = g.st.Finalize(ctx, g.request(in.OperationID, d, size))
	if err != nil {
		if _, aerr := g.st.AbandonIntent(ctx, in.OperationID); aerr != nil {
			return errors.Join(err, aerr)
		}
	}
	return err
}

// readBack asserts that d's object holds exactly content.
func (g *gc) readBack(t *testing.T, d blobplane.Digest, content string) {
	t.Helper()
	obj, err := g.be.Read(context.Background(), d, backend.ReadOptions{})
	if err != nil {
		t.Fatalf("S1: read %s: %v", d, err)
	}
	defer obj.Body.Close()
	b, err := io.ReadAll(obj.Body)
	if err != nil || !bytes.Equal(b, []byte(content)) {
		t.Fatalf("S1: %s reads back %q, %v; want %q", d, b, err, content)
	}
}

func (g *gc) exists(t *testing.T, d blobplane.Digest) bool {
	t.Helper()
	_, err := g.be.Stat(context.Background(), d)
	if errors.Is(err, backend.ErrNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

func (g *gc) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := g.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// assertS1 checks every reference resolves to its exact bytes.
func (g *gc) assertS1(t *testing.T, contents ...string) {
	t.Helper()
	for _, c := range contents {
		d, _ := digestOf(c)
		if g.count(t, `SELECT count(*) FROM blob_references WHERE digest = $1`, string(d)) > 0 {
			g.readBack(t, d, c)
		}
	}
}

// pausingEnqueuer holds the deciding transaction open after the decision
// (blob row locked, placements revoked, not committed).
type pausingEnqueuer struct {
	decided, release chan struct{}
	rec              *recordingEnqueuer
}

func (p pausingEnqueuer) EnqueueDeletionsTx(ctx context.Context, tx pgx.Tx, ds []store.Deletion) error {
	close(p.decided)
	<-p.release
	return p.rec.EnqueueDeletionsTx(ctx, tx, ds)
}

// Schedule 1 (S6): bytes persisted, the success reply delayed, a whole
// sweep runs, then the publish arrives. The intent named the digest before
// any byte was written, so its claim protects the bytes.
func TestSchedule1DelayedReplyClaimProtectsBytesS6(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const content = "persisted, reply delayed"
	d, size := digestOf(content)
	// A monolithic upload: the intent names the digest, then bytes land.
	in, err := g.st.CreateIntent(ctx, upload.NewIntent{Repository: gcRepo, Principal: gcPrincipal, ExpectedDigest: d, ExpectedSize: size,
		IngressDatacenter: gcDC, Backend: "fs", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	info, err := g.be.Write(ctx, backend.WriteRequest{Digest: d, Size: size, Body: strings.NewReader(content)})
	if err != nil {
		t.Fatal(err)
	}
	// The reply is delayed: the sweep runs first.
	_, irep := g.sweepAll(t)
	if irep.Classes[store.ClassClaimed] != 1 || irep.Orphans != 0 || !g.exists(t, d) {
		t.Fatalf("S6: the sweep did not keep claimed bytes: %+v", irep)
	}
	// The reply arrives: ledger, publish.
	k := g.key(d)
	if _, err := g.st.StagePlacement(ctx, k, size, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := g.st.VerifyPlacement(ctx, k, info.Digest, info.Repr.ContentSize, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := g.st.Finalize(ctx, g.request(in.OperationID, d, size)); err != nil {
		t.Fatal(err)
	}
	g.sweepAll(t)
	g.assertS1(t, content)
	g.readBack(t, d, content)
}

// Schedule 2 (S1, S6): a sweep runs between an uploader's existence check
// and its commit, in the handler's order: the close claims the digest on
// its intent first, then checks for a verified placement (StagePlacement
// answers conflict: only promote and publish). The sweep finds the digest
// claimed and keeps it; the publication then succeeds on those bytes.
func TestSchedule2SweepBetweenExistenceCheckAndCommitS1(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const content = "existence checked"
	first := g.dereferenced(t, content)
	in, _ := g.chunked(t, gcOther, content)
	// The claim, then the existence check: a verified placement is there.
	if st, err := g.st.ClaimAndStage(ctx, in.OperationID, g.key(first.Digest), first.Size); err != nil || !st.AlreadyVerified {
		t.Fatalf("claim and existence check: already verified %v, %v; want true", st.AlreadyVerified, err)
	}
	crep, irep := g.sweepAll(t)
	if len(crep.Collected) != 0 || irep.Orphans != 0 || !g.exists(t, first.Digest) {
		t.Fatalf("S6: sweep between the check and the commit: %+v %+v; bytes exist %v", crep, irep, g.exists(t, first.Digest))
	}
	if _, err := g.be.PromoteUpload(ctx, in.StagedLocation, backend.WriteRequest{Digest: first.Digest, Size: first.Size}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.st.Finalize(ctx, g.request(in.OperationID, first.Digest, first.Size)); err != nil {
		t.Fatal(err)
	}
	g.sweepAll(t)
	g.readBack(t, first.Digest, content)
}

// The same sweep against an uploader that checked existence before it
// claimed the digest (the order the handler used before claims came
// first; a mount still checks its source before its intent exists, see
// schedule 6): the collection is decided, and the publication is refused
// retryably instead of referencing deleted bytes; the retried upload
// re-stores them and publishes.
func TestUnclaimedExistenceCheckRefusedRetryablyS1(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const content = "existence checked"
	first := g.dereferenced(t, content)
	// The uploader's existence check: a verified placement is there.
	in, _ := g.chunked(t, gcOther, content)
	if ps, err := g.st.Placements(ctx, first.Digest); err != nil || len(ps) != 1 || ps[0].State != placement.Verified {
		t.Fatalf("existence check: %+v, %v", ps, err)
	}
	// The sweep: nothing owns the digest yet (the session has not closed).
	crep, _ := g.sweepAll(t)
	if len(crep.Collected) != 1 || g.exists(t, first.Digest) {
		t.Fatalf("sweep: %+v; bytes exist %v", crep, g.exists(t, first.Digest))
	}
	// The commit: promote (bytes land again), record, publish: no verified
	// placement any more, so a retryable refusal.
	if _, err := g.be.PromoteUpload(ctx, in.StagedLocation, backend.WriteRequest{Digest: first.Digest, Size: first.Size}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.st.RecordIntentContent(ctx, in.OperationID, first.Digest, first.Size); err != nil {
		t.Fatal(err)
	}
	req := g.request(in.OperationID, first.Digest, first.Size)
	if _, err := g.st.Finalize(ctx, req); !blobplane.IsRetryable(err) {
		t.Fatalf("publication after the sweep: %v, want a retryable refusal", err)
	}
	g.assertS1(t, content)
	if g.count(t, `SELECT count(*) FROM blob_references WHERE digest = $1`, string(first.Digest)) != 0 {
		t.Fatal("S1: referenced collected bytes")
	}
	// The retry re-stages and verifies (the handler's close on a revoked
	// placement), then publishes.
	k := g.key(first.Digest)
	if _, err := g.st.StagePlacement(ctx, k, first.Size, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := g.st.VerifyPlacement(ctx, k, first.Digest, first.Size, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := g.st.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	g.sweepAll(t)
	g.readBack(t, first.Digest, content)
}

// Schedule 4 (S6): two uploads of the same content share one
// content-addressed key; one is abandoned, the other published. Sweeps
// before and after the publication keep the shared key.
func TestSchedule4SharedKeyOneAbandonedOnePublishedS6(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const content = "same bytes twice"
	a, _ := g.chunked(t, gcRepo, content)
	b, _ := g.chunked(t, gcOther, content)
	g.close(t, a, content)
	reqB := g.close(t, b, content)
	if _, err := g.st.AbandonIntent(ctx, a.OperationID); err != nil {
		t.Fatal(err)
	}
	crep, irep := g.sweepAll(t)
	if len(crep.Collected) != 0 || irep.Orphans != 0 || !g.exists(t, reqB.Digest) {
		t.Fatalf("S6: sweep after the abandonment: %+v %+v", crep, irep)
	}
	if _, err := g.st.Finalize(ctx, reqB); err != nil {
		t.Fatal(err)
	}
	crep, irep = g.sweepAll(t)
	if len(crep.Collected) != 0 || irep.Classes[store.ClassReferenced] != 1 {
		t.Fatalf("S6: sweep after the publication: %+v %+v", crep, irep)
	}
	g.readBack(t, reqB.Digest, content)
}

// Schedule 6 (S1): a mount races the collection of its source's last
// reference. The mount checked the source reference before the decision
// and locks the blob row after it: refused retryably, so the client falls
// back to an upload; nothing references the deleted bytes.
func TestSchedule6MountRacingCollectionS1(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const content = "mounted away"
	src := g.uploadAndPublish(t, gcRepo, content)
	if _, err := g.st.ReferencedBlob(ctx, gcRepo, src.Digest); err != nil { // the mount's check
		t.Fatal(err)
	}
	if err := g.st.DeleteReference(ctx, gcRepo, src.Digest); err != nil {
		t.Fatal(err)
	}
	p := pausingEnqueuer{decided: make(chan struct{}), release: make(chan struct{}), rec: g.enq}
	collected := make(chan error, 1)
	go func() { _, err := g.collector(p).RunOnce(ctx); collected <- err }()
	<-p.decided
	mounted := make(chan error, 1)
	go func() { mounted <- g.mount(gcOther, src.Digest, src.Size) }()
	pgtest.WaitForLockWaiters(t, g.pool, 1) // the mount's publication waits on the blob row
	close(p.release)
	if err := <-collected; err != nil {
		t.Fatal(err)
	}
	if err := <-mounted; !errors.Is(err, store.ErrCollected) || !blobplane.IsRetryable(err) {
		t.Fatalf("mount after the decision: %v, want ErrCollected (retryable)", err)
	}
	g.runDeletions(t)
	if g.exists(t, src.Digest) {
		t.Fatal("L1: the collected bytes remain")
	}
	if g.count(t, `SELECT count(*) FROM blob_references WHERE digest = $1`, string(src.Digest)) != 0 {
		t.Fatal("S1: the mount referenced collected bytes")
	}
	// The fallback upload of the same bytes publishes.
	g.uploadAndPublish(t, gcOther, content)
	g.sweepAll(t)
	g.readBack(t, src.Digest, content)
}

// Schedule 13 (S1): a reference is deleted and re-added while the
// collection is deciding. The collector locked the row on a snapshot
// without the new claim; it re-checks ownership after its locks and backs
// off, and the re-publication proceeds.
func TestSchedule13ReferenceReaddedWhileDecidingS1(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const content = "deleted and re-added"
	first := g.dereferenced(t, content)
	// Hold the digest's placement lock, so the collector stops between
	// locking the candidate row and its re-check.
	hold, err := g.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx)
	if _, err := hold.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int4, hashtext($2::text))`, int32(0x706c6163), string(first.Digest)); err != nil {
		t.Fatal(err)
	}
	type result struct {
		rep sweep.CollectReport
		err error
	}
	collected := make(chan result, 1)
	go func() { r, err := g.collector(g.enq).RunOnce(ctx); collected <- result{r, err} }()
	pgtest.WaitForLockWaiters(t, g.pool, 1)
	// The reference comes back: a new attempt names the digest (its claim
	// commits) and publishes, waiting on the row the collector holds.
	in, err := g.st.CreateIntent(ctx, upload.NewIntent{Repository: gcRepo, Principal: gcPrincipal, ExpectedDigest: first.Digest, ExpectedSize: first.Size,
		IngressDatacenter: gcDC, Backend: "fs", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	published := make(chan error, 1)
	go func() {
		_, err := g.st.Finalize(ctx, g.request(in.OperationID, first.Digest, first.Size))
		published <- err
	}()
	pgtest.WaitForLockWaiters(t, g.pool, 2)
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-collected
	if r.err != nil || len(r.rep.Collected) != 0 {
		t.Fatalf("collector: %+v, %v; want nothing collected", r.rep, r.err)
	}
	if err := <-published; err != nil {
		t.Fatalf("re-publication: %v", err)
	}
	g.sweepAll(t)
	g.readBack(t, first.Digest, content)
	if g.count(t, `SELECT count(*) FROM blobs WHERE digest = $1 AND state = 'live'`, string(first.Digest)) != 1 {
		t.Fatal("the re-published digest is not live")
	}
}

type recordingRequeuer struct{ got []store.Deletion }

func (r *recordingRequeuer) EnqueueDeletions(_ context.Context, ds []store.Deletion) error {
	r.got = append(r.got, ds...)
	return nil
}

// Schedule 9 for the collector (L1): the decision commits, then its jobs
// are lost (a crash before any byte is deleted). The deletion records stay
// owed; the next pass re-enqueues them, reports their age, and the delete
// finishes.
func TestSchedule9CollectorCrashAfterDecisionResumesL1(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const content = "decided, then crashed"
	req := g.dereferenced(t, content)
	if got, err := g.st.CollectUnreferenced(ctx, 10, nil); err != nil || len(got) != 1 { // no jobs: lost
		t.Fatalf("decision: %+v, %v", got, err)
	}
	rq := &recordingRequeuer{}
	rep, err := (&sweep.Collector{Store: g.st, Enqueuer: g.enq, Requeuer: rq}).RunOnce(ctx)
	if err != nil || len(rep.Collected) != 0 || rep.Owed != 1 || rep.OldestOwed <= 0 || len(rq.got) != 1 {
		t.Fatalf("resumed pass: %+v, %v, requeued %+v", rep, err, rq.got)
	}
	if !g.exists(t, req.Digest) {
		t.Fatal("bytes deleted before any job ran")
	}
	if _, err := g.deleter().Delete(ctx, rq.got[0].Key); err != nil {
		t.Fatal(err)
	}
	if g.exists(t, req.Digest) {
		t.Fatal("L1: the collected bytes remain")
	}
	if rep, err := g.collector(g.enq).RunOnce(ctx); err != nil || rep.Owed != 0 {
		t.Fatalf("after the delete: %+v, %v", rep, err)
	}
}

// Schedule 8 for the collector: two collectors at once. The first holds
// its candidate row; the second skips it (SKIP LOCKED) and takes the
// other; every digest is decided exactly once.
func TestSchedule8TwoCollectorsDecideEachDigestOnce(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	var want []blobplane.Digest
	for _, c := range []string{"first unowned", "second unowned"} {
		req := g.uploadAndPublish(t, gcRepo, c)
		if err := g.st.DeleteReference(ctx, gcRepo, req.Digest); err != nil {
			t.Fatal(err)
		}
		want = append(want, req.Digest)
	}
	p := pausingEnqueuer{decided: make(chan struct{}), release: make(chan struct{}), rec: g.enq}
	first := make(chan []store.Collected, 1)
	go func() {
		got, err := g.st.CollectUnreferenced(ctx, 1, p)
		if err != nil {
			t.Error(err)
		}
		first <- got
	}()
	<-p.decided // the first collector holds one row, uncommitted
	second, err := g.st.CollectUnreferenced(ctx, 10, g.enq)
	if err != nil {
		t.Fatal(err)
	}
	close(p.release)
	got := append(<-first, second...)
	if len(got) != 2 || got[0].Digest == got[1].Digest {
		t.Fatalf("collected %+v, want each of %v once", got, want)
	}
	if n := g.count(t, `SELECT count(*) FROM deletions`); n != 2 {
		t.Fatalf("%d deletion records, want 2", n)
	}
}
