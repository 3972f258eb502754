package jobs

import (
	"context"
	"errors"

	"github.com/riverqueue/river"

	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/sweep"
)

// SweepArgs runs one pass of the sweep: the reaper of expired upload
// intents (sweep.Reaper). Scheduled from BLOBPLANE_SWEEP_CRON or a sweep=
// entry in BLOBPLANE_CRON; unique per period and bounded per pass, and
// safe on several workers (intents are claimed FOR UPDATE SKIP LOCKED).
type SweepArgs struct{}

func (SweepArgs) Kind() string { return config.SweepJob }

// SweepWorker runs SweepArgs.
type SweepWorker struct {
	river.WorkerDefaults[SweepArgs]
	Reaper *sweep.Reaper
}

// AddSweepWorker registers the sweep worker; every worker process that
// schedules the sweep job must call it.
func AddSweepWorker(w *river.Workers, r *sweep.Reaper) {
	river.AddWorker(w, &SweepWorker{Reaper: r})
}

func (w *SweepWorker) Work(ctx context.Context, job *river.Job[SweepArgs]) error {
	_, err := w.Reaper.RunOnce(ctx, false)
	if errors.Is(err, sweep.ErrDeleteFailed) {
		// Logged and counted by the reaper; the next scheduled pass
		// retries from the durable record, so a River retry adds nothing.
		return nil
	}
	return err
}
