package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/jobs"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// chainRequest is the Finalize request of a chained close of n at k,
// before its operation id is known.
func (u *uploads) chainRequest(n upload.NewIntent, k placement.Key) upload.FinalizeRequest {
	return upload.FinalizeRequest{Digest: n.ExpectedDigest, Size: n.ExpectedSize,
		Partition: upPartition, Node: upNode, Epoch: u.lease.Epoch,
		Replication: jobs.Replication{Client: u.river},
		Verify:      &upload.Verification{Key: k, Digest: n.ExpectedDigest, Size: n.ExpectedSize}, Proven: true}
}

// chain starts a chained close of content and waits for its claim.
func (u *uploads) chain(t *testing.T, content string) (upload.Chain, upload.Intent, upload.FinalizeRequest) {
	t.Helper()
	return u.chainWith(t, content, func(*upload.FinalizeRequest) {})
}

// chainWith is chain with the request edited by edit first.
func (u *uploads) chainWith(t *testing.T, content string, edit func(*upload.FinalizeRequest)) (upload.Chain, upload.Intent, upload.FinalizeRequest) {
	t.Helper()
	n, k := u.newIntent(content, upRepo)
	req := u.chainRequest(n, k)
	edit(&req)
	ch := u.s.ChainOpenAndStage(context.Background(), n, k, req)
	if ch == nil {
		t.Fatal("an idle store did not chain the close")
	}
	t.Cleanup(ch.Release)
	in, staged, err := ch.Claim()
	if err != nil || !staged {
		t.Fatalf("chained claim: staged %v, %v", staged, err)
	}
	req.OperationID = in.OperationID
	return ch, in, req
}

// A chained close (the claim and Finalize's statements sent at once on
// one connection) answers as OpenAndStage then Finalize would: the
// claim commits on its own, before Finalize's transaction, whose writes
// nobody sees before its COMMIT, which waits for BeforeCommit.
func TestChainedClosePublishes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	ch, in, req := u.chain(t, "chained close")

	// The claim committed: another connection sees the intent and the
	// stage; Finalize's writes, made already, are not visible.
	if got, err := u.s.GetIntent(ctx, in.OperationID); err != nil || got.State != upload.IntentPending || got.ExpectedDigest != req.Digest {
		t.Fatalf("intent after the claim: %+v, %v", got, err)
	}
	if p, err := u.s.Placement(ctx, req.Verify.Key); err != nil || p.State != placement.Pending {
		t.Fatalf("stage after the claim: %+v, %v", p, err)
	}
	before := func() error {
		if n := u.outcomes(t); n != 0 {
			t.Errorf("%d outcomes visible before the commit", n)
		}
		if p, err := u.s.Placement(ctx, req.Verify.Key); err != nil || p.State != placement.Pending {
			t.Errorf("placement before the commit: %+v, %v", p, err)
		}
		return nil
	}
	req.BeforeCommit = before
	out, err := ch.Finalize(ctx, req)
	if err != nil || !out.NewReference || out.OperationID != in.OperationID || out.Repository != upRepo {
		t.Fatalf("chained finalize: %+v, %v", out, err)
	}
	wantPublished(t, u, []upload.FinalizeRequest{req}, 1)
	if got, err := u.s.Outcome(ctx, in.OperationID); err != nil || got.OperationID != out.OperationID || !got.PublishedAt.Equal(out.PublishedAt) {
		t.Fatalf("stored outcome %+v, %v; answered %+v", got, err, out)
	}
	if n := u.s.ChainedCloses(); n != 1 {
		t.Fatalf("%d chained closes counted", n)
	}
	// The connection went back to the pool idle: nothing left open.
	if n := u.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`); n != 0 {
		t.Fatalf("%d connections left in a transaction", n)
	}
	// A retry is Finalize's: the stored outcome.
	req.BeforeCommit = nil
	if again, err := u.s.Finalize(ctx, req); err != nil || again.PublishedAt != out.PublishedAt {
		t.Fatalf("retry: %+v, %v", again, err)
	}
}

// A chained close refused by Finalize's checks (here the fence: another
// epoch) answers Finalize's refusal, publishes nothing, and records the
// verification alone, as Finalize does.
func TestChainedCloseRefusal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	ch, in, req := u.chainWith(t, "chained, refused", func(req *upload.FinalizeRequest) { req.Epoch++ })
	k := req.Verify.Key
	if _, err := ch.Finalize(ctx, req); !errors.Is(err, upload.ErrAuthorityFence) {
		t.Fatalf("finalize under another epoch: %v, want the fence", err)
	}
	if n := u.outcomes(t); n != 0 {
		t.Fatalf("%d outcomes after a refusal", n)
	}
	if p, err := u.s.Placement(ctx, k); err != nil || p.State != placement.Verified {
		t.Fatalf("placement after the refusal: %+v, %v", p, err)
	}
	if got, err := u.s.GetIntent(ctx, in.OperationID); err != nil || got.State != upload.IntentPending {
		t.Fatalf("intent after the refusal: %+v, %v", got, err)
	}
}

// A chain whose key has a row already (the same content published
// before) is over at its claim: it rolls back Finalize's statements and
// answers staged false, as OpenAndStage does, and the close goes on
// without it, on other connections, without waiting for the chain's
// locks: ClaimAndStage finds the key verified, and Finalize publishes
// through Store.Finalize.
func TestChainedCloseOfAStagedKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	const content = "the same content twice"
	first, _, req := u.chain(t, content)
	if _, err := first.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	n, k := u.newIntent(content, upRepo)
	ch := u.s.ChainOpenAndStage(ctx, n, k, u.chainRequest(n, k))
	if ch == nil {
		t.Fatal("not chained")
	}
	defer ch.Release()
	in, staged, err := ch.Claim()
	if err != nil || staged {
		t.Fatalf("claim of a verified key: staged %v, %v", staged, err)
	}
	if st, err := u.s.ClaimAndStage(ctx, in.OperationID, k, n.ExpectedSize); err != nil || !st.AlreadyVerified {
		t.Fatalf("claim and stage after the chain: already verified %v, %v", st.AlreadyVerified, err)
	}
	req = u.chainRequest(n, k)
	req.OperationID, req.Verify = in.OperationID, nil
	if out, err := ch.Finalize(ctx, req); err != nil || out.NewReference {
		t.Fatalf("finalize after the chain: %+v, %v", out, err)
	}
	if n := u.outcomes(t); n != 2 {
		t.Fatalf("%d outcomes, want both closes'", n)
	}
}

// A chain in flight holds a claim slot until its claim is answered and a
// Finalize slot until it ends: no other close chains meanwhile, and
// once its claim is answered another close's claim runs alone.
func TestChainedCloseHoldsTheSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	ch, _, req := u.chain(t, "the first close")
	n, k := u.newIntent("the second close", upRepo)
	if other := u.s.ChainOpenAndStage(ctx, n, k, u.chainRequest(n, k)); other != nil {
		other.Release()
		t.Fatal("a second close chained while a chain was in flight")
	}
	if _, staged, err := u.s.OpenAndStage(ctx, n, k); err != nil || !staged {
		t.Fatalf("the second close's claim: staged %v, %v", staged, err)
	}
	if _, err := ch.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	if next := u.s.ChainOpenAndStage(ctx, n, k, u.chainRequest(n, k)); next == nil {
		t.Fatal("an idle store did not chain")
	} else {
		next.Release()
	}
}

// S5 across a chain: between its claim and its COMMIT the chain holds
// the intent's row lock (Finalize's FOR UPDATE, taken by the statements
// the server ran right after the claim), so an abandonment of the intent
// waits, and once the chain publishes it fails on the row: exactly one
// of them happens.
func TestChainedClosePublishVersusAbandon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	ch, in, req := u.chain(t, "chained, then raced")
	// The claim was answered; Finalize's statements, sent behind it, may
	// still be running: the abandon starts once they all ran (the intent
	// locked by FinalizeContext, the transaction waiting for its COMMIT).
	pgtest.WaitForIdleInTransaction(t, u.pool, "-- name: Publish :one")
	var abErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, abErr = u.s.AbandonIntent(ctx, in.OperationID)
	}()
	pgtest.WaitForLockWaiters(t, u.pool, 1)
	if _, err := ch.Finalize(ctx, req); err != nil {
		t.Fatalf("the chain's publication: %v", err)
	}
	<-done
	if !errors.Is(abErr, upload.ErrIntentClosed) {
		t.Fatalf("abandon after the chain published: %v, want ErrIntentClosed", abErr)
	}
	if got, err := u.s.GetIntent(ctx, in.OperationID); err != nil || got.State != upload.IntentAdmitted {
		t.Fatalf("intent: %+v, %v", got, err)
	}
	wantPublished(t, u, []upload.FinalizeRequest{req}, 1)
}

// Release without Finalize (the bytes could not be linked) rolls back
// Finalize's statements: the claim stays, as after OpenAndStage, and
// the intent can be abandoned at once.
func TestChainedCloseReleased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	ch, in, req := u.chain(t, "chained, then released")
	ch.Release()
	if _, err := u.s.AbandonIntent(ctx, in.OperationID); err != nil {
		t.Fatalf("abandon after release: %v", err)
	}
	if p, err := u.s.Placement(ctx, req.Verify.Key); err != nil || p.State == placement.Verified {
		t.Fatalf("placement after release: %+v, %v", p, err)
	}
	if n := u.outcomes(t); n != 0 {
		t.Fatalf("%d outcomes", n)
	}
	// The chain is over: Finalize is Store.Finalize's (which now finds
	// the intent abandoned).
	if _, err := ch.Finalize(ctx, req); blobplane.ErrorCode(err) != blobplane.CodeConflict {
		t.Fatalf("finalize after release: %v, want conflict", err)
	}
}

// The PUT that closes a session chains as well: ClaimSession answers as
// ClaimSessionAndStage (the session claimed, with its declared content),
// and the chain publishes the session's operation. A session that is not
// claimable (here: named with another repository) ends the chain at its
// claim, recording nothing, as ClaimSessionAndStage does.
func TestChainedSessionClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	session := u.open(t, upRepo)
	n, k := u.newIntent("a session's chained close", upRepo)
	req := u.chainRequest(n, k)

	other := u.s.ChainClaimSessionAndStage(ctx, session.OperationID, "team/other", k, n.ExpectedSize, req)
	if other == nil {
		t.Fatal("not chained")
	}
	if _, claimed, _, err := other.ClaimSession(); err != nil || claimed {
		t.Fatalf("claim of another repository's session: claimed %v, %v", claimed, err)
	}
	if got, err := u.s.GetIntent(ctx, session.OperationID); err != nil || got.ExpectedDigest != "" {
		t.Fatalf("session after a refused claim: %+v, %v", got, err)
	}

	ch := u.s.ChainClaimSessionAndStage(ctx, session.OperationID, upRepo, k, n.ExpectedSize, req)
	if ch == nil {
		t.Fatal("not chained")
	}
	defer ch.Release()
	if _, _, err := ch.Claim(); !errors.Is(err, store.ErrNotThisChain) {
		t.Fatalf("Claim of a session's chain: %v", err)
	}
	in, claimed, st, err := ch.ClaimSession()
	if err != nil || !claimed || st.AlreadyVerified || in.OperationID != session.OperationID || in.ExpectedDigest != n.ExpectedDigest {
		t.Fatalf("session claim: %+v claimed %v already verified %v, %v", in, claimed, st.AlreadyVerified, err)
	}
	req.OperationID = in.OperationID
	if out, err := ch.Finalize(ctx, req); err != nil || !out.NewReference || out.OperationID != session.OperationID {
		t.Fatalf("finalize: %+v, %v", out, err)
	}
	wantPublished(t, u, []upload.FinalizeRequest{req}, 1)
}

// A chained close with replication targets enqueues the transfers in its
// own transaction (decide on the chain's connection: River inserts
// through it), so they commit with the publication and not before it.
func TestChainedCloseEnqueuesReplication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	ch, _, req := u.chainWith(t, "chained, replicated", func(req *upload.FinalizeRequest) { req.Targets = []string{"us-1", "ap-1"} })
	req.BeforeCommit = func() error {
		if n := u.count(t, `SELECT count(*) FROM river_job`); n != 0 {
			t.Errorf("%d jobs visible before the publication committed", n)
		}
		return nil
	}
	out, err := ch.Finalize(ctx, req)
	if err != nil || len(out.ReplicationTargets) != 2 {
		t.Fatalf("finalize: %+v, %v", out, err)
	}
	if n := u.count(t, `SELECT count(*) FROM river_job WHERE kind = 'replicate' AND args->>'operation_id' = $1
		AND args->>'source_datacenter' = $2 AND args->>'target_datacenter' IN ('us-1', 'ap-1')`, req.OperationID, upDC); n != 2 {
		t.Fatalf("%d replication jobs of the close, want one per target", n)
	}
}

// Issue 29, the "re-put is a no-op" trap (ADR-00018): a copy failed under
// a newer epoch (a read or the scrub found it corrupt) is taken over by
// the next upload of the content at that epoch, which verifies it there;
// a verified copy under any epoch is already verified; a pending one
// under a newer epoch (a transfer in flight) is stale, retryably.
func TestClaimAndStageTakesOverAFailedCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	const content = "lost, then pushed again"
	first, _, req := u.chain(t, content)
	if _, err := first.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	n, k := u.newIntent(content, upRepo)
	p, err := u.s.Placement(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.FailPlacement(ctx, k, placement.DigestMismatch, p.Epoch+2); err != nil {
		t.Fatal(err)
	}
	in, err := u.s.CreateIntent(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	st, err := u.s.ClaimAndStage(ctx, in.OperationID, k, n.ExpectedSize)
	if err != nil || st.AlreadyVerified || st.Epoch != p.Epoch+2 {
		t.Fatalf("stage over the failed copy: %+v, %v; want a stage at epoch %d", st, err, p.Epoch+2)
	}
	if _, err := u.s.VerifyPlacement(ctx, k, k.Digest, n.ExpectedSize, st.Epoch); err != nil {
		t.Fatalf("verify under the stage's epoch: %v", err)
	}
	// Verified at that epoch: the next claim finds it so.
	n2, _ := u.newIntent(content, upRepo)
	in2, err := u.s.CreateIntent(ctx, n2)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := u.s.ClaimAndStage(ctx, in2.OperationID, k, n.ExpectedSize); err != nil || !st.AlreadyVerified {
		t.Fatalf("claim of the verified copy: %+v, %v", st, err)
	}
	// A transfer takes it over (pending, a newer epoch): a claim now is
	// stale, and retryable.
	if _, err := u.s.FailPlacement(ctx, k, placement.SourceUnavailable, p.Epoch+3); err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.StagePlacement(ctx, k, n.ExpectedSize, p.Epoch+4); err != nil {
		t.Fatal(err)
	}
	n3, _ := u.newIntent(content, upRepo)
	in3, err := u.s.CreateIntent(ctx, n3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.ClaimAndStage(ctx, in3.OperationID, k, n.ExpectedSize); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("claim over a transfer in flight: %v; want stale_epoch", err)
	}
}
