// Package store is Blobplane's Postgres access: one pgxpool per process,
// migrations, and transactional operations over sqlc-generated queries. The
// generated code stays in store/internal/dbsqlc; callers see domain types and
// blobplane errors, never pgx.ErrNoRows.
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/codes"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/tracing"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
	"github.com/blobplane/blobplane/store/internal/slots"
	"github.com/blobplane/blobplane/upload"
)

// Store wraps the process's single connection pool. sqlc queries, River and
// goose all run on it.
type Store struct {
	pool   *pgxpool.Pool
	q      *dbsqlc.Queries
	logger *slog.Logger

	placementsReady atomic.Bool                    // the placement ledger exists (see placements.go)
	authCache       atomic.Pointer[authCache]      // running while StartCaches' listener runs (authcache.go)
	existenceCache  atomic.Pointer[existenceCache] // running while StartCaches' listener runs (existencecache.go)

	fin    slots.Batcher[*finalizeCall] // Finalize batches while its slots are busy (finalize_batch.go)
	claims slots.Batcher[*claimCall]    // claim batches likewise (claim_batch.go)

	chained atomic.Int64 // closes ChainOpenAndStage chained (chain.go)
	// syncCancels counts commits whose wait for the synchronous standby
	// was cancelled (issue 32): committed here, perhaps not on the
	// standby. Shared with the pool's notice hook (OpenAs).
	syncCancels *atomic.Uint64
	batchTracer pgx.BatchTracer // the pool's, for what a chain's pipeline sends (chain.go, internal/pipeline)
}

// BatchStats are the counters of one kind of batched transaction since
// the Store was made (exported as metrics by the api): a slots.Batcher's.
type BatchStats = slots.Stats

// Timeouts are the limits every pool connection's session starts with
// (issue 26 point 5), so that no statement, lock wait or forgotten
// transaction holds a connection, and what it locked, for ever. A zero
// field leaves the server's setting (the role's, the database's), and so
// does the same parameter in DATABASE_URL, which wins. A transaction that
// must run longer raises its own with RaiseTimeouts.
type Timeouts struct {
	Statement         time.Duration // statement_timeout: one statement's run
	Lock              time.Duration // lock_timeout: one wait for a lock (row, table or advisory)
	IdleInTransaction time.Duration // idle_in_transaction_session_timeout: a transaction open with nothing running
}

// DefaultTimeouts are Open's: far above what any statement of the api or
// the worker's bounded batches takes, far below forever.
var DefaultTimeouts = Timeouts{Statement: 30 * time.Second, Lock: 10 * time.Second, IdleInTransaction: time.Minute}

// params are t as Postgres run-time parameters (milliseconds), zero fields
// left out.
func (t Timeouts) params() map[string]string {
	p := map[string]string{}
	for name, d := range map[string]time.Duration{
		"statement_timeout": t.Statement, "lock_timeout": t.Lock, "idle_in_transaction_session_timeout": t.IdleInTransaction,
	} {
		if d > 0 {
			p[name] = strconv.FormatInt(max(1, d.Milliseconds()), 10) // 0 would mean none
		}
	}
	return p
}

// RaiseTimeouts sets t for the rest of tx only (SET LOCAL): the place for a
// long sweep or a migration to raise its own limits above the pool's. Zero
// fields are left as they are.
func RaiseTimeouts(ctx context.Context, tx pgx.Tx, t Timeouts) error {
	for name, v := range t.params() {
		if _, err := tx.Exec(ctx, "SELECT set_config($1, $2, true)", name, v); err != nil {
			return dbErr("raise timeouts", err)
		}
	}
	return nil
}

// Open connects a pool to databaseURL with DefaultTimeouts (OpenWith).
func Open(ctx context.Context, databaseURL string, logger *slog.Logger) (*Store, error) {
	return OpenWith(ctx, databaseURL, logger, DefaultTimeouts)
}

// OpenWith connects a pool to databaseURL, every connection of which starts
// with timeouts, and checks that the server answers. The error names
// DATABASE_URL and never includes the password.
func OpenWith(ctx context.Context, databaseURL string, logger *slog.Logger, timeouts Timeouts) (*Store, error) {
	return OpenAs(ctx, databaseURL, logger, timeouts, ApplicationName)
}

// ApplicationName is the application_name of Blobplane's sessions; an api
// node's are ApplicationName + "/" + its node id (NodeApplicationName).
const ApplicationName = "blobplane"

// NodeApplicationName is the application_name of node's sessions, what
// TerminateNodeSessions finds them by; suffix ("" or "/leases") names a
// pool of the node's.
func NodeApplicationName(node, suffix string) string {
	return ApplicationName + "/" + node + suffix
}

// ErrNoDatabaseURL is the error of opening with no DATABASE_URL: a
// missing setting (the binaries exit 2, as for any invalid one).
var ErrNoDatabaseURL = errors.New("invalid DATABASE_URL: is required (postgres://user@host:port/db); `make run` and `make test` set it for you")

// OpenAs is OpenWith with the sessions' application_name.
func OpenAs(ctx context.Context, databaseURL string, logger *slog.Logger, timeouts Timeouts, applicationName string) (*Store, error) {
	if databaseURL == "" {
		// Required here, where it is used, so that --help and the commands
		// that need no database work without it.
		return nil, blobplane.Wrap(blobplane.CodeInvalid, ErrNoDatabaseURL, "%s", ErrNoDatabaseURL.Error())
	}
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, blobplane.Errorf(blobplane.CodeInvalid, "invalid DATABASE_URL: cannot be parsed")
	}
	if cfg.MaxConns < 8 {
		cfg.MaxConns = 8
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = applicationName
	if len(cfg.ConnConfig.Fallbacks) > 0 && cfg.ConnConfig.ValidateConnect == nil {
		// Several hosts (a failover formation, issue 32): connect only to
		// the one that takes writes, as target_session_attrs=read-write
		// would; a standby first in the list is skipped.
		cfg.ConnConfig.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
	}
	if tracing.Enabled() {
		// Every query a span, in the trace of the request or job that
		// ran it (issue 31).
		cfg.ConnConfig.Tracer = otelpgx.NewTracer()
	}
	for name, v := range timeouts.params() {
		if _, set := cfg.ConnConfig.RuntimeParams[name]; !set {
			cfg.ConnConfig.RuntimeParams[name] = v
		}
	}
	// Issue 32: a commit whose wait for the synchronous standby was
	// cancelled (a statement timeout, a terminated backend) still
	// returns success, with only a WARNING saying it may not be on the
	// standby. Count them: the Guard withholds the success of any write
	// that was under way meanwhile.
	syncCancels := new(atomic.Uint64)
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if strings.Contains(n.Message, "wait for synchronous replication") {
			syncCancels.Add(1)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, blobplane.Wrap(blobplane.CodeUnavailable, err, "cannot reach the database at DATABASE_URL (%s:%d): %v", cfg.ConnConfig.Host, cfg.ConnConfig.Port, rootCause(err))
	}
	st := New(pool, logger)
	st.syncCancels = syncCancels
	return st, nil
}

// New wraps an existing pool.
func New(pool *pgxpool.Pool, logger *slog.Logger) *Store {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	tracer, _ := pool.Config().ConnConfig.Tracer.(pgx.BatchTracer)
	return &Store{pool: pool, q: dbsqlc.New(), logger: logger, batchTracer: tracer, syncCancels: new(atomic.Uint64),
		fin:    slots.Batcher[*finalizeCall]{Slots: finalizeSlots, MaxBatch: maxFinalizeBatch, Order: byFinalizeDigest},
		claims: slots.Batcher[*claimCall]{Slots: claimSlots, MaxBatch: maxClaimBatch, Order: byClaimDigest}}
}

// Pool returns the shared pool, for River and goose.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close closes the pool.
func (s *Store) Close() { s.pool.Close() }

// Ping reports whether the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return blobplane.Wrap(blobplane.CodeUnavailable, err, "database unreachable")
	}
	return nil
}

// InTx runs fn in one transaction, committing when fn returns nil.
func (s *Store) InTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	ctx, span := tracing.Tracer().Start(ctx, "store.tx")
	defer span.End()
	err := pgx.BeginFunc(ctx, s.pool, fn)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "transaction failed")
	}
	return err
}

var errNoRows = pgx.ErrNoRows

// The client-safe messages of database refusals (issue 26 point 10).
const (
	msgRefusedValue = "the database refused a value of this request as malformed"
	msgConflict     = "the request conflicts with data already stored"
)

// dbErr maps driver errors to the project's taxonomy at the store boundary.
// No text of a *pgconn.PgError becomes a Message: it stays in the chain
// (Err), for logs only.
func dbErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return &blobplane.Error{Code: blobplane.CodeNotFound, Op: op, Message: "not found"}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Postgres's own text (relation, constraint and column names,
		// the offending values) stays in Err for the logs; the client
		// gets a stable code and a fixed message (issue 26 point 10).
		if pgErr.Code == "BPQ01" { // blob_references_tenant_usage: past a tenant's quota (our message)
			return &blobplane.Error{Code: blobplane.CodeForbidden, Op: op, Message: pgErr.Message, Err: upload.ErrOverQuota}
		}
		if pgErr.Code == "BPF01" { // nodes_reads_cluster_format: a build that does not read the cluster's format level (our message)
			return &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: pgErr.Message, Err: err}
		}
		if pgErr.Code == "23514" { // check_violation: the schema refused a malformed value
			return &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: msgRefusedValue, Err: err}
		}
		switch pgErr.Code[:2] {
		case "23": // integrity constraint violation
			return &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: msgConflict, Err: err}
		case "40", "53", "57", "08": // serialization, resources, operator intervention (statement_timeout is 57014), connection
			return &blobplane.Error{Code: blobplane.CodeUnavailable, Op: op, Message: "database temporarily unavailable", Retryable: true, Err: err}
		}
		switch pgErr.Code {
		case "55P03", "25P03", // lock_timeout, idle_in_transaction_session_timeout (issue 26 point 5)
			"25006": // read_only_sql_transaction: a connection on a standby after a failover; the Guard resets the pool (issue 32)
			return &blobplane.Error{Code: blobplane.CodeUnavailable, Op: op, Message: "database temporarily unavailable", Retryable: true, Err: err}
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if connectionLost(err) {
		// The server restarted or the connection broke (found by the
		// soak, issue 27: a Postgres restart answered 500s): the client
		// retries, as for any unavailable database.
		return &blobplane.Error{Code: blobplane.CodeUnavailable, Op: op, Message: "database temporarily unavailable", Retryable: true, Err: err}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// connectionLost reports whether err is the connection's failure rather
// than a statement's: a failed connect, a reset or closed connection, a
// read cut short.
func connectionLost(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err) || errors.As(err, &connectErr) ||
		errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, pgconn.ErrConnClosed) // a connection the driver closed under us (a failover, issue 32)
}

// rootCause names why a connection failed in a few words ("connection
// refused") rather than repeating every wrapping layer.
func rootCause(err error) string {
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Err != nil {
		return opErr.Err.Error()
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	return "connection failed"
}
