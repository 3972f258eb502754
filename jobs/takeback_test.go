package jobs

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/blobplane/blobplane/internal/pgtest"
)

// Issue 27: a worker restarted with its node id runs again at once the
// jobs its killed predecessor left running; another worker's running
// jobs, and a job at its last attempt, are left alone.
func TestTakeBackRunningJobsOfThisNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	rc, err := river.NewClient(riverpgxv5.New(d.Pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int64{}
	for _, op := range []string{"mine", "mine-last-attempt", "other", "was-mine-now-other", "mine-but-retryable"} {
		res, err := rc.Insert(ctx, FinalizeArgs{OperationID: op, Repository: "team/app"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[op] = res.Job.ID
	}
	// What a fetch leaves behind: state running, attempt counted, the
	// fetching client's id appended to attempted_by.
	set := func(op, state string, attempt, maxAttempts int, by ...string) {
		t.Helper()
		if _, err := d.Pool.Exec(ctx, `UPDATE river_job SET state = $2, attempt = $3, max_attempts = $4, attempted_by = $5, attempted_at = now() WHERE id = $1`,
			ids[op], state, attempt, maxAttempts, by); err != nil {
			t.Fatal(err)
		}
	}
	set("mine", "running", 3, 100, "w-a", "w-b", "w-a")
	set("mine-last-attempt", "running", 5, 5, "w-a")
	set("other", "running", 1, 100, "w-b")
	set("was-mine-now-other", "running", 2, 100, "w-a", "w-b")
	set("mine-but-retryable", "retryable", 1, 100, "w-a")

	n, err := TakeBackRunning(ctx, d.Pool, "w-a")
	if err != nil || n != 1 {
		t.Fatalf("took back %d (%v), want 1", n, err)
	}
	want := map[string]string{"mine": "available", "mine-last-attempt": "running", "other": "running", "was-mine-now-other": "running", "mine-but-retryable": "retryable"}
	for op, st := range want {
		var state string
		var attempt int
		var errs []json.RawMessage
		if err := d.Pool.QueryRow(ctx, `SELECT state::text, attempt, coalesce(errors, '{}') FROM river_job WHERE id = $1`, ids[op]).Scan(&state, &attempt, &errs); err != nil {
			t.Fatal(err)
		}
		if state != st {
			t.Errorf("%s: %s, want %s", op, state, st)
		}
		if op == "mine" && (attempt != 3 || len(errs) != 1 || !strings.Contains(string(errs[0]), "worker w-a restarted")) {
			t.Errorf("taken back job: attempt %d, errors %s", attempt, errs)
		}
	}
}
