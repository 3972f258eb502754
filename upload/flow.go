package upload

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/placement"
)

// Flow runs uploads from the first byte to publication (docs/uploads.md):
// open a session or a single-request upload, append chunks, close (claim
// the content and stage its key, write through the backend while hashing,
// verify), then publish at the repository's home, forward to the home,
// or accept (202) for the home's finalize job. Each step is a cell of the
// state machine (Transition), checked against the intent (StateOf) before
// it runs. The HTTP layer translates requests into its calls and its
// answers (Result, Error) into responses; it decides nothing else.
type Flow struct {
	store       Store
	backends    map[string]backend.Backend
	backend     string
	datacenter  string
	home        HomeResolver
	forward     Forwarder
	quotas      Quotas
	later       Enqueuer
	replication ReplicationEnqueuer
	targets     []string
	maxBlobSize int64
	ttl         time.Duration
	bounds      *bounds
	budget      *partitionBudget // writes in flight per partition at its home (R130)
	logger      *slog.Logger
	// repos are repositories known to exist (ensureRepository), at most
	// maxKnownRepos of them.
	repos      sync.Map
	knownRepos atomic.Int64
}

// maxKnownRepos bounds the repositories a Flow remembers as existing;
// past it each first write of another checks the database again.
const maxKnownRepos = 100_000

// ensureRepository creates repo on principal's first push into it
// (issue 31: Distribution, zot, GHCR and GitLab do; the OCI conformance
// suite assumes it). The handler checked the principal may write repo —
// its grant covers the name — before any flow runs; the creation is
// recorded with who (repositories.created_by) and when, and logged.
func (f *Flow) ensureRepository(ctx context.Context, repo, principal string) error {
	if _, ok := f.repos.Load(repo); ok {
		return nil
	}
	created, err := f.store.EnsureRepository(ctx, repo, principal)
	if err != nil {
		return err
	}
	if created {
		f.logger.InfoContext(ctx, "repository created by its first push", "repository", repo, "principal", principal)
	}
	if f.knownRepos.Load() < maxKnownRepos {
		if _, loaded := f.repos.LoadOrStore(repo, struct{}{}); !loaded {
			f.knownRepos.Add(1)
		}
	}
	return nil
}

// forgetRepository drops repo from the known set when the database says
// it does not exist (deleted since): the next push creates it again.
func (f *Flow) forgetRepository(repo string, err error) {
	if SubjectOf(err) == Repository && blobplane.ErrorCode(err) == blobplane.CodeNotFound {
		if _, loaded := f.repos.LoadAndDelete(repo); loaded {
			f.knownRepos.Add(-1)
		}
	}
}

// Config is how a Flow runs. Backends, Backend, Datacenter and Home are
// required.
type Config struct {
	// Backends are this datacenter's byte backends by name; Backend names
	// the one uploads stage into.
	Backends   map[string]backend.Backend
	Backend    string
	Datacenter string
	Home       HomeResolver
	// Replication enqueues replication work in the publishing
	// transaction; needed only when other datacenters exist.
	Replication ReplicationEnqueuer
	// Targets is the replication policy (FinalizeRequest.Targets): nil
	// means every registered datacenter other than the ingress, empty none.
	Targets []string
	// MaxBlobSize bounds a blob's size; 0 means DefaultMaxBlobSize.
	MaxBlobSize int64
	// IntentTTL is how long an idle upload session lives; 0 means
	// DefaultIntentTTL.
	IntentTTL time.Duration
	// MaxOpenUploads and MaxStagedBytes bound what one principal holds
	// open: upload sessions, and bytes staged by chunked sessions (issue
	// 26: nothing a writer does exhausts the api for others); past them
	// too_many_requests. 0 means DefaultMaxOpenUploads
	// (DefaultMaxStagedBytes); negative, no bound.
	MaxOpenUploads int64
	MaxStagedBytes int64
	// MaxPartitionWrites bounds the writes one partition has in flight
	// at its home (ZBP-5 R130): past it a write is refused as retryable
	// unavailable. 0 means DefaultMaxPartitionWrites; negative, no bound.
	// OnShed, when set, is told of each refusal (a metric).
	MaxPartitionWrites int64
	OnShed             func(partition string)
	// UsagePeriod is how often those bounds re-read what principals hold
	// open; 0 means DefaultUsagePeriod, negative at every check (tests).
	UsagePeriod time.Duration
	// Forward hands finalization to the repository's home when this node
	// is not it; Later enqueues it when the home cannot be reached.
	// Without them a close away from the home is accepted with no job.
	Forward Forwarder
	Later   Enqueuer
	// Quotas admits each publication at the home against its
	// repository's quota; nil admits everything.
	Quotas Quotas
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultMaxBlobSize    int64 = 10 << 30
	DefaultIntentTTL            = time.Hour
	DefaultMaxOpenUploads int64 = 1000
	DefaultMaxStagedBytes int64 = 100 << 30
	DefaultUsagePeriod          = time.Second
)

// NewFlow is the flow over store that c describes, its zero settings
// defaulted.
func NewFlow(store Store, c Config) *Flow {
	f := &Flow{store: store, backends: c.Backends, backend: c.Backend, datacenter: c.Datacenter,
		home: c.Home, forward: c.Forward, later: c.Later, quotas: c.Quotas, replication: c.Replication, targets: c.Targets,
		maxBlobSize: c.MaxBlobSize, ttl: c.IntentTTL, logger: c.Logger}
	if f.logger == nil {
		f.logger = slog.New(slog.DiscardHandler)
	}
	if f.maxBlobSize <= 0 {
		f.maxBlobSize = DefaultMaxBlobSize
	}
	if f.ttl <= 0 {
		f.ttl = DefaultIntentTTL
	}
	b := &bounds{usages: store.OpenUsages, maxOpen: c.MaxOpenUploads, maxStaged: c.MaxStagedBytes, period: c.UsagePeriod}
	if b.maxOpen == 0 {
		b.maxOpen = DefaultMaxOpenUploads
	}
	if b.maxStaged == 0 {
		b.maxStaged = DefaultMaxStagedBytes
	}
	if b.period == 0 {
		b.period = DefaultUsagePeriod
	}
	f.bounds = b
	f.budget = &partitionBudget{max: c.MaxPartitionWrites, onShed: c.OnShed, inFlight: map[string]int64{}}
	if f.budget.max == 0 {
		f.budget.max = DefaultMaxPartitionWrites
	}
	return f
}

// MaxBlobSize is the largest blob the flow takes.
func (f *Flow) MaxBlobSize() int64 { return f.maxBlobSize }

// step checks that in may take ev now (Transition over StateOf): the
// table, not the caller, says which steps follow which.
func step(in Intent, ev Event) error {
	_, err := Transition(StateOf(in), ev)
	return err
}

// objectKey is the placement d's bytes take on backend in this ingress's
// datacenter.
func (f *Flow) objectKey(d blobplane.Digest, backend string) placement.Key {
	return placement.Key{Digest: d, Backend: backend, Datacenter: f.datacenter, Location: placement.ObjectLocation(d)}
}

// finalizeRequest is the publication of operation op's content d, size
// bytes, fenced by home, with this flow's replication policy.
func (f *Flow) finalizeRequest(home Home, op string, d blobplane.Digest, size int64) FinalizeRequest {
	return FinalizeRequest{OperationID: op, Digest: d, Size: size,
		Partition: home.Partition, Node: home.Node, Epoch: home.Epoch,
		Targets: f.targets, Replication: f.replication}
}
