package jobs

import (
	"context"
	"errors"

	"github.com/riverqueue/river"

	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/sweep"
)

// SweepArgs runs one pass of the sweep: the reaper of expired upload
// intents (sweep.Reaper), then the retention of finished rows
// (sweep.Retention). Scheduled from BLOBPLANE_SWEEP_CRON or a sweep=
// entry in BLOBPLANE_CRON; unique per period and bounded per pass, and
// safe on several workers (intents are claimed FOR UPDATE SKIP LOCKED).
type SweepArgs struct{}

func (SweepArgs) Kind() string { return config.SweepJob }

// SweepWorker runs SweepArgs.
type SweepWorker struct {
	river.WorkerDefaults[SweepArgs]
	Reaper    *sweep.Reaper
	Retention *sweep.Retention // nil: none
}

// AddSweepWorker registers the sweep worker; every worker process that
// schedules the sweep job must call it.
func AddSweepWorker(w *river.Workers, r *sweep.Reaper, ret *sweep.Retention) {
	river.AddWorker(w, &SweepWorker{Reaper: r, Retention: ret})
}

func (w *SweepWorker) Work(ctx context.Context, job *river.Job[SweepArgs]) error {
	_, err := w.Reaper.RunOnce(ctx, false)
	if errors.Is(err, sweep.ErrDeleteFailed) {
		// Logged and counted by the reaper; the next scheduled pass
		// retries from the durable record, so a River retry adds nothing.
		err = nil
	}
	if err != nil || w.Retention == nil {
		return err
	}
	_, err = w.Retention.RunOnce(ctx, false)
	return err
}
