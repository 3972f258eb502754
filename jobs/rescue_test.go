package jobs

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/replication"
)

// Issue 28, "a per-job timeout proportional to size, River's rescue
// above it": River's rescuer (RescueStuckJobsAfter, 2 minutes) leaves a
// running attempt alone until its own worker's timeout has passed
// (river#350), so a copy of a large blob, or a long scrub pass, is never
// rescued while it runs. Three attempts left running five minutes ago:
// a 4 KiB copy (timeout 1 min 0 s) is rescued; a 4 GiB copy (1 min +
// 512 s) and a scrub pass (budget 7 min 30 s + 1 min) are not. The small
// one's rescue proves the rescuer ran over all three.
func TestRescueWaitsForAJobsOwnTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	logger := slog.New(slog.DiscardHandler)
	w := river.NewWorkers()
	river.AddWorker(w, &ReplicateWorker{Transfer: &replication.Transfer{}, Logger: logger})
	river.AddWorker(w, &ScrubWorker{Scrub: &replication.Scrub{Budget: ScrubBudget(10 * time.Minute)}})
	rc, err := river.NewClient(riverpgxv5.New(d.Pool), &river.Config{
		Logger: logger, Workers: w, RescueStuckJobsAfter: RescueStuckJobsAfter,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int64{}
	for name, args := range map[string]river.JobArgs{
		"small copy": ReplicateArgs{Digest: blobplane.Digest("sha256:" + strings.Repeat("a", 64)), Size: 4 << 10, TargetDatacenter: "us-1"},
		"large copy": ReplicateArgs{Digest: blobplane.Digest("sha256:" + strings.Repeat("b", 64)), Size: 4 << 30, TargetDatacenter: "us-1"},
		"scrub pass": ScrubDatacenterArgs{Datacenter: "us-1"},
	} {
		res, err := rc.Insert(ctx, args, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = res.Job.ID
		if _, err := d.Pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_by = '{gone}', attempted_at = now() - interval '5 minutes' WHERE id = $1`, res.Job.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := rc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rc.Stop(stopCtx)
	}()
	state := func(name string) string {
		var s string
		if err := d.Pool.QueryRow(ctx, `SELECT state::text FROM river_job WHERE id = $1`, ids[name]).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// The elected client rescues at once on start, then every 30 s.
	deadline := time.Now().Add(90 * time.Second)
	for state("small copy") == "running" {
		if time.Now().After(deadline) {
			t.Fatal("the small copy was never rescued: did the rescuer run?")
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, name := range []string{"large copy", "scrub pass"} {
		if s := state(name); s != "running" {
			t.Errorf("%s: %s; rescued before its own timeout", name, s)
		}
	}
}
