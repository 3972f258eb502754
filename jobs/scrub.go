package jobs

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

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

// DefaultScrubBatch is how many placements one ledger read of a pass
// lists (BLOBPLANE_SCRUB_BATCH's default).
const DefaultScrubBatch = 1000

// DefaultScrubPeriod is the coverage period (BLOBPLANE_SCRUB_PERIOD's
// default): every stored byte is re-hashed at least once a week.
const DefaultScrubPeriod = 7 * 24 * time.Hour

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
}

// Timeout: a pass reads for its budget (three quarters of the time
// between passes, at most an hour) and keeps what it recorded; a minute
// more covers the check under way. River's rescuer leaves a running job
// alone until its own timeout has passed (river#350), so a long pass is
// never rescued, hence never run twice at once.
func (w *ScrubWorker) Timeout(*river.Job[ScrubDatacenterArgs]) time.Duration {
	return w.Scrub.Budget + time.Minute
}

func (w *ScrubWorker) Work(ctx context.Context, job *river.Job[ScrubDatacenterArgs]) error {
	if job.Args.Datacenter != w.Scrub.Datacenter {
		return river.JobCancel(fmt.Errorf("scrub of %s on a worker of %s", job.Args.Datacenter, w.Scrub.Datacenter))
	}
	pass, cancel := context.WithTimeout(ctx, w.Scrub.Budget)
	defer cancel()
	rep, err := w.Scrub.Run(pass)
	w.Scrub.Logger.InfoContext(ctx, "scrub pass", "datacenter", w.Scrub.Datacenter, "checked", rep.Checked, "intact", rep.Intact,
		"mismatched", rep.Mismatched, "missing", rep.Missing, "skipped", rep.Skipped, "bytes", rep.Bytes,
		"target_bytes", rep.Pace.Target, "bytes_per_second", int64(rep.Pace.Rate))
	if err != nil && pass.Err() != nil && ctx.Err() == nil {
		return nil // the budget ran out: the next pass goes on from the longest unchecked
	}
	return err
}

// RepairQueue enqueues repairs as replicate jobs into the datacenter's
// own queue (replication.Repairer, read.Repairer), through Client, or,
// when nil, the River client of the running job (ctx).
type RepairQueue struct {
	Client *river.Client[pgx.Tx]
}

// EnqueueRepair implements replication.Repairer and read.Repairer.
func (q RepairQueue) EnqueueRepair(ctx context.Context, d blobplane.Digest, size int64, datacenter string) error {
	client := q.Client
	if client == nil {
		var err error
		if client, err = river.ClientFromContextSafely[pgx.Tx](ctx); err != nil {
			return err
		}
	}
	_, err := client.Insert(ctx, ReplicateArgs{Digest: d, Size: size, TargetDatacenter: datacenter}, nil)
	return err
}

// ScrubDeps are what the scrub workers need.
type ScrubDeps struct {
	Store      *store.Store
	Datacenter string
	Backends   map[string]backend.Backend
	// Period is the coverage period (0: DefaultScrubPeriod); Schedule the
	// scrub's cron schedule (its passes' spacing; "": every 10 minutes).
	Period   time.Duration
	Schedule string
	MaxRate  int64 // bytes/s, 0: no cap
	Batch    int   // 0: DefaultScrubBatch
	Metrics  *replication.Metrics
	Logger   *slog.Logger
}

// AddScrubWorkers registers the fan-out and the per-datacenter workers.
func AddScrubWorkers(w *river.Workers, d ScrubDeps) error {
	interval, err := ScrubInterval(d.Schedule)
	if err != nil {
		return err
	}
	river.AddWorker(w, &ScrubFanOutWorker{Datacenters: d.Store})
	river.AddWorker(w, &ScrubWorker{Scrub: &replication.Scrub{
		Ledger: d.Store, Datacenter: d.Datacenter, Backends: d.Backends, Repair: RepairQueue{},
		Period: cmp.Or(d.Period, DefaultScrubPeriod), Interval: interval, Budget: ScrubBudget(interval),
		MaxRate: d.MaxRate, Batch: cmp.Or(d.Batch, DefaultScrubBatch), Metrics: d.Metrics, Logger: d.Logger,
	}})
	return nil
}

// ScrubInterval is the time between two scrub passes under schedule
// ("": the default, every 10 minutes).
func ScrubInterval(schedule string) (time.Duration, error) {
	if schedule == "" {
		return 10 * time.Minute, nil
	}
	s, err := config.CronParser.Parse(schedule)
	if err != nil {
		return 0, fmt.Errorf("scrub schedule %q: %w", schedule, err)
	}
	return schedulePeriod(s, time.Now()), nil
}

// ScrubBudget is how long a pass may read: three quarters of the time
// between passes, at most an hour.
func ScrubBudget(interval time.Duration) time.Duration {
	return min(interval*3/4, time.Hour)
}
