package jobs

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/replication"
	"github.com/blobplane/blobplane/store"
)

// ReconcileArgs is one pass of the replication reconciler (cron name
// "reconcile"): a bounded batch of live blobs compared with their
// replication policy, every missing copy enqueued (replication.Reconciler).
type ReconcileArgs struct{}

func (ReconcileArgs) Kind() string { return config.ReconcileJob }

// DefaultReconcileBatch is how many blobs one pass compares.
const DefaultReconcileBatch = 1000

// ReconcileWorker runs ReconcileArgs.
type ReconcileWorker struct {
	river.WorkerDefaults[ReconcileArgs]
	Store    *store.Store
	Fallback []string
	Batch    int
	Logger   *slog.Logger
}

func (w *ReconcileWorker) Work(ctx context.Context, job *river.Job[ReconcileArgs]) error {
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return err
	}
	r := &replication.Reconciler{Ledger: w.Store, Copies: CopyQueue{Client: client}, Fallback: w.Fallback, Logger: w.Logger}
	batch := w.Batch
	if batch <= 0 {
		batch = DefaultReconcileBatch
	}
	rep, err := r.Run(ctx, batch)
	if rep.Enqueued > 0 || rep.Unsourced > 0 {
		w.Logger.InfoContext(ctx, "replication reconciled", "blobs", rep.Blobs, "copies_enqueued", rep.Enqueued, "without_a_verified_copy", rep.Unsourced, "wrapped", rep.Wrapped)
	}
	return err
}

// CopyQueue enqueues the reconciler's copies as replicate jobs into
// their targets' queues (replication.CopyEnqueuer).
type CopyQueue struct {
	Client *river.Client[pgx.Tx]
}

// EnqueueCopies implements replication.CopyEnqueuer.
func (q CopyQueue) EnqueueCopies(ctx context.Context, copies []replication.Copy) error {
	params := make([]river.InsertManyParams, len(copies))
	for i, c := range copies {
		params[i] = river.InsertManyParams{Args: ReplicateArgs{Digest: c.Digest, Size: c.Size, SourceDatacenter: c.Source, TargetDatacenter: c.Target}}
	}
	_, err := q.Client.InsertMany(ctx, params)
	return err
}
