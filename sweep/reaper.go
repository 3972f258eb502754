// Package sweep reclaims bytes that were never published (DESIGN flow 5,
// L1, issue 7, ../shared/spec/publication-across-two-stores.md).
//
// The reaper of expired intents decides abandonment in Postgres first, on
// the intent row (S5), and deletes the staged bytes only after that decision
// commits, idempotently. Expiry is permission to reclaim, not proof the
// writer is dead: a writer that wakes after its intent was reaped fails on
// the row. Staged uploads are per attempt (the backend names them, never the
// content digest), so deleting one never touches a content-addressed object
// another attempt published (S6).
package sweep

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/store"
)

// ReaperStore is what the reaper needs from Postgres; *store.Store
// implements it.
type ReaperStore interface {
	// ReapExpiredIntents decides abandonment of up to limit expired
	// pending intents (or, with dryRun, lists them) and returns them.
	ReapExpiredIntents(ctx context.Context, datacenter string, limit int, dryRun bool) ([]store.ReapedIntent, error)
	// UndeletedStagedIntents lists abandoned intents whose staged bytes
	// are not confirmed deleted: the retry queue of crashed or failed
	// deletes.
	UndeletedStagedIntents(ctx context.Context, datacenter string, limit int) ([]store.ReapedIntent, error)
	// MarkStagedDeleted records confirmed deletes in one statement;
	// idempotent.
	MarkStagedDeleted(ctx context.Context, ops ...string) error
	// OldestOverdueIntent is the age of the oldest item still waiting.
	OldestOverdueIntent(ctx context.Context, datacenter string) (time.Duration, error)
}

var _ ReaperStore = (*store.Store)(nil)

// StagedDeleter deletes staged uploads; every backend.Backend is one.
type StagedDeleter interface {
	// AbortUpload discards the staged upload id; an unknown id succeeds,
	// which is what makes the delete safe to repeat after a crash.
	AbortUpload(ctx context.Context, id string) error
}

var _ StagedDeleter = (backend.Backend)(nil)

// DefaultBatch bounds one pass when Reaper.Batch is unset.
const DefaultBatch = 1000

// Reaper reclaims the staged bytes of expired and abandoned uploads of one
// datacenter. It is safe to run on several workers at once and to re-run.
type Reaper struct {
	Store ReaperStore
	// Backends are this datacenter's backends by name (intents.backend).
	Backends   map[string]StagedDeleter
	Datacenter string
	Batch      int          // items per step of a pass; <= 0 means DefaultBatch
	Logger     *slog.Logger // nil discards
	Metrics    *Metrics     // nil records nothing
}

// Report is what one pass did, or with DryRun would do.
type Report struct {
	DryRun bool `json:"dry_run"`
	// Reaped are the intents this pass abandoned (would abandon).
	Reaped []store.ReapedIntent `json:"reaped"`
	// Deleted are the staged uploads deleted (would be deleted): those of
	// this pass's reaps and of earlier abandonments still waiting.
	Deleted []store.ReapedIntent `json:"deleted"`
	// BytesReclaimed sums the deleted uploads' staged sizes as last
	// recorded on their intents.
	BytesReclaimed int64 `json:"bytes_reclaimed"`
	// Failed counts deletes that failed; the next pass retries them.
	Failed int `json:"failed"`
	// OldestOverdue is the age of the oldest item still waiting after
	// the pass (an expired intent not yet reaped, or staged bytes not yet
	// deleted).
	OldestOverdue time.Duration `json:"oldest_overdue_ns"`
}

// ErrDeleteFailed is joined into RunOnce's error when a staged delete
// failed; the intent stays queued and the next pass retries it.
var ErrDeleteFailed = errors.New("staged upload delete failed; the next sweep retries it")

// RunOnce runs one bounded pass: first it retries the deletes earlier
// passes left behind, then it abandons up to Batch expired intents (one
// transaction) and, after that commit, deletes their staged uploads and
// records each delete. With dryRun it only lists what it would do. The
// report is complete even when the error is not nil.
func (r *Reaper) RunOnce(ctx context.Context, dryRun bool) (Report, error) {
	rep := Report{DryRun: dryRun}
	limit := r.Batch
	if limit <= 0 {
		limit = DefaultBatch
	}
	waiting, err := r.Store.UndeletedStagedIntents(ctx, r.Datacenter, limit)
	if err != nil {
		return rep, fmt.Errorf("sweep: %w", err)
	}
	rep.Reaped, err = r.Store.ReapExpiredIntents(ctx, r.Datacenter, limit, dryRun)
	if err != nil {
		return rep, fmt.Errorf("sweep: %w", err)
	}
	r.metrics().reaped(dryRun, len(rep.Reaped))
	var errs []error
	items := append(waiting, rep.Reaped...)
	failed := r.deleteAll(ctx, items, dryRun)
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	var done []string
	for i, in := range items {
		if err := failed[i]; err != nil {
			rep.Failed++
			errs = append(errs, err)
			r.logger().WarnContext(ctx, "staged upload delete failed; retried next sweep",
				"operation_id", in.OperationID, "backend", in.Backend, "staged_location", in.StagedLocation, "err", err)
			continue
		}
		done = append(done, in.OperationID)
		if in.StagedLocation != "" {
			rep.Deleted = append(rep.Deleted, in)
			rep.BytesReclaimed += in.ReceivedBytes
		}
	}
	if !dryRun {
		// One statement for the pass. A crash before it only repeats
		// the deletes (idempotent) on the next pass.
		if err := r.Store.MarkStagedDeleted(ctx, done...); err != nil {
			return rep, fmt.Errorf("sweep: %w", err)
		}
	}
	r.metrics().reclaimed(dryRun, rep.BytesReclaimed, rep.Failed)
	if age, err := r.Store.OldestOverdueIntent(ctx, r.Datacenter); err != nil {
		errs = append(errs, err)
	} else {
		rep.OldestOverdue = age
		r.metrics().overdue(age)
	}
	if len(rep.Reaped) > 0 || len(rep.Deleted) > 0 || rep.Failed > 0 {
		r.logger().InfoContext(ctx, "reaper pass", "dry_run", dryRun, "reaped", len(rep.Reaped),
			"deleted", len(rep.Deleted), "bytes_reclaimed", rep.BytesReclaimed, "failed", rep.Failed)
	}
	if rep.Failed > 0 {
		errs = append(errs, ErrDeleteFailed)
	}
	return rep, errors.Join(errs...)
}

// deleteParallelism bounds the staged deletes one pass runs at once: a
// delete is a backend round trip (an unlink and a directory sync on the
// filesystem, a request on S3), so a few in flight hide the latency.
const deleteParallelism = 8

// deleteAll deletes the staged uploads of items, deleteParallelism at a
// time, and returns each one's error (nil: deleted or nothing staged).
func (r *Reaper) deleteAll(ctx context.Context, items []store.ReapedIntent, dryRun bool) []error {
	errs := make([]error, len(items))
	if dryRun {
		return errs
	}
	sem := make(chan struct{}, deleteParallelism)
	var wg sync.WaitGroup
	for i, in := range items {
		if in.StagedLocation == "" {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = r.deleteStaged(ctx, in)
		})
	}
	wg.Wait()
	return errs
}

// deleteStaged deletes in's staged upload; deleting a missing one
// succeeds, so a crash before MarkStagedDeleted only repeats it.
func (r *Reaper) deleteStaged(ctx context.Context, in store.ReapedIntent) error {
	be, ok := r.Backends[in.Backend]
	if !ok {
		return &blobplane.Error{Code: blobplane.CodeUnavailable, Op: "sweep", Retryable: true,
			Message: fmt.Sprintf("backend %q of upload %s is not configured on this worker", in.Backend, in.OperationID)}
	}
	if err := be.AbortUpload(ctx, in.StagedLocation); err != nil {
		return fmt.Errorf("delete staged upload of %s: %w", in.OperationID, err)
	}
	return nil
}

func (r *Reaper) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return r.Logger
}

func (r *Reaper) metrics() *Metrics { return r.Metrics }

// Metrics are the sweeps' Prometheus series. The kind label separates what
// was reclaimed ("staged" for the reaper's staged uploads), so other sweeps
// share the series.
type Metrics struct {
	IntentsReaped  prometheus.Counter
	BytesReclaimed *prometheus.CounterVec // kind
	DeleteFailures *prometheus.CounterVec // kind
	OldestOverdue  *prometheus.GaugeVec   // kind
}

// NewMetrics registers the sweep series on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		IntentsReaped: prometheus.NewCounter(prometheus.CounterOpts{Name: "blobplane_sweep_intents_reaped_total",
			Help: "Expired upload intents the reaper abandoned."}),
		BytesReclaimed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "blobplane_sweep_reclaimed_bytes_total",
			Help: "Bytes deleted by sweeps, by kind (staged: staged uploads of abandoned intents)."}, []string{"kind"}),
		DeleteFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "blobplane_sweep_delete_failures_total",
			Help: "Sweep byte deletes that failed and wait for the next pass, by kind."}, []string{"kind"}),
		OldestOverdue: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "blobplane_sweep_oldest_overdue_seconds",
			Help: "Age of the oldest item a sweep still has to reclaim, by kind (staged: expired intents and undeleted staged uploads), as of the last pass."}, []string{"kind"}),
	}
	reg.MustRegister(m.IntentsReaped, m.BytesReclaimed, m.DeleteFailures, m.OldestOverdue)
	return m
}

func (m *Metrics) reaped(dryRun bool, n int) {
	if m != nil && !dryRun {
		m.IntentsReaped.Add(float64(n))
	}
}

func (m *Metrics) reclaimed(dryRun bool, bytes int64, failed int) {
	if m != nil && !dryRun {
		m.BytesReclaimed.WithLabelValues("staged").Add(float64(bytes))
		m.DeleteFailures.WithLabelValues("staged").Add(float64(failed))
	}
}

func (m *Metrics) overdue(age time.Duration) {
	if m != nil {
		m.OldestOverdue.WithLabelValues("staged").Set(age.Seconds())
	}
}
