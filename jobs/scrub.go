package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"golang.org/x/time/rate"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/replication"
	"github.com/blobplane/blobplane/store"
)

// The scrub (issue 28): a periodic job (cron name "scrub") that fans out
// one pass per datacenter into that datacenter's queue, whose workers
// hold its backends and re-hash its verified placements
// (replication.Scrub), oldest checked first, at a bounded rate. A bad
// copy is failed and repaired by a replicate job from another verified
// copy.

// ScrubArgs is the periodic fan-out.
type ScrubArgs struct{}

func (ScrubArgs) Kind() string { return config.ScrubJob }

// ScrubDatacenterArgs is one scrub pass over Datacenter's placements.
// Unique per datacenter among unfinished jobs: a slow pass is never
// doubled by the next period's.
type ScrubDatacenterArgs struct {
	Datacenter string `json:"datacenter" river:"unique"`
}

func (ScrubDatacenterArgs) Kind() string { return "scrub_datacenter" }

// InsertOpts: the datacenter's queue.
func (a ScrubDatacenterArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: ReplicationQueue(a.Datacenter), UniqueOpts: unfinished}
}

// DefaultScrubBatch is how many placements one pass checks at most
// (BLOBPLANE_SCRUB_BATCH's default).
const DefaultScrubBatch = 1000

// ScrubFanOutWorker runs ScrubArgs: one pass per datacenter that has
// nodes registered.
type ScrubFanOutWorker struct {
	river.WorkerDefaults[ScrubArgs]
	Datacenters interface {
		RegisteredDatacenters(ctx context.Context) ([]string, error)
	}
}

func (w *ScrubFanOutWorker) Work(ctx context.Context, job *river.Job[ScrubArgs]) error {
	dcs, err := w.Datacenters.RegisteredDatacenters(ctx)
	if err != nil {
		return err
	}
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return err
	}
	params := make([]river.InsertManyParams, len(dcs))
	for i, dc := range dcs {
		params[i] = river.InsertManyParams{Args: ScrubDatacenterArgs{Datacenter: dc}}
	}
	_, err = client.InsertMany(ctx, params)
	return err
}

// ScrubWorker runs ScrubDatacenterArgs in its datacenter.
type ScrubWorker struct {
	river.WorkerDefaults[ScrubDatacenterArgs]
	Scrub *replication.Scrub
	Batch int
}

// Timeout: a pass stops after 90 s and keeps what it recorded; the next
// pass goes on from the longest unchecked. It stays below River's rescue
// of stuck jobs (RescueStuckJobsAfter), so a pass is never run twice at
// once.
func (w *ScrubWorker) Timeout(*river.Job[ScrubDatacenterArgs]) time.Duration {
	return 90 * time.Second
}

func (w *ScrubWorker) Work(ctx context.Context, job *river.Job[ScrubDatacenterArgs]) error {
	if job.Args.Datacenter != w.Scrub.Datacenter {
		return river.JobCancel(fmt.Errorf("scrub of %s on a worker of %s", job.Args.Datacenter, w.Scrub.Datacenter))
	}
	rep, err := w.Scrub.Run(ctx, w.Batch)
	w.Scrub.Logger.InfoContext(ctx, "scrub pass", "datacenter", w.Scrub.Datacenter, "checked", rep.Checked, "intact", rep.Intact,
		"mismatched", rep.Mismatched, "missing", rep.Missing, "skipped", rep.Skipped, "bytes", rep.Bytes)
	return err
}

// RepairQueue enqueues repairs as replicate jobs into the datacenter's
// own queue (replication.Repairer).
type RepairQueue struct{}

// EnqueueRepair implements replication.Repairer with the River client of
// the running job (ctx).
func (RepairQueue) EnqueueRepair(ctx context.Context, d blobplane.Digest, size int64, datacenter string) error {
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return err
	}
	_, err = client.Insert(ctx, ReplicateArgs{Digest: d, Size: size, TargetDatacenter: datacenter}, nil)
	return err
}

// ScrubDeps are what the scrub workers need.
type ScrubDeps struct {
	Store          *store.Store
	Datacenter     string
	Backends       map[string]backend.Backend
	BytesPerSecond int64 // 0: no bound
	Batch          int   // 0: DefaultScrubBatch
	Metrics        *replication.Metrics
	Logger         *slog.Logger
}

// AddScrubWorkers registers the fan-out and the per-datacenter workers.
func AddScrubWorkers(w *river.Workers, d ScrubDeps) {
	if d.Batch <= 0 {
		d.Batch = DefaultScrubBatch
	}
	var lim *rate.Limiter
	if d.BytesPerSecond > 0 {
		burst := int(min(d.BytesPerSecond, 256<<10))
		lim = rate.NewLimiter(rate.Limit(d.BytesPerSecond), burst)
	}
	river.AddWorker(w, &ScrubFanOutWorker{Datacenters: d.Store})
	river.AddWorker(w, &ScrubWorker{Scrub: &replication.Scrub{
		Ledger: d.Store, Datacenter: d.Datacenter, Backends: d.Backends, Repair: RepairQueue{}, Limiter: lim, Metrics: d.Metrics, Logger: d.Logger,
	}, Batch: d.Batch})
}
