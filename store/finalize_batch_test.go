package store_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// batchRig holds both of a Store's publishing slots with two Finalize
// calls parked in their BeforeCommit (transactions open, nothing
// committed), so that the next calls queue for one batch; release lets
// the two commit, and the head of the queue then takes the queue.
type batchRig struct {
	u       *uploads
	s       *store.Store
	release chan struct{}
	holders sync.WaitGroup
	queued  chan int
}

func newBatchRig(t *testing.T) *batchRig {
	t.Helper()
	u := setupUploads(t)
	return parkFinalizeSlots(t, u, u.s, "holder")
}

// parkFinalizeSlots parks two Finalize calls of s (contents prefix 0 and
// prefix 1) in their BeforeCommit.
func parkFinalizeSlots(t *testing.T, u *uploads, s *store.Store, prefix string) *batchRig {
	t.Helper()
	r := &batchRig{u: u, s: s, release: make(chan struct{}), queued: make(chan int, 64)}
	s.OnFinalizeQueuedForTest(func(n int) { r.queued <- n })
	parked := make(chan struct{}, 2)
	for i, req := range u.closings(t, prefix, 2) {
		req.BeforeCommit = func() error {
			parked <- struct{}{}
			<-r.release
			return nil
		}
		r.holders.Go(func() {
			if out, err := s.Finalize(context.Background(), req); err != nil || !out.NewReference {
				t.Errorf("holder %d: %+v, %v", i, out, err)
			}
		})
	}
	<-parked
	<-parked
	t.Cleanup(r.unpark)
	return r
}

// unpark lets the parked calls commit (once).
func (r *batchRig) unpark() {
	select {
	case <-r.release:
	default:
		close(r.release)
	}
	r.holders.Wait()
}

// closings is closing of n contents named prefix 0, prefix 1, ...
func (u *uploads) closings(t *testing.T, prefix string, n int) []upload.FinalizeRequest {
	t.Helper()
	reqs := make([]upload.FinalizeRequest, n)
	for i := range n {
		_, reqs[i] = u.closing(t, fmt.Sprintf("%s %d", prefix, i))
	}
	return reqs
}

// finalizeQueued starts Finalize for each of reqs, waits until all of
// them are queued behind the holders, releases the holders and returns
// each call's answer.
func (r *batchRig) finalizeQueued(t *testing.T, reqs []upload.FinalizeRequest) ([]upload.Outcome, []error) {
	t.Helper()
	outs, errs := make([]upload.Outcome, len(reqs)), make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Go(func() { outs[i], errs[i] = r.s.Finalize(context.Background(), req) })
	}
	for n := 0; n < len(reqs); {
		n = <-r.queued
	}
	r.unpark()
	wg.Wait()
	return outs, errs
}

// Finalize calls that arrive while both slots are busy are published in
// one transaction, each exactly as alone: its outcome, its reference, its
// verification; a retry of an operation in the same batch gets the stored
// outcome, and one content uploaded to two repositories is published in
// both.
func TestFinalizeBatchPublishesQueuedCallsTogether(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newBatchRig(t)
	u := r.u
	if err := u.s.CreateRepository(ctx, "team/other"); err != nil {
		t.Fatal(err)
	}
	reqs := u.closings(t, "batched", 4)
	reqs = append(reqs, reqs[0]) // the same operation twice in one batch
	// The same content as reqs[1], in another repository: its placement
	// is verified by then (in this batch), its blob row exists.
	twin := u.open(t, "team/other")
	k := reqs[1].Verify.Key
	if st, err := u.s.ClaimAndStage(ctx, twin.OperationID, k, reqs[1].Size); err != nil || st.AlreadyVerified {
		t.Fatalf("twin claim: already verified %v, %v", st.AlreadyVerified, err)
	}
	twinReq := reqs[1]
	twinReq.OperationID = twin.OperationID
	reqs = append(reqs, twinReq)

	before := u.s.FinalizeBatchStats()
	outs, errs := r.finalizeQueued(t, reqs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if outs[i].OperationID != reqs[i].OperationID || outs[i].Digest != reqs[i].Digest {
			t.Fatalf("call %d: outcome %+v for %s", i, outs[i], reqs[i].OperationID)
		}
	}
	if !reflect.DeepEqual(outs[4], outs[0]) {
		t.Fatalf("the retry in the batch got %+v, the first %+v", outs[4], outs[0])
	}
	if !outs[1].NewReference || !outs[5].NewReference || outs[5].Repository != "team/other" {
		t.Fatalf("one content, two repositories: %+v and %+v", outs[1], outs[5])
	}
	got := u.s.FinalizeBatchStats()
	if got.Batches-before.Batches != 1 || got.Batched-before.Batched != int64(len(reqs)) || got.Fallback != before.Fallback {
		t.Fatalf("stats %+v -> %+v: want one batch of %d", before, got, len(reqs))
	}
	if got.Merged != before.Merged { // one digest twice: each call's own statements
		t.Fatalf("stats %+v -> %+v: a batch with one digest twice was merged", before, got)
	}
	// 2 holders + 4 uploads + the twin; the retry published nothing new.
	wantPublished(t, u, reqs, 7)
}

// wantPublished checks that each of reqs published (its intent admitted,
// its placement verified) and that the store holds outcomes outcomes and
// as many references.
func wantPublished(t *testing.T, u *uploads, reqs []upload.FinalizeRequest, outcomes int) {
	t.Helper()
	if n := u.outcomes(t); n != outcomes {
		t.Fatalf("%d outcomes, want %d", n, outcomes)
	}
	if n := u.references(t); n != outcomes {
		t.Fatalf("%d references, want %d", n, outcomes)
	}
	for _, req := range reqs {
		if n := u.count(t, `SELECT count(*) FROM placements WHERE digest = $1 AND state = 'verified'`, string(req.Digest)); n != 1 {
			t.Fatalf("%s: %d verified placements", req.Digest, n)
		}
		if n := u.count(t, `SELECT count(*) FROM intents WHERE operation_id = $1 AND state = 'admitted'`, req.OperationID); n != 1 {
			t.Fatalf("%s: not admitted", req.OperationID)
		}
	}
}

// A batch of calls on the common path, one digest each, sends each of
// Finalize's statements once for all of them (merged) and answers each
// call as alone: its own outcome, reference and verification; a retry of
// an operation published before the batch gets its stored outcome.
func TestFinalizeBatchMergesStatements(t *testing.T) {
	t.Parallel()
	u := setupUploads(t)
	_, done := u.closing(t, "published before")
	first, err := u.s.Finalize(context.Background(), done)
	if err != nil {
		t.Fatal(err)
	}
	r := parkFinalizeSlots(t, u, u.s, "holder")
	reqs := append(u.closings(t, "merged", 4), done)
	before := u.s.FinalizeBatchStats()
	outs, errs := r.finalizeQueued(t, reqs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if outs[i].OperationID != reqs[i].OperationID || outs[i].Digest != reqs[i].Digest || outs[i].Size != reqs[i].Size ||
			outs[i].Repository != upRepo || !outs[i].NewReference {
			t.Fatalf("call %d: outcome %+v for %s (%s)", i, outs[i], reqs[i].OperationID, reqs[i].Digest)
		}
	}
	if !reflect.DeepEqual(outs[4], first) {
		t.Fatalf("the retry in the batch got %+v, its first answer was %+v", outs[4], first)
	}
	got := u.s.FinalizeBatchStats()
	if got.Batches-before.Batches != 1 || got.Batched-before.Batched != int64(len(reqs)) || got.Merged-before.Merged != 1 || got.Fallback != before.Fallback {
		t.Fatalf("stats %+v -> %+v: want one merged batch of %d", before, got, len(reqs))
	}
	// 2 holders + the one published before + 4 uploads.
	wantPublished(t, u, reqs, 7)
}

// An api configured with its replication targets (BLOBPLANE_REPLICATE_TO;
// the bench's "none") sends them with every Finalize: a batch whose calls
// all name the same targets is merged as one on the default policy is, and
// each call stores and enqueues exactly its own. Calls whose targets
// differ (one on the default policy) each send their own statements.
func TestFinalizeBatchMergesCallsWithTheSameTargets(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		targets [][]string // per call
		merged  bool
	}{
		{"none", [][]string{{}, {}, {}}, true},
		{"listed", [][]string{{"ap-1", "us-1"}, {"ap-1", "us-1"}, {"ap-1", "us-1"}}, true},
		{"different", [][]string{{"us-1"}, {"ap-1"}, {"us-1"}}, false},
		{"one on the default policy", [][]string{{}, nil, {}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newBatchRig(t)
			u := r.u
			reqs := u.closings(t, tc.name, len(tc.targets))
			for i := range reqs {
				reqs[i].Targets = tc.targets[i]
			}
			before := u.s.FinalizeBatchStats()
			outs, errs := r.finalizeQueued(t, reqs)
			got := u.s.FinalizeBatchStats()
			if got.Batches-before.Batches != 1 || got.Merged-before.Merged != map[bool]int64{true: 1}[tc.merged] {
				t.Fatalf("stats %+v -> %+v: want one batch, merged %v", before, got, tc.merged)
			}
			for i, err := range errs {
				want := tc.targets[i]
				if want == nil {
					want = []string{} // no other datacenter is registered
				}
				if err != nil || !slices.Equal(outs[i].ReplicationTargets, want) {
					t.Fatalf("call %d: %+v, %v; want replication targets %q", i, outs[i], err, want)
				}
				if n := u.count(t, `SELECT count(*) FROM river_job WHERE kind = 'replicate' AND args->>'operation_id' = $1`,
					reqs[i].OperationID); n != len(want) {
					t.Fatalf("call %d: %d replication jobs, want %d", i, n, len(want))
				}
			}
			wantPublished(t, u, reqs, 2+len(reqs))
		})
	}
}

// A refusal in a batch rolls the batch back and every call runs alone: the
// refused one gets its refusal and stores nothing, the others publish.
func TestFinalizeBatchRefusalRunsEachAlone(t *testing.T) {
	t.Parallel()
	r := newBatchRig(t)
	u := r.u
	reqs := u.closings(t, "fallback", 3)
	reqs[1].Size++ // not the content the upload declared
	before := u.s.FinalizeBatchStats()
	outs, errs := r.finalizeQueued(t, reqs)
	if !errors.Is(errs[1], upload.ErrContentIdentity) {
		t.Fatalf("refused call: %+v, %v; want the content identity refusal", outs[1], errs[1])
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil || !outs[i].NewReference {
			t.Fatalf("call %d: %+v, %v", i, outs[i], errs[i])
		}
	}
	got := u.s.FinalizeBatchStats()
	if got.Batches != before.Batches || got.Fallback-before.Fallback != 3 {
		t.Fatalf("stats %+v -> %+v: want no batch and 3 calls alone", before, got)
	}
	if n := u.count(t, `SELECT count(*) FROM operation_outcomes WHERE operation_id = $1`, reqs[1].OperationID); n != 0 {
		t.Fatalf("the refused call stored %d outcomes", n)
	}
	if n := u.outcomes(t); n != 4 {
		t.Fatalf("%d outcomes, want 4 (2 holders, 2 calls)", n)
	}
}

// A BeforeCommit that fails (the bytes not durable) fails its own call
// only, which commits nothing, and is waited for once.
func TestFinalizeBatchBeforeCommitFailure(t *testing.T) {
	t.Parallel()
	r := newBatchRig(t)
	u := r.u
	reqs := u.closings(t, "durability", 3)
	errSync := errors.New("sync failed")
	var calls int
	var mu sync.Mutex
	reqs[2].BeforeCommit = func() error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return errSync
	}
	outs, errs := r.finalizeQueued(t, reqs)
	if !errors.Is(errs[2], errSync) {
		t.Fatalf("call 2: %+v, %v; want its BeforeCommit's error", outs[2], errs[2])
	}
	if calls != 1 {
		t.Fatalf("BeforeCommit ran %d times", calls)
	}
	for _, i := range []int{0, 1} {
		if errs[i] != nil || !outs[i].NewReference {
			t.Fatalf("call %d: %+v, %v", i, outs[i], errs[i])
		}
	}
	if n := u.count(t, `SELECT count(*) FROM intents WHERE operation_id = $1 AND state = 'pending'`, reqs[2].OperationID); n != 1 {
		t.Fatal("the call whose bytes are not durable left its intent")
	}
}

// Two stores (two api processes) whose Finalize batches hold the same two
// digests in opposite arrival orders do not deadlock: a batch publishes
// in digest order, so both wait for the first digest's placement row
// before taking the second's. (In arrival order, the batch that gets the
// first digest would wait for the second's row, held by the other, which
// waits for the first: Postgres would abort one after deadlock_timeout
// and its calls would run alone.)
func TestFinalizeBatchesTakeDigestsInOneOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	sa, sb := u.s, store.New(u.pool, nil)
	// Each store publishes both contents, through intents of its own.
	var xa, ya, xb, yb upload.FinalizeRequest
	_, xa = u.closing(t, "order x")
	_, ya = u.closing(t, "order y")
	if ya.Digest < xa.Digest {
		xa, ya = ya, xa
	}
	for _, pair := range []struct{ from, to *upload.FinalizeRequest }{{&xa, &xb}, {&ya, &yb}} {
		in := u.open(t, upRepo)
		k := pair.from.Verify.Key
		if _, err := u.s.ClaimAndStage(ctx, in.OperationID, k, pair.from.Size); err != nil {
			t.Fatal(err)
		}
		*pair.to = *pair.from
		pair.to.OperationID = in.OperationID
	}
	// x's placement row is locked until the two batches wait for it.
	tx, err := u.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck
	if _, err := tx.Exec(ctx, `SELECT 1 FROM placements WHERE digest = $1 FOR UPDATE`, string(xa.Digest)); err != nil {
		t.Fatal(err)
	}
	ra := parkFinalizeSlots(t, u, sa, "slots of a")
	rb := parkFinalizeSlots(t, u, sb, "slots of b")
	var wg sync.WaitGroup
	queue := func(r *batchRig, reqs ...upload.FinalizeRequest) {
		for _, req := range reqs {
			wg.Go(func() {
				if _, err := r.s.Finalize(context.Background(), req); err != nil {
					t.Errorf("finalize %s: %v", req.Digest, err)
				}
			})
			<-r.queued
		}
	}
	queue(rb, xb, yb)
	queue(ra, ya, xa)
	// B's batch goes first and waits for x's row; then A's, which waits
	// for it behind B (in arrival order it would hold y's by then).
	rb.unpark()
	pgtest.WaitForLockWaiters(t, u.pool, 1)
	ra.unpark()
	pgtest.WaitForLockWaiters(t, u.pool, 2)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	wantOneBatchOfTwo(t, (*store.Store).FinalizeBatchStats, map[string]*store.Store{"a": sa, "b": sb})
	if n := u.outcomes(t); n != 8 {
		t.Fatalf("%d outcomes, want 8 (4 holders, 2 contents in 2 intents each)", n)
	}
}
