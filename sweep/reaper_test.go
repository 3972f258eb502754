package sweep_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/sweep"
	"github.com/blobplane/blobplane/upload"
)

const (
	repo = "team/app"
	dc   = "eu-1"
)

type bundle struct {
	st *store.Store
	db *pgtest.DB
	be *fs.Backend
}

// setup gives a store with one repository and a real filesystem backend.
func setup(t *testing.T) *bundle {
	t.Helper()
	d := pgtest.New(t)
	st := store.New(d.Pool, nil)
	if err := st.CreateRepository(context.Background(), repo); err != nil {
		t.Fatal(err)
	}
	be, err := fs.Open(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return &bundle{st: st, db: d, be: be}
}

func (b *bundle) reaper(del sweep.StagedDeleter, batch int) *sweep.Reaper {
	return &sweep.Reaper{Store: b.st, Backends: map[string]sweep.StagedDeleter{"fs": del}, Datacenter: dc, Batch: batch}
}

// upload is the factory for an upload the way the OCI handler runs it:
// the intent commits, then the backend stages content under its own id.
func (b *bundle) upload(t *testing.T, content string, expired bool) upload.Intent {
	t.Helper()
	ctx := context.Background()
	in, err := b.st.CreateIntent(ctx, upload.NewIntent{Repository: repo, Principal: "alice", ExpectedSize: upload.SizeUnknown,
		IngressDatacenter: dc, Backend: "fs", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	id, err := b.be.CreateUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n, err := b.be.AppendUpload(ctx, id, 0, strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	if in, err = b.st.ExtendIntent(ctx, in.OperationID, id, n, time.Hour); err != nil {
		t.Fatal(err)
	}
	if expired {
		if _, err := b.db.Pool.Exec(ctx, `UPDATE intents SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' WHERE operation_id = $1`, in.OperationID); err != nil {
			t.Fatal(err)
		}
	}
	return in
}

func (b *bundle) stagedExists(t *testing.T, in upload.Intent) bool {
	t.Helper()
	_, err := b.be.UploadSize(context.Background(), in.StagedLocation)
	if errors.Is(err, backend.ErrNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

func (b *bundle) state(t *testing.T, in upload.Intent) upload.IntentState {
	t.Helper()
	cur, err := b.st.GetIntent(context.Background(), in.OperationID)
	if err != nil {
		t.Fatal(err)
	}
	return cur.State
}

func TestReaperReclaimsExpiredUploadsInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	var expired []upload.Intent
	for range 3 {
		expired = append(expired, b.upload(t, "abandoned bytes", true))
	}
	fresh := b.upload(t, "still writing", false)
	reg := prometheus.NewRegistry()
	r := b.reaper(b.be, 2)
	r.Metrics = sweep.NewMetrics(reg)

	dry, err := r.RunOnce(ctx, true)
	if err != nil || !dry.DryRun || len(dry.Reaped) != 2 || len(dry.Deleted) != 2 || dry.BytesReclaimed != 2*int64(len("abandoned bytes")) { // would
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	for _, in := range append(expired, fresh) {
		if b.state(t, in) != upload.IntentPending || !b.stagedExists(t, in) {
			t.Fatal("the dry run changed something")
		}
	}
	if metric(t, reg, "blobplane_sweep_intents_reaped_total") != 0 {
		t.Fatal("the dry run counted reaps")
	}

	var reaped, bytes int64
	for _, want := range []int{2, 1, 0} {
		rep, err := r.RunOnce(ctx, false)
		if err != nil || len(rep.Reaped) != want || len(rep.Deleted) != want || rep.Failed != 0 {
			t.Fatalf("pass: %+v, %v; want %d reaped", rep, err, want)
		}
		reaped += int64(len(rep.Reaped))
		bytes += rep.BytesReclaimed
	}
	if reaped != 3 || bytes != 3*int64(len("abandoned bytes")) {
		t.Fatalf("reaped %d, %d bytes", reaped, bytes)
	}
	for _, in := range expired {
		if b.state(t, in) != upload.IntentAbandoned || b.stagedExists(t, in) {
			t.Fatalf("expired upload %s: %s, staged bytes remain: %v", in.OperationID, b.state(t, in), b.stagedExists(t, in))
		}
	}
	if b.state(t, fresh) != upload.IntentPending || !b.stagedExists(t, fresh) {
		t.Fatal("a live upload was reaped")
	}
	if got := metric(t, reg, "blobplane_sweep_intents_reaped_total"); got != 3 {
		t.Fatalf("reaped counter %v", got)
	}
	if got := metric(t, reg, "blobplane_sweep_reclaimed_bytes_total"); got != float64(bytes) {
		t.Fatalf("bytes counter %v", got)
	}
	if got := metric(t, reg, "blobplane_sweep_oldest_overdue_seconds"); got != 0 {
		t.Fatalf("oldest overdue %v after the backlog drained", got)
	}
}

// Schedule 8, driven deterministically (issue 27): a reaper mid-pass
// holds the rows of its batch (here a connection that locked them FOR
// UPDATE, as ReapExpiredIntents' claim does, and has not committed); a
// second reaper running meanwhile skips them without waiting and reaps
// every other expired intent; once the first commits its decision, no
// pass reaps those rows again. Every intent is reaped exactly once.
func TestTwoReapersSkipEachOthersBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	var all []upload.Intent
	for range 8 {
		all = append(all, b.upload(t, "x", true))
	}
	held := map[string]bool{all[0].OperationID: true, all[1].OperationID: true, all[2].OperationID: true}
	first, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	ids := []string{all[0].OperationID, all[1].OperationID, all[2].OperationID}
	if _, err := first.Exec(ctx, `SELECT 1 FROM intents WHERE operation_id = ANY($1::uuid[]) FOR UPDATE`, ids); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	second := b.reaper(b.be, 100)
	rep, err := second.RunOnce(ctx, false) // returns: SKIP LOCKED never waits for the held rows
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range rep.Reaped {
		if held[in.OperationID] {
			t.Fatalf("the second reaper reaped %s, held by the first", in.OperationID)
		}
		seen[in.OperationID]++
	}
	if len(seen) != len(all)-len(held) {
		t.Fatalf("the second reaper reaped %d, want the %d not held", len(seen), len(all)-len(held))
	}
	// The first decides its batch and commits.
	if _, err := first.Exec(ctx, `UPDATE intents SET state = 'abandoned', updated_at = now() WHERE operation_id = ANY($1::uuid[])`, ids); err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		seen[id]++
	}
	rep, err = second.RunOnce(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range rep.Reaped {
		seen[in.OperationID]++
	}
	for _, in := range all {
		if seen[in.OperationID] != 1 {
			t.Fatalf("%s reaped %d times", in.OperationID, seen[in.OperationID])
		}
	}
}

// Schedule 8: two reapers at once reap every intent exactly once and never
// fail on each other's deletes.
func TestTwoReapersConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const n = 24
	for range n {
		b.upload(t, "x", true)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 2 {
		r := b.reaper(b.be, 5)
		wg.Go(func() {
			<-start
			for {
				rep, err := r.RunOnce(ctx, false)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, in := range rep.Reaped {
					seen[in.OperationID]++
				}
				mu.Unlock()
				if len(rep.Reaped) == 0 {
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("%d intents reaped, want %d", len(seen), n)
	}
	for op, c := range seen {
		if c != 1 {
			t.Fatalf("%s reaped %d times", op, c)
		}
	}
	waiting, err := b.st.UndeletedStagedIntents(ctx, dc, 100)
	if err != nil || len(waiting) != 0 {
		t.Fatalf("%d staged uploads undeleted, %v", len(waiting), err)
	}
}

// crashingDeleter stands for a reaper process that dies after the
// abandonment committed, before the staged bytes are deleted: the pass's
// context ends (as on SIGKILL nothing after this point runs) and the
// delete never happens.
type crashingDeleter struct{ die context.CancelFunc }

func (c crashingDeleter) AbortUpload(ctx context.Context, _ string) error {
	c.die()
	return ctx.Err()
}

// Schedule 9: a sweep crashes after the decision, before deleting bytes;
// the next pass resumes from the durable record.
func TestReaperCrashAfterDecisionResumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	in := b.upload(t, "orphan to be", true)
	pass, die := context.WithCancel(ctx)
	if _, err := b.reaper(crashingDeleter{die: die}, 10).RunOnce(pass, false); !errors.Is(err, context.Canceled) {
		t.Fatalf("the crashing pass: %v, want it cut short", err)
	}
	if b.state(t, in) != upload.IntentAbandoned || !b.stagedExists(t, in) {
		t.Fatal("want the decision committed and the bytes still staged")
	}
	rep, err := b.reaper(b.be, 10).RunOnce(ctx, false)
	if err != nil || len(rep.Reaped) != 0 || len(rep.Deleted) != 1 || rep.Deleted[0].OperationID != in.OperationID {
		t.Fatalf("resumed pass: %+v, %v", rep, err)
	}
	if b.stagedExists(t, in) {
		t.Fatal("the resumed pass left the staged bytes")
	}
	if rep, err := b.reaper(b.be, 10).RunOnce(ctx, false); err != nil || len(rep.Deleted) != 0 {
		t.Fatalf("a finished delete was repeated: %+v, %v", rep, err)
	}
}

// flakyDeleter fails its first failures calls with a transient error.
type flakyDeleter struct {
	sweep.StagedDeleter
	failures atomic.Int32
}

func (f *flakyDeleter) AbortUpload(ctx context.Context, id string) error {
	if f.failures.Add(-1) >= 0 {
		return backend.Unavailable("flaky", nil, "store overloaded")
	}
	return f.StagedDeleter.AbortUpload(ctx, id)
}

// Schedule 10: a byte delete fails transiently and is retried by the next
// pass; an upload a handler abandoned but could not abort is retried too.
func TestReaperRetriesFailedDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	in := b.upload(t, "stubborn", true)
	cancelled := b.upload(t, "cancelled by the client", false)
	if _, err := b.st.AbandonIntent(ctx, cancelled.OperationID); err != nil {
		t.Fatal(err)
	}
	flaky := &flakyDeleter{StagedDeleter: b.be}
	flaky.failures.Store(2)
	r := b.reaper(flaky, 10)
	rep, err := r.RunOnce(ctx, false)
	if !errors.Is(err, sweep.ErrDeleteFailed) || rep.Failed != 2 || len(rep.Reaped) != 1 || len(rep.Deleted) != 0 {
		t.Fatalf("failing pass: %+v, %v", rep, err)
	}
	if !b.stagedExists(t, in) || !b.stagedExists(t, cancelled) {
		t.Fatal("bytes vanished although the deletes failed")
	}
	rep, err = r.RunOnce(ctx, false)
	if err != nil || rep.Failed != 0 || len(rep.Deleted) != 2 {
		t.Fatalf("retry pass: %+v, %v", rep, err)
	}
	if b.stagedExists(t, in) || b.stagedExists(t, cancelled) {
		t.Fatal("the retry left staged bytes")
	}
}

// Schedule 11: the staged bytes of an abandoned attempt at the content a
// published upload holds never touch the content-addressed object (S6):
// staged keys are per upload, named by the backend.
func TestReaperSparesPublishedObjectOfSameContent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const content = "the same bytes twice"
	sum := sha256.Sum256([]byte(content))
	d := blobplane.Digest(blobplane.DigestPrefix + hex.EncodeToString(sum[:]))

	published := b.upload(t, content, false)
	if _, err := b.be.PromoteUpload(ctx, published.StagedLocation, backend.WriteRequest{Digest: d, Size: int64(len(content))}); err != nil {
		t.Fatal(err)
	}
	abandoned := b.upload(t, content, true)
	if abandoned.StagedLocation == published.StagedLocation {
		t.Fatal("two attempts share a staged key")
	}
	rep, err := b.reaper(b.be, 10).RunOnce(ctx, false)
	if err != nil || len(rep.Deleted) != 1 || rep.Deleted[0].OperationID != abandoned.OperationID {
		t.Fatalf("reap: %+v, %v", rep, err)
	}
	obj, err := b.be.Read(ctx, d, backend.ReadOptions{})
	if err != nil {
		t.Fatalf("published object after the reap: %v", err)
	}
	defer obj.Body.Close()
	got, err := io.ReadAll(obj.Body)
	if err != nil || !bytes.Equal(got, []byte(content)) {
		t.Fatalf("published object reads %q, %v", got, err)
	}
}

// metric sums the samples of the named series in reg.
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return v
}
