package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// published is the factory for a digest published in upRepo whose only
// reference was then deleted: live, unreferenced, unclaimed.
func (u *uploads) unreferenced(t *testing.T, content string) upload.FinalizeRequest {
	t.Helper()
	ctx := context.Background()
	_, req := u.admitted(t, content)
	if _, err := u.s.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := u.s.DeleteReference(ctx, upRepo, req.Digest); err != nil {
		t.Fatal(err)
	}
	return req
}

type recordingEnqueuer struct{ got []store.Deletion }

func (r *recordingEnqueuer) EnqueueDeletionsTx(_ context.Context, _ pgx.Tx, ds []store.Deletion) error {
	r.got = append(r.got, ds...)
	return nil
}

func TestCollectUnreferencedDecidesThenDeletesOnce(t *testing.T) {
	t.Parallel()
	u := setupUploads(t)
	ctx := context.Background()
	req := u.unreferenced(t, "collect me")
	_, kept := u.admitted(t, "keep me")
	if _, err := u.s.Finalize(ctx, kept); err != nil {
		t.Fatal(err)
	}
	_, claimed := u.admitted(t, "claimed by a pending intent")
	if _, err := u.s.Finalize(ctx, claimed); err != nil {
		t.Fatal(err)
	}
	if err := u.s.DeleteReference(ctx, upRepo, claimed.Digest); err != nil {
		t.Fatal(err)
	}
	_, _ = u.admitted(t, "claimed by a pending intent") // a second attempt of that content claims it

	enq := &recordingEnqueuer{}
	got, err := u.s.CollectUnreferenced(ctx, 10, enq)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Digest != req.Digest || len(got[0].Deletions) != 1 || len(enq.got) != 1 {
		t.Fatalf("collected %+v, enqueued %+v; want only %s with one deletion", got, enq.got, req.Digest)
	}
	k := got[0].Deletions[0].Key
	if p, err := u.s.Placement(ctx, k); err != nil || p.State != placement.Revoked || p.RevokeReason != placement.Reclamation {
		t.Fatalf("placement after collection: %+v, %v", p, err)
	}
	if n := u.count(t, `SELECT count(*) FROM blobs WHERE digest = $1 AND state = 'collected'`, string(req.Digest)); n != 1 {
		t.Fatal("the blob row is not collected")
	}
	if again, err := u.s.CollectUnreferenced(ctx, 10, enq); err != nil || len(again) != 0 {
		t.Fatalf("second pass: %+v, %v", again, err)
	}

	calls := 0
	del := func(context.Context) error { calls++; return nil }
	if res, size, err := u.s.DeleteCollectedBytes(ctx, k, del); err != nil || res != store.DeletionDeleted || size != req.Size || calls != 1 {
		t.Fatalf("delete: %q %d %v after %d calls", res, size, err, calls)
	}
	if res, _, err := u.s.DeleteCollectedBytes(ctx, k, del); err != nil || res != store.DeletionNone || calls != 1 {
		t.Fatalf("re-run: %q %v after %d calls", res, err, calls)
	}
	if owed, err := u.s.UnfinishedDeletions(ctx, 10); err != nil || len(owed) != 0 {
		t.Fatalf("owed after the delete: %+v, %v", owed, err)
	}
}

// A transient failure of the byte delete leaves the deletion owed; the
// retry deletes.
func TestDeleteCollectedBytesRetriesTransientFailure(t *testing.T) {
	t.Parallel()
	u := setupUploads(t)
	ctx := context.Background()
	u.unreferenced(t, "flaky store")
	got, err := u.s.CollectUnreferenced(ctx, 1, nil)
	if err != nil || len(got) != 1 {
		t.Fatalf("collect: %+v, %v", got, err)
	}
	k := got[0].Deletions[0].Key
	transient := blobplane.Errorf(blobplane.CodeUnavailable, "store is down")
	if _, _, err := u.s.DeleteCollectedBytes(ctx, k, func(context.Context) error { return transient }); !errors.Is(err, transient) {
		t.Fatalf("failed delete: %v", err)
	}
	if owed, err := u.s.UnfinishedDeletions(ctx, 10); err != nil || len(owed) != 1 {
		t.Fatalf("owed after a failed delete: %+v, %v", owed, err)
	}
	if res, _, err := u.s.DeleteCollectedBytes(ctx, k, func(context.Context) error { return nil }); err != nil || res != store.DeletionDeleted {
		t.Fatalf("retry: %q %v", res, err)
	}
}

// blockingEnqueuer pauses the deciding transaction after the decision,
// before its commit.
type blockingEnqueuer struct{ decided, release chan struct{} }

func (b blockingEnqueuer) EnqueueDeletionsTx(ctx context.Context, _ pgx.Tx, _ []store.Deletion) error {
	close(b.decided)
	<-b.release
	return nil
}

// Schedule 5: a publication races the collection of the last reference.
// The publication checked for a verified placement before the decision and
// locks the blob row after it: it is refused retryably instead of
// referencing bytes being deleted (S1); the pending claim keeps the bytes
// (S6); after the bytes are re-stored the same operation publishes and
// revives the row.
func TestSchedule5PublishRacingCollectionS1(t *testing.T) {
	t.Parallel()
	u := setupUploads(t)
	ctx := context.Background()
	first := u.unreferenced(t, "last reference goes")
	// A chunked upload of the same content: no claim until it closes.
	in, err := u.s.CreateIntent(ctx, upload.NewIntent{Repository: upRepo, Principal: upPrincipal, ExpectedSize: upload.SizeUnknown,
		IngressDatacenter: upDC, Backend: "fs", StagedLocation: "0123456789abcdef0123456789abcdef", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}

	enq := blockingEnqueuer{decided: make(chan struct{}), release: make(chan struct{})}
	type collectResult struct {
		got []store.Collected
		err error
	}
	collected := make(chan collectResult, 1)
	go func() {
		got, err := u.s.CollectUnreferenced(ctx, 1, enq)
		collected <- collectResult{got, err}
	}()
	<-enq.decided // decided, not committed: the blob row is locked
	if _, err := u.s.RecordIntentContent(ctx, in.OperationID, first.Digest, first.Size); err != nil {
		t.Fatal(err)
	}
	req := first
	req.OperationID = in.OperationID
	published := make(chan error, 1)
	go func() { _, err := u.s.Finalize(ctx, req); published <- err }()
	pgtest.WaitForLockWaiters(t, u.pool, 1) // the publication waits on the blob row
	close(enq.release)
	cr := <-collected
	if cr.err != nil || len(cr.got) != 1 {
		t.Fatalf("collect: %+v, %v", cr.got, cr.err)
	}
	err = <-published
	if !errors.Is(err, store.ErrCollected) || !blobplane.IsRetryable(err) {
		t.Fatalf("publication after the decision: %v (retryable %v), want ErrCollected, retryable", err, blobplane.IsRetryable(err))
	}
	if n := u.count(t, `SELECT count(*) FROM blob_references WHERE digest = $1`, string(req.Digest)); n != 0 {
		t.Fatal("S1: a reference to collected bytes was inserted")
	}
	if got, err := u.s.GetIntent(ctx, in.OperationID); err != nil || got.State != upload.IntentPending {
		t.Fatalf("the refused intent: %+v, %v; want still pending", got, err)
	}
	k := cr.got[0].Deletions[0].Key
	// S6: the pending intent now claims the digest; the owed deletion
	// keeps the bytes.
	if res, _, err := u.s.DeleteCollectedBytes(ctx, k, func(context.Context) error { t.Error("S6: deleted claimed bytes"); return nil }); err != nil || res != store.DeletionSuperseded {
		t.Fatalf("delete of claimed bytes: %q %v", res, err)
	}
	// Re-stored: re-stage (revoked -> pending) and verify; now it publishes.
	if _, err := u.s.StagePlacement(ctx, k, req.Size, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.VerifyPlacement(ctx, k, req.Digest, req.Size, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	if n := u.count(t, `SELECT count(*) FROM blobs WHERE digest = $1 AND state = 'live'`, string(req.Digest)); n != 1 {
		t.Fatal("publication did not revive the collected row")
	}
}

// Passes cut short by their limit resume where the last one stopped, and
// a pass with room for every candidate wraps around and sees them all,
// wherever they sort relative to the cursor.
func TestCollectPassesResumeAndWrapAround(t *testing.T) {
	t.Parallel()
	u := setupUploads(t)
	ctx := context.Background()
	for _, c := range []string{"one", "two", "three", "four", "five"} {
		u.unreferenced(t, c)
	}
	first, err := u.s.CollectUnreferenced(ctx, 2, nil)
	if err != nil || len(first) != 2 {
		t.Fatalf("first pass: %d, %v", len(first), err)
	}
	var cursor string
	if err := u.pool.QueryRow(ctx, `SELECT after_digest FROM collector_cursor`).Scan(&cursor); err != nil || cursor != string(first[1].Digest) {
		t.Fatalf("cursor after a pass cut short: %q, %v; want %s", cursor, err, first[1].Digest)
	}
	second, err := u.s.CollectUnreferenced(ctx, 1, nil)
	if err != nil || len(second) != 1 || second[0].Digest <= first[1].Digest && second[0].Digest >= first[0].Digest {
		t.Fatalf("second pass: %+v, %v", second, err)
	}
	u.unreferenced(t, "six") // sorts anywhere
	rest, err := u.s.CollectUnreferenced(ctx, 100, nil)
	if err != nil || len(rest) != 3 {
		t.Fatalf("wrap-around pass: %d, %v; want the 3 left", len(rest), err)
	}
	if n := u.count(t, `SELECT count(*) FROM blobs WHERE state = 'live'`); n != 0 {
		t.Fatalf("%d live rows left", n)
	}
	if err := u.pool.QueryRow(ctx, `SELECT after_digest FROM collector_cursor`).Scan(&cursor); err != nil || cursor != "" {
		t.Fatalf("cursor after a whole cycle: %q, %v", cursor, err)
	}
}
