package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/upload"
)

// expire moves op's expiry into the past by the database clock (created_at
// moves too: the schema keeps expires_at after it).
func (u *uploads) expire(t *testing.T, op string) {
	t.Helper()
	if _, err := u.pool.Exec(context.Background(),
		`UPDATE intents SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' WHERE operation_id = $1`, op); err != nil {
		t.Fatal(err)
	}
}

// staged is the factory for a pending chunked upload with a staged
// location and some received bytes.
func (u *uploads) staged(t *testing.T, location string) upload.Intent {
	t.Helper()
	in, err := u.s.ExtendIntent(context.Background(), u.open(t, upRepo).OperationID, location, 7, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func TestReapExpiredIntentsBoundedBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	var expired []string
	for i := range 5 {
		in := u.staged(t, stagedID(i))
		u.expire(t, in.OperationID)
		expired = append(expired, in.OperationID)
	}
	fresh := u.staged(t, stagedID(99))

	dry, err := u.s.ReapExpiredIntents(ctx, upDC, 10, true)
	if err != nil || len(dry) != 5 {
		t.Fatalf("dry run: %d, %v; want 5", len(dry), err)
	}
	if n := u.count(t, `SELECT count(*) FROM intents WHERE state = 'pending'`); n != 6 {
		t.Fatalf("dry run changed %d intents", 6-n)
	}
	if other, err := u.s.ReapExpiredIntents(ctx, "us-1", 10, false); err != nil || len(other) != 0 {
		t.Fatalf("another datacenter reaped %d, %v", len(other), err)
	}

	seen := map[string]bool{}
	for _, want := range []int{2, 2, 1, 0} {
		got, err := u.s.ReapExpiredIntents(ctx, upDC, 2, false)
		if err != nil || len(got) != want {
			t.Fatalf("batch: %d, %v; want %d", len(got), err, want)
		}
		for _, r := range got {
			if seen[r.OperationID] || r.Backend != "fs" || r.StagedLocation == "" || r.ReceivedBytes != 7 || r.Repository != upRepo {
				t.Fatalf("reaped %+v (seen before: %v)", r, seen[r.OperationID])
			}
			seen[r.OperationID] = true
		}
	}
	for _, op := range expired {
		if in, _ := u.s.GetIntent(ctx, op); in.State != upload.IntentAbandoned {
			t.Fatalf("%s is %s", op, in.State)
		}
	}
	if in, _ := u.s.GetIntent(ctx, fresh.OperationID); in.State != upload.IntentPending {
		t.Fatalf("not-yet-expired intent is %s", in.State)
	}
	if _, err := u.s.ReapExpiredIntents(ctx, upDC, 0, false); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
		t.Fatalf("batch 0: %v", err)
	}

	// The retry queue holds them until their deletes are recorded.
	waiting, err := u.s.UndeletedStagedIntents(ctx, upDC, 10)
	if err != nil || len(waiting) != 5 {
		t.Fatalf("undeleted: %d, %v", len(waiting), err)
	}
	if age, err := u.s.OldestOverdueIntent(ctx, upDC); err != nil || age <= 0 {
		t.Fatalf("oldest overdue %s, %v", age, err)
	}
	for _, w := range waiting {
		for range 2 { // idempotent
			if err := u.s.MarkStagedDeleted(ctx, w.OperationID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if waiting, _ := u.s.UndeletedStagedIntents(ctx, upDC, 10); len(waiting) != 0 {
		t.Fatalf("%d still waiting", len(waiting))
	}
	if age, err := u.s.OldestOverdueIntent(ctx, upDC); err != nil || age != 0 {
		t.Fatalf("oldest overdue %s, %v; want 0", age, err)
	}
	// Marking never applies to a pending intent.
	if err := u.s.MarkStagedDeleted(ctx, fresh.OperationID); err != nil {
		t.Fatal(err)
	}
	if u.count(t, `SELECT count(*) FROM intents WHERE staged_deleted_at IS NOT NULL AND state <> 'abandoned'`) != 0 {
		t.Fatal("a non-abandoned intent was marked deleted")
	}
}

func stagedID(i int) string {
	const hex = "0123456789abcdef"
	b := []byte("00000000000000000000000000000000")
	b[30], b[31] = hex[i/16%16], hex[i%16]
	return string(b)
}

// Terminal states reject chunk appends and heartbeats.
func TestExtendIntentRefusesTerminalStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	reaped := u.staged(t, stagedID(1))
	u.expire(t, reaped.OperationID)
	if got, err := u.s.ReapExpiredIntents(ctx, upDC, 10, false); err != nil || len(got) != 1 {
		t.Fatalf("reap: %d, %v", len(got), err)
	}
	admitted, req := u.admitted(t, "published")
	if _, err := u.s.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{reaped.OperationID, admitted.OperationID} {
		before, _ := u.s.GetIntent(ctx, op)
		_, err := u.s.ExtendIntent(ctx, op, "", 100, time.Hour)
		if !errors.Is(err, upload.ErrIntentClosed) || blobplane.ErrorCode(err) != blobplane.CodeConflict {
			t.Fatalf("extend %s intent: %v", before.State, err)
		}
		after, _ := u.s.GetIntent(ctx, op)
		if after.ReceivedBytes != before.ReceivedBytes || !after.ExpiresAt.Equal(before.ExpiresAt) {
			t.Fatalf("a refused extend changed the %s intent", before.State)
		}
	}
}

// Schedule 7: a chunk append racing the reaper on the same intent. Whoever
// holds the row first wins; the other sees the outcome on the row.
func TestChunkAppendRacingReaper(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("reaper first: the append fails on the row", func(t *testing.T) {
		t.Parallel()
		u := setupUploads(t)
		in := u.staged(t, stagedID(1))
		u.expire(t, in.OperationID)
		tx, err := u.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		got, err := u.s.ReapExpiredIntentsTx(ctx, tx, upDC, 10)
		if err != nil || len(got) != 1 {
			t.Fatalf("reap: %d, %v", len(got), err)
		}
		var extErr error
		var wg sync.WaitGroup
		wg.Go(func() { _, extErr = u.s.ExtendIntent(ctx, in.OperationID, "", 14, time.Hour) })
		pgtest.WaitForLockWaiters(t, u.pool, 1)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if !errors.Is(extErr, upload.ErrIntentClosed) {
			t.Fatalf("append after the reap committed: %v", extErr)
		}
		if cur, _ := u.s.GetIntent(ctx, in.OperationID); cur.State != upload.IntentAbandoned || cur.ReceivedBytes != 7 {
			t.Fatalf("intent %s with %d bytes", cur.State, cur.ReceivedBytes)
		}
	})
	t.Run("append first: the reaper skips it, then finds it alive", func(t *testing.T) {
		t.Parallel()
		u := setupUploads(t)
		in := u.staged(t, stagedID(1))
		u.expire(t, in.OperationID)
		// The append's UPDATE holds the row (what ExtendIntent does, held
		// open here).
		tx, err := u.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `UPDATE intents SET received_bytes = 14, expires_at = now() + interval '1 hour' WHERE operation_id = $1 AND state = 'pending'`, in.OperationID); err != nil {
			t.Fatal(err)
		}
		if got, err := u.s.ReapExpiredIntents(ctx, upDC, 10, false); err != nil || len(got) != 0 {
			t.Fatalf("reaper took a locked intent: %d, %v", len(got), err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if got, err := u.s.ReapExpiredIntents(ctx, upDC, 10, false); err != nil || len(got) != 0 {
			t.Fatalf("reaper took an extended intent: %d, %v", len(got), err)
		}
		if cur, _ := u.s.GetIntent(ctx, in.OperationID); cur.State != upload.IntentPending || cur.ReceivedBytes != 14 {
			t.Fatalf("intent %s with %d bytes", cur.State, cur.ReceivedBytes)
		}
	})
}

// Schedule 3: a paused writer wakes after its intent was reaped and tries
// to publish: the publication fails on the row (S5).
func TestPausedWriterPublishesAfterReap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	in, req := u.admitted(t, "paused")
	u.expire(t, in.OperationID)
	if got, err := u.s.ReapExpiredIntents(ctx, upDC, 10, false); err != nil || len(got) != 1 {
		t.Fatalf("reap: %d, %v", len(got), err)
	}
	if _, err := u.s.Finalize(ctx, req); !errors.Is(err, upload.ErrIntentClosed) || blobplane.ErrorCode(err) != blobplane.CodeConflict {
		t.Fatalf("late publish: %v", err)
	}
	if u.outcomes(t) != 0 || u.references(t) != 0 {
		t.Fatal("a reaped intent published")
	}
}

// A publication holding the intent row is skipped by the reaper; once it
// commits the intent is admitted and never reaped.
func TestReaperSkipsIntentBeingPublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	in, req := u.admitted(t, "publishing")
	u.expire(t, in.OperationID)
	holder, err := u.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT 1 FROM intents WHERE operation_id = $1 FOR UPDATE`, in.OperationID); err != nil {
		t.Fatal(err)
	}
	var pubErr error
	var wg sync.WaitGroup
	wg.Go(func() { _, pubErr = u.s.Finalize(ctx, req) })
	pgtest.WaitForLockWaiters(t, u.pool, 1)
	if got, err := u.s.ReapExpiredIntents(ctx, upDC, 10, false); err != nil || len(got) != 0 {
		t.Fatalf("reaper took a locked intent: %d, %v", len(got), err)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if pubErr != nil {
		t.Fatal(pubErr)
	}
	if got, err := u.s.ReapExpiredIntents(ctx, upDC, 10, false); err != nil || len(got) != 0 {
		t.Fatalf("reaper took an admitted intent: %d, %v", len(got), err)
	}
}
