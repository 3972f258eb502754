package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// claimRig holds both of a Store's claim slots: two OpenAndStage calls
// wait on their digests' stage locks, held by another transaction, so the
// next claims queue for one batch; release commits that transaction.
type claimRig struct {
	u       *uploads
	holder  pgx.Tx
	queued  chan int
	holders sync.WaitGroup
}

func (u *uploads) newIntent(content, repo string) (upload.NewIntent, placement.Key) {
	d, size := contentOf([]byte(content))
	return upload.NewIntent{Repository: repo, Principal: upPrincipal, ExpectedDigest: d, ExpectedSize: size,
			IngressDatacenter: upDC, Backend: "fs", TTL: time.Hour},
		placement.Key{Digest: d, Backend: "fs", Datacenter: upDC, Location: d.Hex()}
}

// newIntents is newIntent of n contents named prefix 0, prefix 1, ...
func (u *uploads) newIntents(prefix string, n int) ([]upload.NewIntent, []placement.Key) {
	ns, ks := make([]upload.NewIntent, n), make([]placement.Key, n)
	for i := range n {
		ns[i], ks[i] = u.newIntent(fmt.Sprintf("%s %d", prefix, i), upRepo)
	}
	return ns, ks
}

func newClaimRig(t *testing.T) *claimRig {
	t.Helper()
	return newClaimRigOf(t, setupUploads(t))
}

// newClaimRigOf is newClaimRig on u.
func newClaimRigOf(t *testing.T, u *uploads) *claimRig {
	t.Helper()
	ctx := context.Background()
	r := &claimRig{u: u, queued: make(chan int, 64)}
	r.u.s.OnClaimQueuedForTest(func(n int) { r.queued <- n })
	tx, err := r.u.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.holder = tx
	t.Cleanup(func() {
		_ = tx.Rollback(context.Background())
		r.holders.Wait()
	})
	for i := range 2 {
		n, k := r.u.newIntent(fmt.Sprintf("claim holder %d", i), upRepo)
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int4, hashtext($2::text))`, store.PlacementDigestLockClass, string(k.Digest)); err != nil {
			t.Fatal(err)
		}
		r.holders.Go(func() {
			if _, staged, err := r.u.s.OpenAndStage(context.Background(), n, k); err != nil || !staged {
				t.Errorf("holder %d: staged %v, %v", i, staged, err)
			}
		})
	}
	pgtest.WaitForLockWaiters(t, r.u.pool, 2)
	return r
}

type claimAnswer struct {
	in     upload.Intent
	staged bool
	err    error
}

// openQueued runs OpenAndStage for each of ns, waits until all are queued
// behind the holders, releases them and returns each call's answer.
func (r *claimRig) openQueued(t *testing.T, ns []upload.NewIntent, ks []placement.Key) []claimAnswer {
	t.Helper()
	answers := make([]claimAnswer, len(ns))
	var wg sync.WaitGroup
	for i := range ns {
		wg.Go(func() {
			a := &answers[i]
			a.in, a.staged, a.err = r.u.s.OpenAndStage(context.Background(), ns[i], ks[i])
		})
	}
	for n := 0; n < len(ns); {
		n = <-r.queued
	}
	if err := r.holder.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.holders.Wait()
	wg.Wait()
	return answers
}

// Claims queued while both slots are busy commit in one implicit
// transaction, each as alone: its intent claiming its digest, its stage.
func TestClaimBatchCommitsQueuedClaimsTogether(t *testing.T) {
	t.Parallel()
	r := newClaimRig(t)
	u := r.u
	ns, ks := u.newIntents("claimed", 4)
	// One content twice: the second claim finds the first's stage.
	ns, ks = append(ns, ns[0]), append(ks, ks[0])
	before := u.s.ClaimBatchStats()
	answers := r.openQueued(t, ns, ks)
	stagedOnce := 0
	for i, a := range answers {
		if a.err != nil {
			t.Fatalf("claim %d: %v", i, a.err)
		}
		got, err := u.s.GetIntent(context.Background(), a.in.OperationID)
		if err != nil || got.State != upload.IntentPending || got.ExpectedDigest != ks[i].Digest {
			t.Fatalf("claim %d: intent %+v, %v", i, got, err)
		}
		if i == 0 || i == 4 {
			if a.staged {
				stagedOnce++
			}
		} else if !a.staged {
			t.Fatalf("claim %d not staged", i)
		}
		if p, err := u.s.Placement(context.Background(), ks[i]); err != nil || p.State != placement.Pending {
			t.Fatalf("claim %d: stage %+v, %v", i, p, err)
		}
	}
	if stagedOnce != 1 {
		t.Fatalf("one content claimed twice in a batch staged %d times", stagedOnce)
	}
	got := u.s.ClaimBatchStats()
	if got.Batches-before.Batches != 1 || got.Batched-before.Batched != int64(len(ns)) || got.Fallback != before.Fallback {
		t.Fatalf("stats %+v -> %+v: want one batch of %d", before, got, len(ns))
	}
	if got.Merged != before.Merged { // one digest twice: each claim's own statements
		t.Fatalf("stats %+v -> %+v: a batch with one digest twice was merged", before, got)
	}
}

// A batch of single-request claims of distinct digests sends each kind of
// statement once for all of them (merged) and answers each claim as
// alone: its intent, its stage, or no stage where its key had a row.
func TestClaimBatchMergesStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	// A key staged before the batch: its claim in the batch stages nothing.
	n0, k0 := u.newIntent("merged claim, staged before", upRepo)
	if _, staged, err := u.s.OpenAndStage(ctx, n0, k0); err != nil || !staged {
		t.Fatalf("first stage: %v, %v", staged, err)
	}
	r := newClaimRigOf(t, u)
	ns, ks := u.newIntents("merged claim", 4)
	ns, ks = append(ns, n0), append(ks, k0)
	before := u.s.ClaimBatchStats()
	answers := r.openQueued(t, ns, ks)
	ids := map[string]bool{}
	for i, a := range answers {
		if a.err != nil {
			t.Fatalf("claim %d: %v", i, a.err)
		}
		if a.staged != (i < 4) {
			t.Fatalf("claim %d: staged %v", i, a.staged)
		}
		got, err := u.s.GetIntent(ctx, a.in.OperationID)
		if err != nil || got.State != upload.IntentPending || got.ExpectedDigest != ks[i].Digest || got.ExpectedSize != ns[i].ExpectedSize ||
			got.Repository != upRepo || a.in.OperationID != got.OperationID || ids[got.OperationID] {
			t.Fatalf("claim %d: answered %+v, stored %+v, %v", i, a.in, got, err)
		}
		ids[got.OperationID] = true
		if p, err := u.s.Placement(ctx, ks[i]); err != nil || p.State != placement.Pending {
			t.Fatalf("claim %d: stage %+v, %v", i, p, err)
		}
	}
	got := u.s.ClaimBatchStats()
	if got.Batches-before.Batches != 1 || got.Merged-before.Merged != 1 || got.Fallback != before.Fallback {
		t.Fatalf("stats %+v -> %+v: want one merged batch", before, got)
	}
}

// A batch of OCI POSTs' intents (no digest yet) is one statement too,
// each intent with an operation id of its own.
func TestClaimBatchMergesIntents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newClaimRig(t)
	u := r.u
	before := u.s.ClaimBatchStats()
	ins := make([]upload.Intent, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range ins {
		wg.Go(func() {
			ins[i], errs[i] = u.s.CreateIntent(ctx, upload.NewIntent{Repository: upRepo, Principal: upPrincipal, ExpectedSize: upload.SizeUnknown,
				IngressDatacenter: upDC, Backend: "fs", TTL: time.Hour})
		})
	}
	for n := 0; n < len(ins); {
		n = <-r.queued
	}
	if err := r.holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r.holders.Wait()
	wg.Wait()
	ids := map[string]bool{}
	for i, in := range ins {
		if errs[i] != nil {
			t.Fatalf("intent %d: %v", i, errs[i])
		}
		got, err := u.s.GetIntent(ctx, in.OperationID)
		if err != nil || got.State != upload.IntentPending || got.ExpectedDigest != "" || got.ExpectedSize != upload.SizeUnknown ||
			got.StagedLocation != "" || ids[got.OperationID] || !got.ExpiresAt.After(got.CreatedAt) {
			t.Fatalf("intent %d: answered %+v, stored %+v, %v", i, in, got, err)
		}
		ids[got.OperationID] = true
	}
	got := u.s.ClaimBatchStats()
	if got.Batches-before.Batches != 1 || got.Merged-before.Merged != 1 {
		t.Fatalf("stats %+v -> %+v: want one merged batch", before, got)
	}
}

// A claim that fails rolls its batch back; each claim is then sent alone:
// the failing one gets its own error and records nothing, the others
// commit.
func TestClaimBatchFailureSendsEachAlone(t *testing.T) {
	t.Parallel()
	r := newClaimRig(t)
	u := r.u
	ns, ks := u.newIntents("fallback claim", 3)
	ns[1].Repository = "team/none" // no such repository
	before := u.s.ClaimBatchStats()
	answers := r.openQueued(t, ns, ks)
	if blobplane.ErrorCode(answers[1].err) != blobplane.CodeNotFound {
		t.Fatalf("claim into an unknown repository: %+v, %v; want not_found", answers[1].in, answers[1].err)
	}
	if n := u.count(t, `SELECT count(*) FROM placements WHERE digest = $1`, string(ks[1].Digest)); n != 0 {
		t.Fatalf("the failed claim staged %d placements", n)
	}
	for _, i := range []int{0, 2} {
		if answers[i].err != nil || !answers[i].staged {
			t.Fatalf("claim %d: staged %v, %v", i, answers[i].staged, answers[i].err)
		}
	}
	got := u.s.ClaimBatchStats()
	if got.Batches != before.Batches || got.Fallback-before.Fallback != 3 {
		t.Fatalf("stats %+v -> %+v: want no batch and 3 claims alone", before, got)
	}
}

// Two stores (two api processes) whose claim batches hold the same two
// digests in opposite arrival orders do not deadlock: a batch sends its
// claims in digest order, so both wait for the first digest's stage lock
// before taking the second. (Sent in arrival order, the batch that gets
// the first digest would wait for the second, held by the other, which
// waits for the first: Postgres would abort one after deadlock_timeout
// and its claims would run alone.)
func TestClaimBatchesTakeDigestsInOneOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	sa, sb := u.s, store.New(u.pool, nil)
	qa, qb := make(chan int, 8), make(chan int, 8)
	sa.OnClaimQueuedForTest(func(n int) { qa <- n })
	sb.OnClaimQueuedForTest(func(n int) { qb <- n })

	// Digest order: x before y.
	n1, k1 := u.newIntent("order one", upRepo)
	n2, k2 := u.newIntent("order two", upRepo)
	if k2.Digest < k1.Digest {
		n1, k1, n2, k2 = n2, k2, n1, k1
	}
	lockTx := func(ds ...blobplane.Digest) pgx.Tx {
		tx, err := u.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		for _, d := range ds {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int4, hashtext($2::text))`, store.PlacementDigestLockClass, string(d)); err != nil {
				t.Fatal(err)
			}
		}
		return tx
	}
	waiters := func(d blobplane.Digest) int {
		return u.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1 AND objid::bigint = (hashtext($2)::bigint + 4294967296) % 4294967296`, store.PlacementDigestLockClass, string(d))
	}
	waitFor := func(what string, ok func() bool) {
		deadline := time.Now().Add(15 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond) // poll interval
		}
	}

	var wg sync.WaitGroup
	claim := func(s *store.Store, n upload.NewIntent, k placement.Key) {
		wg.Go(func() {
			if _, _, err := s.OpenAndStage(context.Background(), n, k); err != nil {
				t.Errorf("claim of %s: %v", k.Digest, err)
			}
		})
	}
	// Each store's two slots are held by claims waiting on locks of other
	// digests; then its batch queues: B's as x, y; A's as y, x.
	holdSlots := func(s *store.Store, q chan int, prefix string, first, second upload.NewIntent, kf, ks placement.Key) pgx.Tx {
		hn, hk := u.newIntents(prefix, 2)
		tx := lockTx(hk[0].Digest, hk[1].Digest)
		for i := range 2 {
			claim(s, hn[i], hk[i])
			waitFor("a slot holder to wait", func() bool { return waiters(hk[i].Digest) == 1 })
		}
		claim(s, first, kf)
		<-q
		claim(s, second, ks)
		<-q
		return tx
	}
	txX := lockTx(k1.Digest)
	txB := holdSlots(sb, qb, "slots of b", n1, n2, k1, k2)
	txA := holdSlots(sa, qa, "slots of a", n2, n1, k2, k1)

	// B's batch goes first and waits for x; then A's, which waits for x
	// behind it (sent in arrival order it would hold y by then).
	if err := txB.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("b's batch to wait for x", func() bool { return waiters(k1.Digest) == 1 })
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("a's batch to wait for x", func() bool { return waiters(k1.Digest) == 2 })
	if err := txX.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	wantOneBatchOfTwo(t, (*store.Store).ClaimBatchStats, map[string]*store.Store{"a": sa, "b": sb})
}

// wantOneBatchOfTwo checks that each store sent its two calls as one batch
// with no fallback (the fallback of a batch Postgres aborted as a
// deadlock): the end of the digest-order tests.
func wantOneBatchOfTwo(t *testing.T, stats func(*store.Store) store.BatchStats, stores map[string]*store.Store) {
	t.Helper()
	for name, s := range stores {
		if st := stats(s); st.Batches != 1 || st.Batched != 2 || st.Fallback != 0 {
			t.Errorf("store %s: %+v, want one batch of 2 and no fallback (a deadlock)", name, st)
		}
	}
}
