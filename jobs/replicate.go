package jobs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/internal/nodeauth"
	"github.com/blobplane/blobplane/internal/tracing"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/replication"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// ReplicationQueue is the River queue of copies into datacenter: its own
// workers pull the bytes (they hold the target backends), so adding
// workers there adds throughput (issue 28).
func ReplicationQueue(datacenter string) string { return datacenterQueue("replicate_", datacenter) }

// LegacyReplicationQueue is the one queue replication jobs went to before
// issue 28, which no worker polled; migration 00020 moves what waited
// there to the target datacenters' queues.
const LegacyReplicationQueue = "replication"

// ReplicateArgs asks for a verified copy of a published blob in
// TargetDatacenter, preferably read from SourceDatacenter (the ingress).
// Unique per digest and target among jobs not yet finished: two
// publications of one digest (two repositories) make one copy, and a
// repair after a finished copy gets a job of its own.
type ReplicateArgs struct {
	OperationID      string           `json:"operation_id"`
	Digest           blobplane.Digest `json:"digest" river:"unique"`
	Size             int64            `json:"size"`
	SourceDatacenter string           `json:"source_datacenter"`
	TargetDatacenter string           `json:"target_datacenter" river:"unique"`
}

func (ReplicateArgs) Kind() string { return "replicate" }

// InsertOpts: the target's queue, unique per digest and target.
func (a ReplicateArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: ReplicationQueue(a.TargetDatacenter), UniqueOpts: unfinished}
}

// unfinished is uniqueness by the args' unique fields among jobs not yet
// finished.
var unfinished = river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{
	rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable, rivertype.JobStateRunning, rivertype.JobStateScheduled,
}}

// Replication enqueues replication jobs inside finalization's transaction.
type Replication struct {
	// Client may be insert-only (no workers): the API's River client.
	Client *river.Client[pgx.Tx]
}

var _ upload.ReplicationEnqueuer = Replication{}

// EnqueueReplicationTx inserts one ReplicateArgs job per target in tx.
func (r Replication) EnqueueReplicationTx(ctx context.Context, tx pgx.Tx, rep upload.Replication) error {
	params := make([]river.InsertManyParams, 0, len(rep.Targets))
	for _, t := range rep.Targets {
		params = append(params, river.InsertManyParams{Args: ReplicateArgs{
			OperationID: rep.OperationID, Digest: rep.Digest, Size: rep.Size, SourceDatacenter: rep.SourceDatacenter, TargetDatacenter: t,
		}})
	}
	if _, err := r.Client.InsertManyTx(ctx, tx, params); err != nil {
		return fmt.Errorf("enqueue replication of %s: %w", rep.Digest, err)
	}
	return nil
}

// ReplicateDeps are what the replicate worker needs: this datacenter's
// ledger view and backends (the first in Order takes the copies), and the
// cluster secret to read from other datacenters' nodes.
type ReplicateDeps struct {
	Store         *store.Store
	Datacenter    string
	Backends      map[string]backend.Backend
	Backend       string // the backend copies are written to
	ClusterSecret string
	InternalPort  string
	Metrics       *replication.Metrics // nil: none
	Logger        *slog.Logger
}

// AddReplicateWorker registers the replicate worker on w.
func AddReplicateWorker(w *river.Workers, d ReplicateDeps) error {
	be, ok := d.Backends[d.Backend]
	if !ok {
		return fmt.Errorf("replicate worker: backend %q is not configured", d.Backend)
	}
	river.AddWorker(w, &ReplicateWorker{Transfer: &replication.Transfer{
		Ledger: d.Store, Datacenter: d.Datacenter, BackendName: d.Backend, Backend: be,
		Local:   LocalSource{Backends: d.Backends},
		Remote:  &RemoteSource{Nodes: d.Store, Secret: d.ClusterSecret, Internal: InternalBase(d.InternalPort), HTTP: &http.Client{Transport: tracing.Transport(nil)}},
		Metrics: d.Metrics, Logger: d.Logger,
	}, Logger: d.Logger})
	return nil
}

// ReplicateWorker runs ReplicateArgs in the target datacenter.
type ReplicateWorker struct {
	river.WorkerDefaults[ReplicateArgs]
	Transfer *replication.Transfer
	Logger   *slog.Logger
}

// Timeout bounds one attempt in proportion to the blob: a minute plus
// the time to move it at 8 MiB/s. River's rescuer leaves a running
// attempt alone until both RescueStuckJobsAfter and this timeout have
// passed (river#350; TestRescueWaitsForAJobsOwnTimeout), so a large copy
// is rescued only once it is truly stuck; a rescued attempt takes the
// row over under a newer epoch and a late verification by the first is
// refused (S3).
func (w *ReplicateWorker) Timeout(job *river.Job[ReplicateArgs]) time.Duration {
	return time.Minute + time.Duration(job.Args.Size/(8<<20))*time.Second
}

// NextRetry is River's backoff (attempt^4 seconds) capped at
// FinalizeMaxBackoff: a target datacenter back after an hour's outage
// drains its backlog within minutes, with no operator.
func (w *ReplicateWorker) NextRetry(job *river.Job[ReplicateArgs]) time.Time {
	a := time.Duration(job.Attempt)
	return time.Now().Add(min(a*a*a*a*time.Second, FinalizeMaxBackoff))
}

// Work copies the blob, or finds it copied. A job in another
// datacenter's queue is refused (a misrouted insert), never worked here.
func (w *ReplicateWorker) Work(ctx context.Context, job *river.Job[ReplicateArgs]) error {
	a := job.Args
	if a.TargetDatacenter != w.Transfer.Datacenter {
		return river.JobCancel(fmt.Errorf("replicate %s: target %s is not this datacenter (%s)", a.Digest, a.TargetDatacenter, w.Transfer.Datacenter))
	}
	res, err := w.Transfer.Run(ctx, replication.Request{Digest: a.Digest, Size: a.Size, SourceDatacenter: a.SourceDatacenter, TakeOver: job.Attempt > 1})
	if err != nil {
		w.Logger.WarnContext(ctx, "transfer failed; it is retried", "digest", a.Digest, "target", a.TargetDatacenter, "attempt", job.Attempt, "reason", replication.Classify(err), "err", err)
		return err
	}
	if !res.AlreadyVerified {
		w.Logger.InfoContext(ctx, "transfer verified", "digest", a.Digest, "target", a.TargetDatacenter, "from", res.Source.Datacenter, "bytes", res.Bytes, "epoch", res.Placement.Epoch)
	}
	return nil
}

// LocalSource reads verified placements of this datacenter from its
// backends.
type LocalSource struct {
	Backends map[string]backend.Backend
}

// Open implements replication.Source.
func (s LocalSource) Open(ctx context.Context, p placement.Placement) (io.ReadCloser, error) {
	be, ok := s.Backends[p.Backend]
	if !ok {
		return nil, fmt.Errorf("backend %q of %s is not configured here", p.Backend, p.Digest)
	}
	obj, err := be.Read(ctx, p.Digest, backend.ReadOptions{})
	if err != nil {
		return nil, err
	}
	return obj.Body, nil
}

// InternalBlobPath is the internal endpoint a node serves its
// datacenter's verified bytes at (signed node calls only).
const InternalBlobPath = "/internal/v1/blobs/"

// NodeLister lists the registered nodes (store.Store).
type NodeLister interface {
	ListNodes(ctx context.Context) ([]store.Node, error)
}

// RemoteSource reads a verified placement of another datacenter from an
// api node there, through its internal endpoint, each request signed
// with the cluster secret (internal/nodeauth).
type RemoteSource struct {
	Nodes    NodeLister
	Secret   string
	Internal func(base string) string
	HTTP     *http.Client

	// The node list, read at most once per nodeListTTL: a remote read of
	// a small blob would otherwise cost a query more than the read.
	mu      sync.Mutex
	nodes   []store.Node
	fetched time.Time
}

// nodeListTTL bounds how stale the node list a remote open walks may be:
// a node gone since is refused and the next one tried, a node new since
// is used from the next list on (heartbeats come every few seconds
// anyway).
const nodeListTTL = 2 * time.Second

// upNodes lists the up api nodes of dc, from the node list read at most
// nodeListTTL ago.
func (s *RemoteSource) upNodes(ctx context.Context, dc string) ([]store.Node, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes == nil || time.Since(s.fetched) > nodeListTTL {
		nodes, err := s.Nodes.ListNodes(ctx)
		if err != nil {
			return nil, err
		}
		s.nodes, s.fetched = nodes, time.Now()
	}
	var out []store.Node
	for _, n := range s.nodes {
		if n.Role == config.API && n.State == "up" && n.Datacenter == dc && n.Endpoint != "" {
			out = append(out, n)
		}
	}
	return out, nil
}

// Open implements replication.Source: the whole of p from the first up
// api node of its datacenter that answers 200.
func (s *RemoteSource) Open(ctx context.Context, p placement.Placement) (io.ReadCloser, error) {
	obj, err := s.OpenBlob(ctx, p.Datacenter, p.Digest, nil)
	if err != nil {
		return nil, err
	}
	return obj.Body, nil
}

// OpenBlob implements read.Remote: d (rng of it; nil, whole) from the
// first up api node of datacenter dc that answers 200 (206 for a range).
// Nodes are tried in the node list's order until one answers.
func (s *RemoteSource) OpenBlob(ctx context.Context, dc string, d blobplane.Digest, rng *backend.Range) (*backend.Object, error) {
	nodes, err := s.upNodes(ctx, dc)
	if err != nil {
		return nil, err
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("no api node of datacenter %s is up", dc)
	}
	var errs []error
	for _, n := range nodes {
		obj, err := s.open(ctx, n, d, rng)
		if err == nil {
			return obj, nil
		}
		errs = append(errs, fmt.Errorf("node %s: %w", n.ID, err))
	}
	return nil, errors.Join(errs...)
}

func (s *RemoteSource) open(ctx context.Context, n store.Node, d blobplane.Digest, rng *backend.Range) (*backend.Object, error) {
	base := n.Endpoint
	if !strings.Contains(base, "://") {
		base = "http://" + base // registered as host:port (controller.Endpoint)
	}
	if s.Internal != nil {
		base = s.Internal(base)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+InternalBlobPath+url.PathEscape(string(d)), nil)
	if err != nil {
		return nil, err
	}
	want := http.StatusOK
	if rng != nil {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", rng.Offset, rng.Offset+rng.Length-1))
		want = http.StatusPartialContent
	}
	if err := nodeauth.SignRequest(req, []byte(s.Secret), nil, time.Now()); err != nil {
		return nil, err
	}
	resp, err := s.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != want {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		return nil, fmt.Errorf("%s answered %d: %s", base, resp.StatusCode, b)
	}
	if rng != nil && resp.ContentLength != rng.Length {
		resp.Body.Close()
		return nil, fmt.Errorf("%s answered %d bytes for a range of %d", base, resp.ContentLength, rng.Length)
	}
	return &backend.Object{Body: resp.Body, Length: resp.ContentLength}, nil
}

// ReplicationBacklog reads, per datacenter (every registered one, and
// any a job targets), the unfinished replicate jobs into it and the age
// of the oldest (replication.BacklogSource).
func ReplicationBacklog(db Queryer) replication.BacklogSource {
	return func(ctx context.Context) ([]replication.Backlog, error) {
		// Every registered datacenter, with 0 when nothing waits: a
		// drained backlog reads 0, not a missing series.
		rows, err := db.Query(ctx, `
			WITH waiting AS (
				SELECT args->>'target_datacenter' AS dc, created_at FROM river_job
				WHERE kind = 'replicate' AND state IN ('available', 'pending', 'retryable', 'running', 'scheduled'))
			SELECT d.dc, count(w.created_at), coalesce(extract(epoch FROM now() - min(w.created_at)), 0)::float8
			FROM (SELECT datacenter::text AS dc FROM nodes UNION SELECT dc FROM waiting) AS d
			LEFT JOIN waiting AS w ON w.dc = d.dc
			GROUP BY d.dc ORDER BY d.dc`)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (replication.Backlog, error) {
			var b replication.Backlog
			var age float64
			err := r.Scan(&b.Datacenter, &b.Jobs, &age)
			b.OldestAge = time.Duration(age * float64(time.Second))
			return b, err
		})
	}
}

// Queryer runs a query: a pool or a transaction.
type Queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}
