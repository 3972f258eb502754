package jobs

import (
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/config"
)

func TestPeriodicJobsFromCron(t *testing.T) {
	t.Parallel()
	jobs, err := PeriodicJobs(map[string]string{"node_prune": "*/5 * * * *"})
	if err != nil || len(jobs) != 1 {
		t.Fatalf("got %d jobs, %v", len(jobs), err)
	}
	if _, err := PeriodicJobs(map[string]string{"sweep_everything": "@hourly"}); err == nil || !strings.Contains(err.Error(), "node_prune") {
		t.Fatalf("unknown job name should list the known ones: %v", err)
	}
}

// One run per scheduled period: the uniqueness window is the gap between runs.
func TestSchedulePeriod(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 10, 0, 30, 0, time.UTC)
	for expr, want := range map[string]time.Duration{
		"@every 1s":   time.Second,
		"@every 90s":  90 * time.Second,
		"*/5 * * * *": 5 * time.Minute,
		"@hourly":     time.Hour,
	} {
		s, err := config.CronParser.Parse(expr)
		if err != nil {
			t.Fatal(err)
		}
		if got := schedulePeriod(s, now); got != want {
			t.Errorf("%s: period %v, want %v", expr, got, want)
		}
	}
}
