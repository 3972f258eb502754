package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/sweep"
)

// DeletionQueue is the River queue of byte deletions of placements in
// datacenter: only that datacenter's workers hold its backends, so each
// worker polls its own datacenter's queue.
func DeletionQueue(datacenter string) string { return datacenterQueue("delete_", datacenter) }

// datacenterQueue is the queue named prefix + datacenter (River queue
// names allow at most 64 characters; a longer label is hashed).
func datacenterQueue(prefix, datacenter string) string {
	q := prefix + datacenter
	if len(q) > 64 {
		sum := sha256.Sum256([]byte(datacenter))
		q = prefix + hex.EncodeToString(sum[:16])
	}
	return q
}

// DeleteBytesArgs deletes the bytes of one placement a collection revoked
// (store.CollectUnreferenced). Unique by the placement key among jobs not
// yet finished, so a re-enqueue of an owed deletion never doubles it, while
// a later collection of the same key (after a revival) gets its own job.
type DeleteBytesArgs struct {
	Digest     blobplane.Digest `json:"digest"`
	Backend    string           `json:"backend"`
	Datacenter string           `json:"datacenter"`
	Location   string           `json:"location"`
	// Delayed: scheduled after the collection delete delay. Part of the
	// job's unique key, so an obliteration's deletion of the same key (never
	// delayed) is its own job and is not held behind a delayed one.
	Delayed bool `json:"delayed,omitempty"`
}

func (DeleteBytesArgs) Kind() string { return "delete_bytes" }

func (a DeleteBytesArgs) key() placement.Key {
	return placement.Key{Digest: a.Digest, Backend: a.Backend, Datacenter: a.Datacenter, Location: a.Location}
}

func deleteBytesInsert(d store.Deletion, delay time.Duration) river.InsertManyParams {
	p := river.InsertManyParams{
		Args: DeleteBytesArgs{Digest: d.Key.Digest, Backend: d.Key.Backend, Datacenter: d.Key.Datacenter, Location: d.Key.Location, Delayed: delay > 0},
		InsertOpts: &river.InsertOpts{Queue: DeletionQueue(d.Key.Datacenter), UniqueOpts: river.UniqueOpts{
			ByArgs: true, ByState: []rivertype.JobState{rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable, rivertype.JobStateRunning, rivertype.JobStateScheduled},
		}},
	}
	if delay > 0 && !d.DecidedAt.IsZero() {
		p.InsertOpts.ScheduledAt = d.DecidedAt.Add(delay)
	}
	return p
}

// Deletion enqueues byte-deletion jobs: inside the deciding transaction
// (store.DeletionEnqueuer) and, for owed deletions whose jobs were lost,
// outside it (sweep.DeletionRequeuer).
type Deletion struct {
	// Client may be insert-only.
	Client *river.Client[pgx.Tx]
	// Delay schedules each job that long after its decision (the
	// collection delete delay; 0 for obliterations: at once).
	Delay time.Duration
}

var (
	_ store.DeletionEnqueuer = Deletion{}
	_ sweep.DeletionRequeuer = Deletion{}
)

// EnqueueDeletionsTx inserts one DeleteBytesArgs per deletion in tx.
func (e Deletion) EnqueueDeletionsTx(ctx context.Context, tx pgx.Tx, ds []store.Deletion) error {
	params := make([]river.InsertManyParams, len(ds))
	for i, d := range ds {
		params[i] = deleteBytesInsert(d, e.Delay)
	}
	if _, err := e.Client.InsertManyTx(ctx, tx, params); err != nil {
		return fmt.Errorf("enqueue byte deletions: %w", err)
	}
	return nil
}

// EnqueueDeletions re-enqueues owed deletions; a job already waiting for
// the same key is not doubled.
func (e Deletion) EnqueueDeletions(ctx context.Context, ds []store.Deletion) error {
	if len(ds) == 0 {
		return nil
	}
	params := make([]river.InsertManyParams, len(ds))
	for i, d := range ds {
		params[i] = deleteBytesInsert(d, e.Delay)
	}
	if _, err := e.Client.InsertMany(ctx, params); err != nil {
		return fmt.Errorf("re-enqueue byte deletions: %w", err)
	}
	return nil
}

// CollectArgs runs one collection pass (sweep.Collector): decide the
// collection of unowned digests and enqueue their byte deletions.
// Periodic under the name "collect"; safe on several workers (SKIP
// LOCKED) and to re-run.
type CollectArgs struct{}

func (CollectArgs) Kind() string { return "collect" }

// CollectWorker runs CollectArgs with the worker's own River client as the
// deletion enqueuer.
type CollectWorker struct {
	river.WorkerDefaults[CollectArgs]
	Store   *store.Store
	Batch   int           // <= 0: sweep.DefaultCollectBatch
	Delay   time.Duration // the collection delete delay (jobs scheduled after it)
	Logger  *slog.Logger
	Metrics *sweep.CollectMetrics
}

func (w *CollectWorker) Work(ctx context.Context, job *river.Job[CollectArgs]) error {
	rc, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return err
	}
	e := Deletion{Client: rc, Delay: w.Delay}
	c := &sweep.Collector{Store: w.Store, Enqueuer: e, Requeuer: e, Batch: w.Batch, Delay: w.Delay, Logger: w.Logger, Metrics: w.Metrics}
	_, err = c.RunOnce(ctx)
	return err
}

// DeleteBytesWorker runs DeleteBytesArgs in its datacenter. Deleting a
// missing object succeeds; a transient backend error is returned and River
// retries with backoff; a wiring error (another datacenter's job, an
// unknown backend) cancels the job, leaving the deletion owed for the
// collector's report.
type DeleteBytesWorker struct {
	river.WorkerDefaults[DeleteBytesArgs]
	Deleter *sweep.Deleter
	Logger  *slog.Logger
}

func (w *DeleteBytesWorker) Work(ctx context.Context, job *river.Job[DeleteBytesArgs]) error {
	res, err := w.Deleter.Delete(ctx, job.Args.key())
	if nd := (*store.NotDueError)(nil); errors.As(err, &nd) {
		return river.JobSnooze(nd.Wait + time.Second) // enqueued before the delay was set, or by an obliteration's re-run
	}
	if err != nil {
		if blobplane.ErrorCode(err) == blobplane.CodeInvalid {
			return river.JobCancel(err)
		}
		return err
	}
	if res != store.DeletionNone {
		w.Logger.InfoContext(ctx, "collected bytes", "digest", job.Args.Digest, "backend", job.Args.Backend, "datacenter", job.Args.Datacenter, "result", res)
	}
	return nil
}

// Timeout bounds one delete (a backend call under a short transaction).
func (w *DeleteBytesWorker) Timeout(*river.Job[DeleteBytesArgs]) time.Duration { return time.Minute }

// CollectDeps are what the byte-deletion and inventory workers need: this
// worker's datacenter and its byte backends by name.
type CollectDeps struct {
	Store      *store.Store
	Logger     *slog.Logger
	Datacenter string
	Backends   map[string]backend.Backend
	Metrics    *sweep.CollectMetrics // nil records nothing
	// InventoryMinAge and InventoryMaxDeletes are sweep.Inventory's MinAge
	// and MaxDeletes (0: its defaults).
	InventoryMinAge     time.Duration
	InventoryMaxDeletes int
	// DeleteDelay is the collection delete delay
	// (BLOBPLANE_COLLECT_DELETE_DELAY; 0: at once).
	DeleteDelay time.Duration
}

// AddCollectWorkers registers CollectWorker, DeleteBytesWorker and
// InventoryWorker on w. The worker's River client must also poll
// DeletionQueue(d.Datacenter).
func AddCollectWorkers(w *river.Workers, d CollectDeps) {
	river.AddWorker(w, &CollectWorker{Store: d.Store, Delay: d.DeleteDelay, Logger: d.Logger, Metrics: d.Metrics})
	river.AddWorker(w, &DeleteBytesWorker{
		Deleter: &sweep.Deleter{Store: d.Store, Backends: sweep.Narrow[sweep.ObjectDeleter](d.Backends), Datacenter: d.Datacenter, Delay: d.DeleteDelay, Metrics: d.Metrics},
		Logger:  d.Logger,
	})
	river.AddWorker(w, &InventoryWorker{
		Inventory: &sweep.Inventory{Store: d.Store, Backends: sweep.Narrow[sweep.Lister](d.Backends), Datacenter: d.Datacenter,
			MinAge: d.InventoryMinAge, MaxDeletes: d.InventoryMaxDeletes, Logger: d.Logger, Metrics: d.Metrics},
		Logger: d.Logger,
	})
}
