package jobs

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/blobplane/blobplane/store"
)

// ObliterateArgs finishes an obliteration after its mark (issue 29,
// docs/obliteration.md). Declared in store, whose marking transaction
// inserts it (store.Obliterate).
type ObliterateArgs = store.ObliterateArgs

// DefaultObliterationSettle is how long after its mark an obliteration's
// job keeps looking for stragglers (ObliterateWorker.Settle).
const DefaultObliterationSettle = 10 * time.Second

// ObliterateWorker runs an obliteration's steps (store.ObliterationSteps)
// as River resumable steps, each recorded done in the transaction that
// does its work (river.ResumableSetStepTx): a crash or a cancellation
// between two steps resumes at the first one not committed, and a step
// that ran and committed is never run twice by the job (each is
// idempotent anyway). The last step, settle, repeats them all until a
// pass finds nothing to do Settle after the mark, snoozing in between.
// When the mark no longer holds (unmarked, or marked again: the newer
// mark's job does the work) the job is cancelled. The delete_bytes jobs
// of the revoked placements go to each placement's datacenter queue
// (DeletionQueue) through the worker's own River client.
type ObliterateWorker struct {
	river.WorkerDefaults[ObliterateArgs]
	Store *store.Store
	// Settle is how long after the mark a pass must find nothing to do
	// for the job to finish; <= 0: DefaultObliterationSettle.
	Settle time.Duration
	Logger *slog.Logger
}

// settleStep names the job's last resumable step.
const settleStep = "settle"

func (w *ObliterateWorker) Work(ctx context.Context, job *river.Job[ObliterateArgs]) error {
	rc, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return err
	}
	enq := Deletion{Client: rc}
	args := job.Args
	checkpoint := func(ctx context.Context, tx pgx.Tx) error {
		_, err := river.ResumableSetStepTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	}
	for _, step := range store.ObliterationSteps {
		river.ResumableStep(ctx, string(step), nil, func(ctx context.Context) error {
			p, err := w.Store.ObliterationStep(ctx, args, step, enq, checkpoint)
			if err == nil && p.Changed() {
				w.logger().InfoContext(ctx, "obliteration step", "digest", args.Digest, "mark", args.Mark, "step", step,
					"references", p.References, "abandoned", p.Abandoned, "revoked", p.Revoked, "deletions", len(p.Deletions), "busy", p.Busy)
			}
			return w.stepErr(ctx, args, err)
		})
	}
	river.ResumableStep(ctx, settleStep, nil, func(ctx context.Context) error {
		done, wait, p, err := w.Store.SettleObliteration(ctx, args, enq, w.settle())
		if err != nil {
			return w.stepErr(ctx, args, err)
		}
		if !done {
			if p.Changed() {
				w.logger().InfoContext(ctx, "obliteration caught stragglers", "digest", args.Digest, "mark", args.Mark,
					"references", p.References, "abandoned", p.Abandoned, "revoked", p.Revoked, "busy", p.Busy)
			}
			return river.JobSnooze(max(wait, time.Second))
		}
		w.logger().InfoContext(ctx, "obliteration finished", "digest", args.Digest, "mark", args.Mark, "owed_deletions", len(p.Deletions))
		return nil
	})
	return nil
}

// stepErr is a step's error for River: the mark gone cancels the job
// (nothing is left for it to do), anything else is retried.
func (w *ObliterateWorker) stepErr(ctx context.Context, args ObliterateArgs, err error) error {
	if errors.Is(err, store.ErrMarkGone) {
		w.logger().InfoContext(ctx, "obliteration no longer holds; its job ends", "digest", args.Digest, "mark", args.Mark)
		return river.JobCancel(err)
	}
	return err
}

func (w *ObliterateWorker) settle() time.Duration {
	if w.Settle <= 0 {
		return DefaultObliterationSettle
	}
	return w.Settle
}

func (w *ObliterateWorker) logger() *slog.Logger {
	if w.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return w.Logger
}

// Timeout bounds one attempt: a handful of short transactions.
func (w *ObliterateWorker) Timeout(*river.Job[ObliterateArgs]) time.Duration { return time.Minute }

// AddObliterateWorker registers ObliterateWorker on w (its jobs run on
// the default queue, which every worker polls).
func AddObliterateWorker(w *river.Workers, st *store.Store, logger *slog.Logger) {
	river.AddWorker(w, &ObliterateWorker{Store: st, Logger: logger})
}
