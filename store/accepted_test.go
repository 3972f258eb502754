package store_test

import (
	"context"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/jackc/pgx/v5"
)

// Acknowledged means kept (issue 27): an upload answered 202 is accepted
// (AcceptIntent, with its finalize job in the same transaction) and the
// reaper never abandons it, however long past its expiry; an expired
// upload that was never accepted is reaped as before. Only a pending
// intent that proved its bytes can be accepted.
func TestReaperNeverAbandonsAnAcceptedUpload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	accepted, areq := u.admittedIn(t, upRepo, "answered 202")
	if err := u.s.RecordPossession(ctx, accepted.OperationID, areq.Digest, areq.Size, nil); err != nil {
		t.Fatal(err)
	}
	enqueued := 0
	if err := u.s.AcceptIntent(ctx, accepted.OperationID, func(ctx context.Context, tx pgx.Tx) error {
		enqueued++
		return nil
	}); err != nil || enqueued != 1 {
		t.Fatalf("accept: %v, %d enqueued", err, enqueued)
	}
	idle := u.open(t, upRepo) // never closed, never accepted
	unproven := u.open(t, upRepo)
	if err := u.s.AcceptIntent(ctx, unproven.OperationID, nil); blobplane.ErrorCode(err) != blobplane.CodeConflict {
		t.Fatalf("accepting an upload that proved nothing: %v; want conflict", err)
	}
	if _, err := u.pool.Exec(ctx, "UPDATE intents SET expires_at = now() - interval '1 day', created_at = now() - interval '2 days'"); err != nil {
		t.Fatal(err)
	}
	reaped, err := u.s.ReapExpiredIntents(ctx, upDC, 100, false)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range reaped {
		got[r.OperationID] = true
	}
	if got[accepted.OperationID] || !got[idle.OperationID] || !got[unproven.OperationID] {
		t.Fatalf("reaped %v; want the idle and unproven sessions, never the accepted upload", got)
	}
	in, err := u.s.GetIntent(ctx, accepted.OperationID)
	if err != nil || in.State != "pending" || in.AcceptedAt.IsZero() {
		t.Fatalf("the accepted upload after the reaper: %+v, %v", in, err)
	}
	// Its publication, whenever the home can: the finalize job's path.
	areq.Proven = false
	if out, err := u.s.Finalize(ctx, areq); err != nil || !out.NewReference {
		t.Fatalf("publication of the accepted upload: %+v, %v", out, err)
	}
	// A failed enqueue accepts nothing.
	second, sreq := u.admittedIn(t, upRepo, "enqueue fails")
	if err := u.s.RecordPossession(ctx, second.OperationID, sreq.Digest, sreq.Size, nil); err != nil {
		t.Fatal(err)
	}
	if err := u.s.AcceptIntent(ctx, second.OperationID, func(context.Context, pgx.Tx) error {
		return blobplane.Errorf(blobplane.CodeUnavailable, "queue down")
	}); err == nil {
		t.Fatal("accepted although its job could not be enqueued")
	}
	if in, _ := u.s.GetIntent(ctx, second.OperationID); !in.AcceptedAt.IsZero() {
		t.Fatal("a failed enqueue left the upload accepted")
	}
}
