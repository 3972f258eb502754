package jobs

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/upload"
)

type forwardFunc func(ctx context.Context, repo, op string) (upload.Outcome, error)

func (f forwardFunc) ForwardFinalize(ctx context.Context, repo, op string) (upload.Outcome, error) {
	return f(ctx, repo, op)
}

// Retryable refusals fail the attempt (River retries with backoff);
// terminal ones cancel the job; a publication completes it.
func TestFinalizeWorkerRetriesOrCancels(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err            error
		fails, cancels bool
	}{
		{err: nil},
		{err: blobplane.Errorf(blobplane.CodeUnavailable, "home unreachable"), fails: true},
		{err: blobplane.Errorf(blobplane.CodeStaleEpoch, "home moved"), fails: true},
		{err: blobplane.Errorf(blobplane.CodeForbidden, "grant revoked"), fails: true},
		{err: blobplane.Errorf(blobplane.CodeUnauthorized, "secret rejected"), fails: true},
		{err: &blobplane.Error{Code: blobplane.CodeMismatch, Err: upload.ErrContentIdentity}, fails: true, cancels: true},
		{err: &blobplane.Error{Code: blobplane.CodeConflict, Err: upload.ErrIntentClosed}, fails: true, cancels: true},
		{err: &blobplane.Error{Code: blobplane.CodeConflict, Err: upload.ErrObliterated}, fails: true, cancels: true},
		{err: blobplane.Errorf(blobplane.CodeNotFound, "unknown operation"), fails: true, cancels: true},
	} {
		w := &FinalizeWorker{Logger: slog.New(slog.DiscardHandler), Home: forwardFunc(func(context.Context, string, string) (upload.Outcome, error) {
			return upload.Outcome{OperationID: "op"}, tc.err
		})}
		err := w.Work(context.Background(), &river.Job[FinalizeArgs]{JobRow: &rivertype.JobRow{Attempt: 1}, Args: FinalizeArgs{OperationID: "op", Repository: "team/app"}})
		var cancel *rivertype.JobCancelError
		if (err != nil) != tc.fails || errors.As(err, &cancel) != tc.cancels {
			t.Errorf("%v: Work = %v, want fails=%v cancels=%v", tc.err, err, tc.fails, tc.cancels)
		}
	}
}

// One finalize job per operation id, however often (and with whatever
// repository) it is enqueued.
func TestFinalizeJobUniqueByOperation(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ctx := context.Background()
	rc, err := river.NewClient(riverpgxv5.New(d.Pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	q := FinalizeQueue{Client: rc}
	const op = "00000000-0000-4000-8000-000000000001"
	for _, repo := range []string{"team/app", "team/app", "team/other"} {
		if err := q.EnqueueFinalize(ctx, repo, op); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.EnqueueFinalize(ctx, "team/app", "00000000-0000-4000-8000-000000000002"); err != nil {
		t.Fatal(err)
	}
	var n, ops int
	if err := d.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT args->>'operation_id') FROM river_job WHERE kind = 'finalize' AND queue = 'default'`).Scan(&n, &ops); err != nil {
		t.Fatal(err)
	}
	if n != 2 || ops != 2 {
		t.Fatalf("%d finalize jobs for %d operations, want one per operation", n, ops)
	}
}

// An accepted upload's job outlasts any outage (issue 27): practically
// unbounded attempts, FinalizeFastRetry apart while a home moves (issue
// 30), then backing off, capped at FinalizeMaxBackoff.
func TestFinalizeJobRetriesForEverAtABoundedPace(t *testing.T) {
	if got := (FinalizeArgs{}).InsertOpts().MaxAttempts; got != FinalizeMaxAttempts {
		t.Fatalf("MaxAttempts %d", got)
	}
	w := &FinalizeWorker{}
	for _, tc := range []struct {
		errors   int
		min, max time.Duration
	}{{0, FinalizeFastRetry - 50*time.Millisecond, FinalizeFastRetry}, {FinalizeFastRetries - 1, FinalizeFastRetry - 50*time.Millisecond, FinalizeFastRetry},
		{FinalizeFastRetries, FinalizeMaxBackoff - time.Second, FinalizeMaxBackoff + time.Second}, {50, FinalizeMaxBackoff - time.Second, FinalizeMaxBackoff + time.Second}} {
		job := &river.Job[FinalizeArgs]{JobRow: &rivertype.JobRow{Errors: make([]rivertype.AttemptError, tc.errors)}}
		if d := time.Until(w.NextRetry(job)); d < tc.min || d > tc.max {
			t.Fatalf("after %d errors: retry in %s, want %s to %s", tc.errors, d, tc.min, tc.max)
		}
	}
}
