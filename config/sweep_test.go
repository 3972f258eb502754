package config

import (
	"io"
	"testing"
)

// BLOBPLANE_SWEEP_CRON feeds the cron map; a sweep= entry in BLOBPLANE_CRON
// takes precedence; "off" schedules no sweep.
func TestSweepSettings(t *testing.T) {
	t.Parallel()
	const db = "postgres://u@127.0.0.1:5432/db"
	cases := []struct {
		env       map[string]string
		wantSweep string // "" means no sweep job
		wantBatch int
	}{
		{map[string]string{}, "@every 1m", 1000},
		{map[string]string{"BLOBPLANE_SWEEP_CRON": "*/5 * * * *", "BLOBPLANE_SWEEP_BATCH": "50"}, "*/5 * * * *", 50},
		{map[string]string{"BLOBPLANE_CRON": "sweep=@every 1s", "BLOBPLANE_SWEEP_CRON": "@hourly"}, "@every 1s", 1000},
		{map[string]string{"BLOBPLANE_SWEEP_CRON": "off"}, "", 1000},
	}
	for _, tc := range cases {
		tc.env["DATABASE_URL"] = db
		c, _, err := Load(Worker, nil, func(k string) string { return tc.env[k] }, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		if c.Cron[SweepJob] != tc.wantSweep || c.SweepBatch != tc.wantBatch || (tc.env["BLOBPLANE_CRON"] == "" && c.Cron["node_prune"] == "") {
			t.Errorf("%v: cron %v, batch %d; want sweep %q, batch %d", tc.env, c.Cron, c.SweepBatch, tc.wantSweep, tc.wantBatch)
		}
	}
	for k, v := range map[string]string{"BLOBPLANE_SWEEP_CRON": "every minute", "BLOBPLANE_SWEEP_BATCH": "0", "BLOBPLANE_WORKER_METRICS": "9090"} {
		env := map[string]string{"DATABASE_URL": db, k: v}
		if _, _, err := Load(Worker, nil, func(k string) string { return env[k] }, io.Discard); err == nil {
			t.Errorf("%s=%s accepted", k, v)
		}
	}
}
