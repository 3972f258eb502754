// Package jobs holds Blobplane's River job arguments and workers, and turns
// the configured cron schedules into River periodic jobs.
package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/riverqueue/river"

	"github.com/blobplane/blobplane/client"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/internal/tracing"
	"github.com/blobplane/blobplane/store"
)

// Deps are what workers need. Every field but InternalPort is required.
type Deps struct {
	Store  *store.Store
	Logger *slog.Logger
	// ClusterSecret authenticates the finalize worker to repositories'
	// homes (config.Config.ResolveClusterSecret).
	ClusterSecret string
	// InternalPort is the port of the homes' internal listeners
	// (BLOBPLANE_INTERNAL_LISTEN); "" forwards to their public endpoints.
	InternalPort string
	// ReplicateTo is the replication targets of a repository no policy
	// matches (BLOBPLANE_REPLICATE_TO, the api's too): the reconciler's
	// fallback.
	ReplicateTo []string
}

// Workers registers every worker Blobplane runs.
func Workers(d Deps) *river.Workers {
	w := river.NewWorkers()
	river.AddWorker(w, &NodePruneWorker{store: d.Store, logger: d.Logger})
	// The worker has no seed URL: the routing client reads the published
	// maps from Postgres (and verifies them).
	routing := client.New(client.Config{Maps: d.Store, HTTP: &http.Client{Timeout: 30 * time.Second, Transport: tracing.Transport(nil)}})
	river.AddWorker(w, &FinalizeWorker{Home: HomeFinalizer{Routing: routing, Secret: d.ClusterSecret, Internal: InternalBase(d.InternalPort)}, Logger: d.Logger})
	river.AddWorker(w, &ReconcileWorker{Store: d.Store, Fallback: d.ReplicateTo, Logger: d.Logger})
	return w
}

// periodic maps a cron job name (the key in BLOBPLANE_CRON) to the job it
// enqueues.
var periodic = map[string]func() river.JobArgs{
	NodePruneArgs{}.Kind(): func() river.JobArgs { return NodePruneArgs{} },
	SweepArgs{}.Kind():     func() river.JobArgs { return SweepArgs{} },
	InventoryArgs{}.Kind(): func() river.JobArgs { return InventoryArgs{} },
	CollectArgs{}.Kind():   func() river.JobArgs { return CollectArgs{} },
	ScrubArgs{}.Kind():     func() river.JobArgs { return ScrubArgs{} },
	ReconcileArgs{}.Kind(): func() river.JobArgs { return ReconcileArgs{} },
}

// PeriodicJobNames lists the names BLOBPLANE_CRON accepts.
func PeriodicJobNames() []string {
	names := make([]string, 0, len(periodic))
	for n := range periodic {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// PeriodicJobs builds River periodic jobs from name → cron schedule. An
// unknown name is refused with the list of known ones. Each job runs on
// start and is unique per scheduled period, so several workers (only the
// elected leader enqueues) and restarts never double a run.
func PeriodicJobs(schedules map[string]string) ([]*river.PeriodicJob, error) {
	var out []*river.PeriodicJob
	names := make([]string, 0, len(schedules))
	for n := range schedules {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		ctor, ok := periodic[name]
		if !ok {
			return nil, fmt.Errorf("invalid BLOBPLANE_CRON: unknown job %q (known: %s)", name, strings.Join(PeriodicJobNames(), ", "))
		}
		sched, err := config.CronParser.Parse(schedules[name])
		if err != nil {
			return nil, fmt.Errorf("invalid BLOBPLANE_CRON: %s: %v", name, err)
		}
		period := schedulePeriod(sched, time.Now())
		out = append(out, river.NewPeriodicJob(sched, func() (river.JobArgs, *river.InsertOpts) {
			return ctor(), &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: period}}
		}, &river.PeriodicJobOpts{ID: name, RunOnStart: true}))
	}
	return out, nil
}

// schedulePeriod is the gap between two scheduled runs (at least a
// second): the window in which one run is unique.
func schedulePeriod(s interface{ Next(time.Time) time.Time }, now time.Time) time.Duration {
	a := s.Next(now)
	d := s.Next(a).Sub(a)
	if d < time.Second {
		d = time.Second
	}
	return d
}

// NodePruneArgs marks down nodes whose heartbeat stopped.
type NodePruneArgs struct{}

func (NodePruneArgs) Kind() string { return "node_prune" }

// NodeDownAfter is how long a node may miss heartbeats before it is marked
// down (heartbeats come every NodeHeartbeatInterval).
const NodeDownAfter = 90 * time.Second

// NodePruneWorker runs NodePruneArgs.
type NodePruneWorker struct {
	river.WorkerDefaults[NodePruneArgs]
	store  *store.Store
	logger *slog.Logger
}

func (w *NodePruneWorker) Work(ctx context.Context, job *river.Job[NodePruneArgs]) error {
	ids, err := w.store.PruneNodes(ctx, NodeDownAfter)
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		w.logger.InfoContext(ctx, "marked nodes down", "nodes", ids)
	}
	return nil
}
