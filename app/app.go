// Package app wires Blobplane's processes from a validated config: the API
// server and the River worker. Binaries in cmd/ only parse flags, handle
// signals and call into here, so tests run the same wiring in-process.
package app

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
	"riverqueue.com/riverui"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/authority/keeper"
	"github.com/blobplane/blobplane/backend"
	_ "github.com/blobplane/blobplane/backend/fs" // registers the filesystem backend
	_ "github.com/blobplane/blobplane/backend/s3" // registers the S3 backend
	"github.com/blobplane/blobplane/client"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/buildinfo"
	"github.com/blobplane/blobplane/internal/opsmetrics"
	"github.com/blobplane/blobplane/internal/tracing"
	"github.com/blobplane/blobplane/jobs"
	"github.com/blobplane/blobplane/node"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/read"
	"github.com/blobplane/blobplane/replication"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/sweep"
	"github.com/blobplane/blobplane/upload"
)

// Version is the build version reported by nodes (set with -ldflags).
var Version = "dev"

// API is a running-to-be API server: listener bound, dependencies open.
type API struct {
	cfg      *config.Config
	logger   *slog.Logger
	store    *store.Store
	leases   *store.Store // the lease keeper's and the presence lock's pool
	listener net.Listener
	server   *http.Server
	riverUI  *riverui.Handler
	beat     *node.Heartbeater
	backends *Backends
	keeper   *keeper.Keeper
	homes    *partstate.Homes // nil without a backend
	standbys *partstate.Standbys
	guard    *store.Guard // the database's synchronous replication (issue 32)
	// tls, when set, serves listener over HTTPS; internal, when set, is
	// the only listener of the node-to-node endpoints (issue 26 point 8).
	tls            *tls.Config
	internal       net.Listener
	internalServer *http.Server
	// advertise is the host:port registered for peers (nodes table,
	// leases, partition map): config.AdvertiseEndpoint.
	advertise string
}

// Backends are the opened byte backends of this datacenter, by name, in
// configured order.
type Backends struct {
	Order  []string
	ByName map[string]backend.Backend
	// Metrics measure every call to them (backend.Instrument); register
	// its Collectors where the process serves /metrics.
	Metrics *backend.Metrics
	kinds   []string // Kind of each, in Order
	desc    []string // Describe's, taken before instrumenting
}

// OpenBackends opens every configured backend, refusing with an error that
// names the bad one.
func OpenBackends(ctx context.Context, specs []backend.Spec) (*Backends, error) {
	b := &Backends{ByName: map[string]backend.Backend{}, Metrics: backend.NewMetrics()}
	for _, spec := range specs {
		be, err := backend.Open(ctx, spec)
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("invalid BLOBPLANE_BACKENDS: %s: %s", spec.Name, blobplaneMessage(err))
		}
		b.Order = append(b.Order, spec.Name)
		b.kinds = append(b.kinds, spec.Kind)
		b.desc = append(b.desc, describe(spec.Name, spec.Kind, be))
		// Every call measured, and a span when tracing is on (issue 31).
		b.ByName[spec.Name] = backend.Instrument(spec.Name, be, b.Metrics)
	}
	return b, nil
}

// Describe names each backend, in order, with its kind and, for a
// filesystem backend, the sync mode it resolved to (the default depends
// on the kernel: docs/backends.md) and its direct=<bytes> when set, e.g.
// "fs=filesystem(sync=filesystem)": what the api and worker log when they
// start.
func (b *Backends) Describe() []string { return slices.Clone(b.desc) }

func describe(name, kind string, be backend.Backend) string {
	out := name + "=" + kind
	if s, ok := be.(interface{ SyncMode() backend.SyncMode }); ok {
		opts := "sync=" + string(s.SyncMode())
		if d, ok := be.(interface{ Direct() int64 }); ok && d.Direct() > 0 {
			opts += ",direct=" + strconv.FormatInt(d.Direct(), 10)
		}
		out += "(" + opts + ")"
	}
	return out
}

// Close closes every backend.
func (b *Backends) Close() {
	for _, be := range b.ByName {
		be.Close()
	}
}

// NewAPI opens the database and binds the listener. Close it with Serve's
// return or Close.
func NewAPI(ctx context.Context, cfg *config.Config, logger *slog.Logger) (*API, error) {
	// Node-to-node calls (finalization forwarded to a home) need the
	// shared secret before anything serves.
	if err := cfg.ResolveClusterSecret(); err != nil {
		return nil, fmt.Errorf("cluster secret: %w", err)
	}
	st, err := store.OpenAs(ctx, cfg.DatabaseURL, logger, dbTimeouts(cfg), store.NodeApplicationName(cfg.NodeID, ""))
	if err != nil {
		return nil, err
	}
	// The lease keeper and the presence lock use a pool of their own: a
	// renewal never waits behind request traffic for a connection, or a
	// busy node would fence itself (issue 30).
	leases, err := store.OpenAs(ctx, cfg.DatabaseURL, logger, dbTimeouts(cfg), store.NodeApplicationName(cfg.NodeID, "/leases"))
	if err != nil {
		st.Close()
		return nil, err
	}
	a := &API{cfg: cfg, logger: logger, store: st, leases: leases}
	// Issue 32: writes wait for a synchronous standby where the database
	// has one, and a pool on a read-only standby is reset (both pools).
	a.guard = &store.Guard{Store: st, Others: []*store.Store{leases}, Mode: store.SyncMode(cfg.SyncReplication),
		Logger: logger.With("service", "sync_guard")}
	if err := a.checkShutdown(ctx); err != nil {
		st.Close()
		leases.Close()
		return nil, err
	}
	if a.backends, err = OpenBackends(ctx, cfg.Backends); err != nil {
		st.Close()
		leases.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		a.backends.Close()
		st.Close()
		leases.Close()
		return nil, fmt.Errorf("invalid BLOBPLANE_LISTEN: cannot listen on %s: %v", cfg.Listen, errors.Unwrap(err))
	}
	a.listener = ln
	if err := a.listenTLSAndInternal(); err != nil {
		a.Close()
		return nil, err
	}

	// An insert-only River client: the API enqueues work (in the same
	// transaction as the state it follows from) and serves the River UI.
	riverClient, err := river.NewClient(riverpgxv5.New(st.Pool()), &river.Config{Logger: logger, Middleware: tracedJobs()})
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("river client: %w", err)
	}
	// The River UI is served behind an admin grant on every repository
	// (handlers.Deps.Auth), so it is safe on any listener.
	var ui http.Handler
	if cfg.RiverUI {
		h, err := riverui.NewHandler(&riverui.HandlerOpts{
			Endpoints: riverui.NewEndpoints(riverClient, nil),
			Logger:    logger,
			Prefix:    "/riverui",
		})
		if err != nil {
			a.Close()
			return nil, fmt.Errorf("river ui: %w", err)
		}
		a.riverUI, ui = h, h
	}

	// What peers are told: the nodes table, the leases and so the
	// partition map carry it (BLOBPLANE_ADVERTISE_URL; issue 28).
	var warning string
	a.advertise, warning = cfg.AdvertiseEndpoint(ln.Addr().String())
	if warning != "" {
		logger.Warn(warning, "setting", "BLOBPLANE_ADVERTISE_URL", "advertise", a.advertise)
	}
	a.beat = &node.Heartbeater{Store: st, Logger: logger, Node: store.Node{
		ID: cfg.NodeID, Datacenter: cfg.Datacenter, Role: config.API, Endpoint: a.advertise, Version: Version,
		Class: cfg.NodeClass, Capacity: cfg.NodeCapacity,
	}}
	routing := &handlers.Authority{
		NodeID:  cfg.NodeID,
		Maps:    st,
		Reports: st,
		Retry:   authority.RetryDelays{NotReady: time.Second, StaleMap: time.Second},
	}
	// Issue 33: each partition this node is the home of holds its
	// repositories' quota state, restored from its journal before the
	// partition serves; checkpoints and segments go to the upload
	// backend's archive.
	var prepare func(context.Context, string, uint64, int, []authority.SlotRange) bool
	// ZBP-5 R68, R39, R41: no class without its tier and its checkpoint
	// kind; its delta chain bound comes from this node's shutdown budget.
	class := partstate.QuotaClass.ForShutdownBudget(cmp.Or(cfg.ShutdownBudget, partstate.DefaultShutdownBudget))
	if err := class.Validate(); err != nil {
		a.Close()
		return nil, err
	}
	if len(a.backends.Order) > 0 {
		a.homes = &partstate.Homes{Ledger: st, Node: cfg.NodeID, Archive: a.backends.ByName[a.backends.Order[0]],
			Logger: logger.With("service", "partition_state"), Class: class}
		prepare = a.homes.Prepare
	}
	a.keeper, err = keeper.New(leases, keeper.Config{
		NodeID: cfg.NodeID, Endpoint: a.advertise, Logger: logger.With("service", "lease_keeper"),
		Timing:   keeper.TimingFor(cfg.LeaseTTL),
		OnReject: routing.MapRejected,
		Prepare:  prepare,
	})
	if err != nil {
		a.Close()
		return nil, err
	}
	routing.Keeper = a.keeper
	a.beat.Report = a.keeper.Report
	metrics := handlers.NewMetrics()
	metrics.Registry.MustRegister(a.backends.Metrics.Collectors()...)
	metrics.Registry.MustRegister(buildinfo.Collector(config.API),
		opsmetrics.Pools(map[string]*pgxpool.Pool{"main": st.Pool(), "leases": a.leases.Pool()}), opsmetrics.Queues(st.Pool()))
	metrics.RegisterCache("auth", st.AuthCacheStats)
	metrics.RegisterCache("existence", st.ExistenceCacheStats)
	metrics.RegisterBatches("finalize", st.FinalizeBatchStats)
	metrics.RegisterBatches("claim", st.ClaimBatchStats)
	metrics.RegisterChainedCloses(st.ChainedCloses)
	shed := prometheus.NewCounter(prometheus.CounterOpts{Name: "blobplane_partition_writes_shed_total",
		Help: "Writes refused at a partition's home because the partition was over its capacity budget (BLOBPLANE_PARTITION_MAX_WRITES, ZBP-5 R130): answered 503 with Retry-After."})
	metrics.Registry.MustRegister(shed)
	metrics.Registry.MustRegister(a.guard.Collectors()...)
	var quotas upload.Quotas
	if a.homes != nil {
		a.homes.Map, a.homes.Wake, a.homes.Metrics = a.keeper.Map, a.keeper.Notify, partstate.NewMetrics(metrics.Registry)
		quotas = a.homes
		// ZBP-5 R63-R65, R72, R73: the partitions the map names this
		// node a standby of are followed here, and a failover to this
		// node starts from them.
		a.standbys = &partstate.Standbys{Ledger: st, Archive: a.homes.Archive, Node: cfg.NodeID, Map: a.keeper.Map, Primary: a.homes.Holds,
			Logger: logger.With("service", "partition_standby"), Metrics: a.homes.Metrics}
		a.homes.Standbys = a.standbys
	}
	oci := ociDeps(cfg, st, a.backends, a.keeper, quotas, riverClient, a.internalPort(), read.NewMetrics(metrics.Registry), shed, logger)
	router := handlers.NewRouter(handlers.Deps{
		Logger:    logger,
		Metrics:   metrics,
		Readiness: st,
		NodeID:    cfg.NodeID,
		RiverUI:   ui,
		// The routing query answers for this node's datacenter by default.
		Placements: st,
		Datacenter: cfg.Datacenter,
		// Tokens and grants: /v1/admin and the River UI need admin.
		Auth:         st,
		Repositories: st,
		// A force-takeover, the dry-run plan and apply requests for the
		// controller service (*:admin only); the api never rounds or
		// signs itself (ZBP-5 R109, R118).
		Cluster:   &controller.Admin{Store: st, Settings: controller.SettingsFrom(cfg)},
		Authority: routing,
		OCI:       oci,
		// A repository's partition state, at its home or a standby
		// (ZBP-5 R65).
		State: a.partitionState(),
		// The admins' status page at / (issue 31).
		Status: &handlers.StatusPage{Store: st, Replication: jobs.ReplicationBacklog(st.Pool())},
		// Node-to-node endpoints only on their own listener when there
		// is one (issue 26 point 8).
		InternalListener: a.internal != nil,
		// Stalled bodies and slow readers, failed authentications
		// (issue 26 points 5 and 6).
		BodyIdleTimeout: cfg.BodyIdleTimeout,
		AuthFailures:    handlers.FailureLimit{Burst: cfg.AuthFailureBurst, Per: cfg.AuthFailurePer},
		// The node's capacity budget (issue 30): past it, 503 at once.
		MaxRequests: cfg.MaxRequests,
		// No write acknowledged that the primary's loss could take back
		// (issue 32).
		SyncGuard: a.guard,
	})
	// A header must arrive within ReadHeaderTimeout and fit MaxHeaderBytes
	// (0: Go's 1 MiB); a body or an answer that stalls fails after
	// BodyIdleTimeout (the router's idle deadlines). No ReadTimeout or
	// WriteTimeout: they would cut a large transfer that keeps moving
	// (issue 26 point 5).
	a.server = &http.Server{
		Handler:           router,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		TLSConfig:         a.tls,
	}
	if a.internal != nil {
		ih, err := handlers.NewInternalRouter(handlers.Deps{Logger: logger, Metrics: metrics, Authority: routing, OCI: oci, BodyIdleTimeout: cfg.BodyIdleTimeout})
		if err != nil {
			a.Close()
			return nil, fmt.Errorf("invalid BLOBPLANE_INTERNAL_LISTEN: %w", err)
		}
		// Requests are small JSON (nodeauth.MaxBody), but answers may be
		// whole blobs (a copy or a remote read, issues 28 and 29): a
		// request has a whole deadline, an answer only the router's idle
		// ones, like the public listener's.
		a.internalServer = &http.Server{
			Handler:           ih,
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		}
	}
	return a, nil
}

// listenTLSAndInternal loads the api listener's certificate and binds the
// internal listener, as configured, each refused with an error naming its
// setting (issue 26 point 8).
func (a *API) listenTLSAndInternal() error {
	cfg := a.cfg
	if err := cfg.CheckTLS(); err != nil {
		return err
	}
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return fmt.Errorf("invalid BLOBPLANE_TLS_CERT/BLOBPLANE_TLS_KEY: %v", err)
		}
		a.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if cfg.InternalListen != "" {
		ln, err := net.Listen("tcp", cfg.InternalListen)
		if err != nil {
			return fmt.Errorf("invalid BLOBPLANE_INTERNAL_LISTEN: cannot listen on %s: %v", cfg.InternalListen, errors.Unwrap(err))
		}
		a.internal = ln
	}
	return nil
}

// internalPort is the port of the internal listener ("" without one):
// where this node forwards to homes, every node of a cluster serving its
// internal listener on the same port.
func (a *API) internalPort() string {
	if a.internal == nil {
		return ""
	}
	_, port, _ := net.SplitHostPort(a.internal.Addr().String())
	return port
}

// dbTimeouts are the Postgres session limits of cfg (issue 26 point 5).
func dbTimeouts(cfg *config.Config) store.Timeouts {
	return store.Timeouts{Statement: cfg.DBStatementTimeout, Lock: cfg.DBLockTimeout, IdleInTransaction: cfg.DBIdleInTransactionTimeout}
}

// ociDeps wires the /v2/ blob API: uploads stage on the first configured
// backend and publish when this node's keeper holds the repository's
// partition, or are forwarded to the home (a finalize job when it cannot
// be reached). Without a backend there is no blob API.
func ociDeps(cfg *config.Config, st *store.Store, b *Backends, k *keeper.Keeper, quotas upload.Quotas, rc *river.Client[pgx.Tx], internalPort string, reads *read.Metrics, shed prometheus.Counter, logger *slog.Logger) *handlers.OCI {
	if len(b.Order) == 0 {
		return nil
	}
	return &handlers.OCI{
		Store:         st,
		ClusterSecret: cfg.ClusterSecret,
		Map:           k.Map,
		Config: upload.Config{
			Backends: b.ByName, Backend: b.Order[0], Datacenter: cfg.Datacenter,
			Home:           handlers.KeeperHome{NodeID: cfg.NodeID, Keeper: k},
			Replication:    jobs.Replication{Client: rc},
			Targets:        cfg.ReplicateTo,
			MaxBlobSize:    cfg.MaxBlobSize,
			IntentTTL:      cfg.UploadTTL,
			MaxOpenUploads: cfg.MaxOpenUploads,
			MaxStagedBytes: cfg.MaxStagedBytes,
			// ZBP-5 R130: a partition over its budget sheds at admission.
			MaxPartitionWrites: cfg.MaxPartitionWrites,
			OnShed:             func(string) { shed.Inc() },
			// Away from the home: forward to it through the routing contract
			// (maps read from Postgres and verified), or queue a finalize job.
			Forward: jobs.HomeFinalizer{Secret: cfg.ClusterSecret, Internal: jobs.InternalBase(internalPort), Routing: client.New(client.Config{
				Maps: st, HTTP: &http.Client{Timeout: 15 * time.Second, Transport: tracing.Transport(nil)}, MaxWait: 2 * time.Second,
			})},
			Later: jobs.FinalizeQueue{Client: rc},
			// Issue 33: every publication at the home is admitted against
			// its repository's quota.
			Quotas: quotas,
		},
		Reads: &read.Reader{
			Datacenter: cfg.Datacenter, Backends: b.ByName, Ledger: st,
			Remote:      &jobs.RemoteSource{Nodes: st, Secret: cfg.ClusterSecret, Internal: jobs.InternalBase(internalPort), HTTP: &http.Client{Transport: tracing.Transport(nil)}},
			Repair:      jobs.RepairQueue{Client: rc},
			Unverified:  set(cfg.UnverifiedBackends),
			Preference:  cfg.ReadPreference,
			ReadThrough: cfg.ReadThrough,
			PendingWait: cfg.ReadPendingWait,
			Metrics:     reads,
			Logger:      logger,
		},
	}
}

// set is names as a set.
func set(names []string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// Keeper is this node's lease keeper.
func (a *API) Keeper() *keeper.Keeper { return a.keeper }

// Addr is the bound listen address (useful with port 0).
func (a *API) Addr() string { return a.listener.Addr().String() }

// URL is the base URL clients use.
func (a *API) URL() string {
	if a.tls != nil {
		return "https://" + a.Addr()
	}
	return "http://" + a.Addr()
}

// Advertised is the host:port this node registers for peers to reach it
// at (the nodes table, its leases, so the partition map).
func (a *API) Advertised() string { return a.advertise }

// InternalURL is the base URL of the internal listener, "" without one.
func (a *API) InternalURL() string {
	if a.internal == nil {
		return ""
	}
	return "http://" + a.internal.Addr().String()
}

// partitionState is what serves state reads here: nil without homes.
func (a *API) partitionState() *handlers.PartitionState {
	if a.homes == nil {
		return nil
	}
	return &handlers.PartitionState{Homes: a.homes, Standbys: a.standbys}
}

// Serve runs until ctx ends, then stops accepting, drains in-flight requests
// for up to the shutdown timeout, closes what is left, and returns.
func (a *API) Serve(ctx context.Context) error {
	defer a.Close()
	if err := a.beat.Register(ctx); err != nil {
		return fmt.Errorf("register node: %w", err)
	}
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	beatDone := make(chan struct{})
	go func() { defer close(beatDone); a.beat.Run(bg) }()
	defer func() { stopBG(); <-beatDone }()
	keeperDone := make(chan struct{})
	go func() { defer close(keeperDone); a.keeper.Run(bg) }()
	defer func() { stopBG(); <-keeperDone }()
	presenceDone := make(chan struct{})
	go func() { defer close(presenceDone); a.holdPresence(bg) }()
	defer func() { stopBG(); <-presenceDone }()
	guardDone := make(chan struct{})
	go func() { defer close(guardDone); a.guard.Run(bg) }()
	defer func() { stopBG(); <-guardDone }()
	if a.standbys != nil {
		standbysDone := make(chan struct{})
		go func() { defer close(standbysDone); a.standbys.Run(bg) }()
		defer func() { stopBG(); <-standbysDone }()
	}
	// One LISTEN connection wakes the keeper on every map publication and
	// keeps the caches exact: authentications and found blobs are served
	// from memory while it proves that no token, grant or principal
	// changed (docs/auth.md) and no reference was deleted nor blob taken
	// out of live (docs/uploads.md). A zero TTL leaves that cache off.
	// While it is down the keeper's jittered refresh covers publications.
	caches := store.CacheOptions{MapPublished: a.keeper.Notify, HandoffChanged: a.keeper.Notify}
	if a.cfg.AuthCacheTTL > 0 {
		caches.Auth = &store.AuthCacheOptions{TTL: a.cfg.AuthCacheTTL}
	}
	if a.cfg.ExistenceCacheTTL > 0 {
		caches.Existence = &store.ExistenceCacheOptions{TTL: a.cfg.ExistenceCacheTTL}
	}
	defer a.store.StartCaches(bg, caches)()
	if a.riverUI != nil {
		if err := a.riverUI.Start(bg); err != nil {
			return fmt.Errorf("river ui: %w", err)
		}
	}

	errc := make(chan error, 2)
	go func() {
		if a.tls != nil {
			errc <- a.server.ServeTLS(a.listener, "", "") // a.server.TLSConfig holds the certificate
			return
		}
		errc <- a.server.Serve(a.listener)
	}()
	if a.internal != nil {
		go func() { errc <- a.internalServer.Serve(a.internal) }()
	}
	a.logger.Info("api listening", "url", a.URL(), "advertise", a.advertise, "internal_url", a.InternalURL(), "node_id", a.cfg.NodeID, "datacenter", a.cfg.Datacenter, "backends", a.backends.Describe())

	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	// ZBP-5 R84: hand every partition off while still serving, then stop
	// being chosen (leases released, node marked down, presence
	// released), then close the listener, then settle.
	a.drain(ctx)
	stopBG()
	<-keeperDone
	<-beatDone
	<-presenceDone
	a.logger.Info("api shutting down: draining in-flight requests", "timeout", a.cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ShutdownTimeout)
	defer cancel()
	if err := a.server.Shutdown(sctx); err != nil {
		a.logger.Warn("drain deadline passed; closing remaining connections", "err", err)
		a.server.Close()
	}
	if a.internalServer != nil {
		if err := a.internalServer.Shutdown(sctx); err != nil {
			a.internalServer.Close()
		}
	}
	a.logger.Info("api stopped")
	return nil
}

// Close releases the listener and the pool (idempotent).
func (a *API) Close() {
	if a.listener != nil {
		a.listener.Close()
	}
	if a.internal != nil {
		a.internal.Close()
	}
	a.backends.Close()
	a.store.Close()
	a.leases.Close()
}

// Migrate applies goose and River migrations and reports what it did.
func Migrate(ctx context.Context, cfg *config.Config, logger *slog.Logger) (*store.MigrationResult, error) {
	// Without the sessions' limits: a migration may rewrite a large
	// table, and is run by an operator who watches it.
	st, err := store.OpenWith(ctx, cfg.DatabaseURL, logger, store.Timeouts{})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	return store.Migrate(ctx, st.Pool(), logger)
}

// RunWorker runs the River worker until ctx ends: soft stop (finish running
// jobs) within the shutdown timeout, then hard stop (cancel them).
func RunWorker(ctx context.Context, cfg *config.Config, logger *slog.Logger) error {
	periodic, err := jobs.PeriodicJobs(cfg.Cron)
	if err != nil {
		return err
	}
	// The finalize worker forwards to homes with the cluster secret.
	if err := cfg.ResolveClusterSecret(); err != nil {
		return fmt.Errorf("cluster secret: %w", err)
	}
	if cfg.InternalPort() == "0" {
		return errors.New("invalid BLOBPLANE_INTERNAL_LISTEN: the worker forwards to homes at its port, which cannot be 0")
	}
	st, err := store.OpenWith(ctx, cfg.DatabaseURL, logger, dbTimeouts(cfg))
	if err != nil {
		return err
	}
	defer st.Close()
	backends, err := OpenBackends(ctx, cfg.Backends)
	if err != nil {
		return err
	}
	defer backends.Close()
	if ok, err := st.MigrationsCurrent(ctx); err != nil || !ok {
		return fmt.Errorf("database schema is not current (run `api migrate`): %v", err)
	}
	// Issue 27: the attempts a killed predecessor with this node id left
	// running run again now, before this process fetches any, rather
	// than after River's rescue delay (an hour).
	if n, err := jobs.TakeBackRunning(ctx, st.Pool(), cfg.NodeID); err != nil {
		return err
	} else if n > 0 {
		logger.Info("took back the jobs a previous worker with this node id left running", "node_id", cfg.NodeID, "jobs", n)
	}
	queues := workerQueues(cfg, backends)
	// Homes serve node-to-node calls at the cluster's internal port when
	// BLOBPLANE_INTERNAL_LISTEN is set (issue 26 point 8).
	workers := jobs.Workers(jobs.Deps{Store: st, Logger: logger, ClusterSecret: cfg.ClusterSecret, InternalPort: cfg.InternalPort(), ReplicateTo: cfg.ReplicateTo})
	reaper := newReaper(cfg, st, backends, logger)
	jobs.AddSweepWorker(workers, reaper, newRetention(cfg, st, logger))
	collectDeps := jobs.CollectDeps{Store: st, Logger: logger, Datacenter: cfg.Datacenter, Backends: backends.ByName,
		InventoryMinAge: cfg.InventoryMinAge, InventoryMaxDeletes: cfg.InventoryMaxDeletes, DeleteDelay: cfg.CollectDeleteDelay}
	var replMetrics *replication.Metrics
	var latency *opsmetrics.JobLatency
	if cfg.WorkerMetrics != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
			buildinfo.Collector(config.Worker), opsmetrics.Pools(map[string]*pgxpool.Pool{"main": st.Pool()}), opsmetrics.Queues(st.Pool()))
		reg.MustRegister(backends.Metrics.Collectors()...)
		latency = opsmetrics.NewJobLatency(reg)
		reaper.Metrics = sweep.NewMetrics(reg)
		collectDeps.Metrics = sweep.NewCollectMetrics(reg)
		replMetrics = replication.NewMetrics(reg)
		reg.MustRegister(replication.NewBacklogCollector(jobs.ReplicationBacklog(st.Pool()), logger))
		stop, err := serveMetrics(cfg.WorkerMetrics, reg, logger)
		if err != nil {
			return err
		}
		defer stop()
	}
	jobs.AddCollectWorkers(workers, collectDeps)
	jobs.AddObliterateWorker(workers, st, logger) // issue 29: obliteration's steps (docs/obliteration.md)
	if err := addReplicationWorkers(workers, cfg, st, backends, replMetrics, logger); err != nil {
		return err
	}
	client, err := river.NewClient(riverpgxv5.New(st.Pool()), &river.Config{
		// Each job worked (and inserted) a span (issue 31).
		Middleware:   tracedJobs(),
		ID:           cfg.NodeID,
		Logger:       logger,
		Queues:       queues,
		Workers:      workers,
		PeriodicJobs: periodic,
		// Issue 27: an attempt whose outcome was never recorded is
		// retried within minutes, not River's hour.
		RescueStuckJobsAfter: jobs.RescueStuckJobsAfter,
		// Issue 28: River's default (100 ms between fetches) bounded a
		// queue to MaxWorkers jobs per 100 ms: 1,000 published blobs took
		// 25 s to reach the other datacenter (p99 lag 21 s); at 20 ms the
		// copies keep pace with publication (p99 0.2 s;
		// BenchmarkReplicationLag1000x4KiB, docs/replication.md).
		FetchCooldown: 20 * time.Millisecond,
	})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	beat := &node.Heartbeater{Store: st, Logger: logger, Node: store.Node{
		ID: cfg.NodeID, Datacenter: cfg.Datacenter, Role: config.Worker, Version: Version,
	}}
	if err := beat.Register(ctx); err != nil {
		return fmt.Errorf("register node: %w", err)
	}
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	beatDone := make(chan struct{})
	go func() { defer close(beatDone); beat.Run(bg) }()
	defer func() { stopBG(); <-beatDone }()
	if latency != nil {
		events, unsubscribe := client.Subscribe(opsmetrics.EventKinds...)
		defer unsubscribe()
		go latency.Follow(bg, events)
	}

	// Issue 32: connections that landed on a read-only standby (a name
	// or proxy that moved with a failover, river#1225) are dropped, so
	// River recovers without a restart. The worker acknowledges nothing
	// to a client: the guard only watches.
	guard := &store.Guard{Store: st, Mode: store.SyncWatch, Logger: logger.With("service", "sync_guard")}
	guardDone := make(chan struct{})
	go func() { defer close(guardDone); guard.Run(bg) }()
	defer func() { stopBG(); <-guardDone }()
	if err := client.Start(bg); err != nil {
		return fmt.Errorf("start river: %w", err)
	}
	// Issue 30: a new map means a home moved; the uploads answered 202
	// while it was unreachable are finalized at once, not after their
	// backoff.
	wakeDone := make(chan struct{})
	go func() { defer close(wakeDone); wakeFinalizations(bg, st, client, logger) }()
	defer func() { stopBG(); <-wakeDone }()
	logger.Info("worker started", "node_id", cfg.NodeID, "datacenter", cfg.Datacenter, "queues", cfg.Queues, "cron", cfg.Cron, "backends", backends.Describe())
	<-ctx.Done()

	logger.Info("worker stopping: finishing running jobs", "timeout", cfg.ShutdownTimeout)
	soft, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	if err := client.Stop(soft); err != nil {
		logger.Warn("soft stop deadline passed; cancelling running jobs", "err", err)
		hard, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := client.StopAndCancel(hard); err != nil {
			return fmt.Errorf("hard stop: %w", err)
		}
	}
	logger.Info("worker stopped")
	return nil
}

// newReaper wires the reaper of expired uploads to this datacenter's
// backends.
func newReaper(cfg *config.Config, st *store.Store, backends *Backends, logger *slog.Logger) *sweep.Reaper {
	return &sweep.Reaper{Store: st, Backends: sweep.Narrow[sweep.StagedDeleter](backends.ByName), Datacenter: cfg.Datacenter, Batch: cfg.SweepBatch, Logger: logger.With("service", "reaper")}
}

// tracedJobs is River's tracing middleware when tracing is on: a span per
// job inserted and worked, the worked one in the trace of the request
// that inserted it.
func tracedJobs() []rivertype.Middleware {
	if !tracing.Enabled() {
		return nil
	}
	return []rivertype.Middleware{otelriver.NewMiddleware(nil)}
}

// newRetention wires the sweep's retention of finished rows (issue 31).
func newRetention(cfg *config.Config, st *store.Store, logger *slog.Logger) *sweep.Retention {
	return &sweep.Retention{Store: st, Operations: cfg.RetainOperations, History: cfg.RetainHistory,
		Batch: cfg.SweepBatch, MaxBatches: 10, Logger: logger.With("service", "retention")}
}

// serveMetrics serves reg at http://addr/metrics until stop is called.
func serveMetrics(addr string, reg *prometheus.Registry, logger *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("invalid BLOBPLANE_WORKER_METRICS: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	// Liveness for the platform (issue 31): the process serves.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	// Bounded like the api's (issue 26 point 5); it serves no body.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10, IdleTimeout: 2 * time.Minute}
	go func() { _ = srv.Serve(ln) }()
	logger.Info("worker metrics listening", "url", "http://"+ln.Addr().String()+"/metrics")
	return func() { _ = srv.Close() }, nil
}

// SweepReport is what `worker sweep` prints: one pass of each sweep of
// this datacenter, in the order the scheduled jobs run them.
type SweepReport struct {
	DryRun bool `json:"dry_run"`
	// Steps are the steps this pass ran (SweepSteps, or those of --only);
	// the report of a step that did not run is absent.
	Steps []string `json:"steps"`
	// Reaper: expired intents abandoned and staged uploads deleted.
	Reaper *sweep.Report `json:"reaper,omitempty"`
	// Collector: digests collected (nil in a dry run).
	Collector *sweep.CollectReport `json:"collector,omitempty"`
	// CollectCandidates: in a dry run, the unowned digests a pass would
	// decide now (an unlocked read: a pass may still find some owned).
	CollectCandidates []blobplane.Digest `json:"collect_candidates,omitempty"`
	// BytesDeleted and DeletionsSuperseded: this datacenter's byte
	// deletions the pass decided, finished now. Deletions in other
	// datacenters stay owed for their delete_bytes jobs.
	BytesDeleted        int `json:"bytes_deleted"`
	DeletionsSuperseded int `json:"deletions_superseded"`
	// DeletionsDelayed: deletions the pass decided that are not due
	// before BLOBPLANE_COLLECT_DELETE_DELAY; they stay owed, and a
	// worker's collect pass schedules their delete_bytes jobs.
	DeletionsDelayed int `json:"deletions_delayed"`
	// Inventory: every object classified; orphans deleted unless dry run.
	Inventory *sweep.InventoryReport `json:"inventory,omitempty"`
	// Retention: finished rows pruned (a dry run: one batch's worth).
	Retention *store.Pruned `json:"retention,omitempty"`
}

// decided records the deletions a collection decided, to finish the local
// ones right after the pass (RunSweep has no River client of its own).
type decided struct{ got []store.Deletion }

func (d *decided) EnqueueDeletionsTx(_ context.Context, _ pgx.Tx, ds []store.Deletion) error {
	d.got = append(d.got, ds...)
	return nil
}

// SweepSteps are the steps of `worker sweep`, in the order they run.
var SweepSteps = []string{"reaper", "collector", "inventory", "retention"}

// SweepOptions say what RunSweep does.
type SweepOptions struct {
	// DryRun lists what the pass would reclaim and changes nothing.
	DryRun bool
	// Steps are the SweepSteps to run (`--only`); nil runs every one.
	Steps []string
}

func (o SweepOptions) runs(step string) bool { return o.Steps == nil || slices.Contains(o.Steps, step) }

// RunSweep runs one pass of the sweeps now (`worker sweep [--dry-run]
// [--only ...]`): the reaper, the collector (finishing its byte deletions
// in this datacenter) and the inventory, or those of opts.Steps, and
// writes the report as JSON to out: what it reclaimed, or with DryRun
// would. Errors: invalid for an unknown step.
func RunSweep(ctx context.Context, cfg *config.Config, logger *slog.Logger, opts SweepOptions, out io.Writer) error {
	for _, step := range opts.Steps {
		if !slices.Contains(SweepSteps, step) {
			return blobplane.Errorf(blobplane.CodeInvalid, "unknown sweep step %q: must be one of %s", step, strings.Join(SweepSteps, ", "))
		}
	}
	dryRun := opts.DryRun
	st, backends, err := openOneShot(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer st.Close()
	defer backends.Close()
	rep := SweepReport{DryRun: dryRun}
	for _, step := range SweepSteps {
		if opts.runs(step) {
			rep.Steps = append(rep.Steps, step)
		}
	}
	err = func() error {
		if opts.runs("reaper") {
			r, err := newReaper(cfg, st, backends, logger).RunOnce(ctx, dryRun)
			rep.Reaper = &r
			if err != nil {
				return err
			}
		}
		if opts.runs("collector") {
			if err := runCollector(ctx, cfg, st, backends, logger, dryRun, &rep); err != nil {
				return err
			}
		}
		if opts.runs("inventory") {
			inv := &sweep.Inventory{Store: st, Backends: sweep.Narrow[sweep.Lister](backends.ByName), Datacenter: cfg.Datacenter,
				MinAge: cfg.InventoryMinAge, MaxDeletes: cfg.InventoryMaxDeletes, Logger: logger.With("service", "inventory")}
			r, err := inv.Run(ctx, dryRun)
			rep.Inventory = &r
			if err != nil {
				return err
			}
		}
		if opts.runs("retention") {
			r, err := newRetention(cfg, st, logger).RunOnce(ctx, dryRun)
			rep.Retention = &r
			return err
		}
		return nil
	}()
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	if eerr := enc.Encode(rep); eerr != nil {
		return errors.Join(err, eerr)
	}
	return err
}

// openOneShot opens what a one-shot worker command (`worker sweep`,
// `worker scrub`) works on: the store, once its schema is current, and
// the datacenter's backends. The caller closes both.
func openOneShot(ctx context.Context, cfg *config.Config, logger *slog.Logger) (*store.Store, *Backends, error) {
	st, err := store.OpenWith(ctx, cfg.DatabaseURL, logger, dbTimeouts(cfg))
	if err != nil {
		return nil, nil, err
	}
	if ok, err := st.MigrationsCurrent(ctx); err != nil || !ok {
		st.Close()
		return nil, nil, fmt.Errorf("database schema is not current (run `api migrate`): %v", err)
	}
	backends, err := OpenBackends(ctx, cfg.Backends)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return st, backends, nil
}

// AdoptReport is what `worker sweep --adopt` prints.
type AdoptReport struct {
	Datacenter string `json:"datacenter"`
	Backend    string `json:"backend"`
	Cluster    string `json:"cluster"`
	Pass       int64  `json:"pass"`
}

// RunAdopt is an operator's answer to an inventory refusal (`worker sweep
// --adopt NAME`, docs/sweeps.md): after checking that the backend named
// name belongs to this database, it rewrites the backend's ownership
// marker to name this database (sweep.Inventory.Adopt) and prints the
// record as JSON to out. It deletes nothing; the next pass does, if due.
func RunAdopt(ctx context.Context, cfg *config.Config, logger *slog.Logger, name string, out io.Writer) error {
	st, backends, err := openOneShot(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer st.Close()
	defer backends.Close()
	inv := &sweep.Inventory{Store: st, Backends: sweep.Narrow[sweep.Lister](backends.ByName), Datacenter: cfg.Datacenter, Logger: logger.With("service", "inventory")}
	rec, err := inv.Adopt(ctx, name)
	if err != nil {
		return err
	}
	return json.NewEncoder(out).Encode(AdoptReport{Datacenter: cfg.Datacenter, Backend: name, Cluster: rec.Cluster, Pass: rec.Pass})
}

// runCollector is RunSweep's collector step: one collection pass, then
// this datacenter's byte deletions it decided (in a dry run, only the
// candidates).
func runCollector(ctx context.Context, cfg *config.Config, st *store.Store, backends *Backends, logger *slog.Logger, dryRun bool, rep *SweepReport) error {
	if dryRun {
		var err error
		rep.CollectCandidates, err = st.CollectCandidates(ctx, sweep.DefaultCollectBatch)
		return err
	}
	var local decided
	c := &sweep.Collector{Store: st, Enqueuer: &local, Logger: logger.With("service", "collector")}
	cr, err := c.RunOnce(ctx)
	rep.Collector = &cr
	if err != nil {
		return err
	}
	del := &sweep.Deleter{Store: st, Backends: sweep.Narrow[sweep.ObjectDeleter](backends.ByName), Datacenter: cfg.Datacenter, Delay: cfg.CollectDeleteDelay}
	for _, d := range local.got {
		if d.Key.Datacenter != cfg.Datacenter {
			continue
		}
		res, err := del.Delete(ctx, d.Key)
		if nd := (*store.NotDueError)(nil); errors.As(err, &nd) {
			rep.DeletionsDelayed++ // owed: the worker's delete_bytes job deletes them once due
			continue
		}
		if err != nil {
			return err
		}
		switch res {
		case store.DeletionDeleted:
			rep.BytesDeleted++
		case store.DeletionSuperseded:
			rep.DeletionsSuperseded++
		}
	}
	return nil
}

func blobplaneMessage(err error) string {
	var e *blobplane.Error
	if errors.As(err, &e) {
		return e.Error()
	}
	return err.Error()
}

// workerQueues are the River queues a worker of cfg polls: the
// configured ones, its datacenter's byte deletions and, with a backend,
// the copies into its datacenter.
func workerQueues(cfg *config.Config, backends *Backends) map[string]river.QueueConfig {
	queues := map[string]river.QueueConfig{}
	for name, max := range cfg.Queues {
		queues[name] = river.QueueConfig{MaxWorkers: max}
	}
	// Byte deletions run where the bytes are: each datacenter's workers
	// poll their own deletion queue.
	if _, ok := queues[jobs.DeletionQueue(cfg.Datacenter)]; !ok {
		queues[jobs.DeletionQueue(cfg.Datacenter)] = river.QueueConfig{MaxWorkers: 4}
	}
	// Copies into this datacenter and its scrub run here (issue 28): its
	// workers hold the target backends and pull the bytes from a
	// verified source. 16 at a time: a copy waits on the network and the
	// disk far more than on the CPU (4 made 1,000 small copies take 3.6
	// times as long). BLOBPLANE_QUEUES=replicate_<dc>=N overrides it.
	if _, ok := queues[jobs.ReplicationQueue(cfg.Datacenter)]; !ok && len(backends.Order) > 0 {
		queues[jobs.ReplicationQueue(cfg.Datacenter)] = river.QueueConfig{MaxWorkers: 16}
	}
	return queues
}

// addReplicationWorkers registers the transfer and scrub workers of a
// worker with backends (issue 28).
func addReplicationWorkers(w *river.Workers, cfg *config.Config, st *store.Store, backends *Backends, m *replication.Metrics, logger *slog.Logger) error {
	if len(backends.Order) == 0 {
		return nil
	}
	if err := jobs.AddReplicateWorker(w, jobs.ReplicateDeps{
		Store: st, Datacenter: cfg.Datacenter, Backends: backends.ByName, Backend: backends.Order[0],
		ClusterSecret: cfg.ClusterSecret, InternalPort: cfg.InternalPort(), Metrics: m, Logger: logger,
	}); err != nil {
		return err
	}
	return jobs.AddScrubWorkers(w, jobs.ScrubDeps{Store: st, Datacenter: cfg.Datacenter, Backends: backends.ByName,
		Period: cfg.ScrubPeriod, Schedule: cfg.Cron[config.ScrubJob], MaxRate: cfg.ScrubRate, Batch: cfg.ScrubBatch, Metrics: m, Logger: logger})
}
