package jobs

import "testing"

// The sweep job is accepted from BLOBPLANE_CRON, including robfig's
// "@every 1s" form.
func TestSweepPeriodicJob(t *testing.T) {
	t.Parallel()
	got, err := PeriodicJobs(map[string]string{"sweep": "@every 1s", "node_prune": "@every 1m"})
	if err != nil || len(got) != 2 {
		t.Fatalf("got %d jobs, %v", len(got), err)
	}
}
