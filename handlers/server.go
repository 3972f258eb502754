// Package handlers is Blobplane's HTTP surface: the chi router, its
// middleware (request ids, structured logs, metrics, panic recovery), the
// operational endpoints, and JSON errors with stable codes.
package handlers

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/blobplane/blobplane"
)

// Readiness is what /readyz asks: can this node serve?
type Readiness interface {
	// Ping fails when the database is unreachable.
	Ping(ctx context.Context) error
	// MigrationsCurrent reports whether the schema is at this build's version.
	MigrationsCurrent(ctx context.Context) (bool, error)
}

// Deps are the parts the router needs. RiverUI is optional.
type Deps struct {
	Logger    *slog.Logger
	Metrics   *Metrics
	Readiness Readiness
	NodeID    string
	RiverUI   http.Handler
	// Authority enables the routing contract and the map endpoints; nil
	// leaves them unmounted.
	Authority *Authority
	// Placements enables the routing query GET /v1/blobs/{digest}/placements;
	// nil leaves it unmounted. Datacenter is this node's label, the query's
	// default.
	Placements PlacementRouter
	Datacenter string
	// Auth checks tokens. Without it nothing that needs a principal is
	// mounted: no /v1/admin, no River UI (fail closed).
	Auth Authenticator
	// AuthFailures limits failed authentications per client address and
	// per token id (zero: DefaultFailureLimit; authlimit.go).
	AuthFailures FailureLimit
	// BodyIdleTimeout is how long one read of a request body or one write
	// of a response may wait for the client (zero:
	// DefaultBodyIdleTimeout; idle.go).
	BodyIdleTimeout time.Duration
	// Repositories backs /v1/admin/repositories (admin only) and, as it
	// implements them, the replication policies (PolicyAdmin),
	// obliteration (ObliterationAdmin), tokens and grants
	// (IdentityAdmin); nil leaves the routes unmounted.
	Repositories RepositoryAdmin
	// Cluster backs the controller's operator commands under /v1/admin
	// (a force-takeover, the dry-run plan, apply requests; *:admin only,
	// cluster.go); nil leaves them unmounted.
	Cluster ClusterAdmin
	// OCI enables the /v2/ blob API and GET /v1/operations/{id} (with
	// Auth); nil leaves them unmounted.
	OCI *OCI
	// State serves GET /v1/admin/state/<repository> (with Auth and
	// Authority): a repository's partition state at its home, or at a
	// standby under a stated staleness bound (state.go); nil leaves it
	// unmounted.
	State *PartitionState
	// MaxRequests is the node's capacity budget: requests in flight past
	// it are answered 503 with Retry-After (capacity.go). 0 means
	// DefaultMaxRequests; negative, no bound.
	MaxRequests int64
	// Status enables the admins' status page at / (with Auth); nil leaves
	// it unmounted.
	Status *StatusPage
	// SyncGuard, when set, holds the blob API's writes to the database's
	// synchronous replication (issue 32, syncguard.go).
	SyncGuard SyncGuard
	// InternalListener says the node-to-node endpoints are served by
	// NewInternalRouter on a listener of their own: this router leaves
	// them out (issue 26 point 8).
	InternalListener bool
}

// NewRouter builds the chi router with every route and middleware.
func NewRouter(d Deps) http.Handler {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Metrics == nil {
		d.Metrics = NewMetrics()
	}
	if d.BodyIdleTimeout <= 0 {
		d.BodyIdleTimeout = DefaultBodyIdleTimeout
	}
	if d.Auth != nil {
		// Every Authenticate below counts failures and refuses clients
		// and token ids over the limit (issue 26 point 6).
		d.Auth = &limitedAuth{Authenticator: d.Auth, limits: newFailureLimiter(d.AuthFailures,
			func(limit string) { d.Metrics.authRefused.WithLabelValues(limit).Inc() })}
	}
	r := chi.NewRouter()
	r.Use(idleDeadlines(d.BodyIdleTimeout)) // outermost (issue 26 point 5)
	r.Use(middleware.RequestID)
	r.Use(requestIDHeader)
	r.Use(traceRequests) // outside the access log: its line names the trace
	r.Use(d.Metrics.middleware)
	r.Use(accessLog(d.Logger))
	r.Use(recoverer(d.Logger))
	if d.MaxRequests == 0 {
		d.MaxRequests = DefaultMaxRequests
	}
	r.Use(capacity(d.MaxRequests, d.Metrics.overloaded))

	r.Get("/healthz", func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok", "node_id": d.NodeID})
	})
	r.Get("/readyz", readyz(d))
	// The /v1 API's OpenAPI document (issue 31), checked against this
	// router by TestOpenAPIMatchesTheRouter.
	r.Get("/v1/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(OpenAPI)
	})
	r.Handle("/metrics", promhttp.HandlerFor(d.Metrics.Registry, promhttp.HandlerOpts{Registry: d.Metrics.Registry}))
	if a := d.Authority; a != nil {
		if a.Logger == nil {
			a.Logger = d.Logger
		}
		a.register(d.Metrics.Registry)
		a.routes(r, d)
	}
	if d.Placements != nil {
		placementsRoutes(r, d)
	}
	if d.Auth != nil {
		adminRoutes(r, d)
		whoamiRoute(r, d)
	}
	if d.Auth != nil && d.OCI != nil {
		ociRoutes(r, d)
	}
	if d.Auth != nil && d.Status != nil {
		statusRoutes(r, d)
	}
	switch {
	case d.RiverUI == nil:
	case d.Auth == nil:
		d.Logger.Warn("River UI not mounted: it needs an admin grant and no authenticator is configured")
	default:
		riverUIRoutes(r, d)
	}
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, r, d.Logger, blobplane.Errorf(blobplane.CodeNotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusMethodNotAllowed, ErrorBody{Code: "method_not_allowed", Message: r.Method + " is not allowed on " + r.URL.Path, RequestID: middleware.GetReqID(r.Context())})
	})
	return r
}

func readyz(d Deps) http.HandlerFunc {
	// Migrations only move forward while a process runs, so a positive
	// answer is cached; the database ping is not.
	var migrated atomic.Bool
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := d.Readiness.Ping(ctx); err != nil {
			WriteError(w, r, d.Logger, blobplane.Wrap(blobplane.CodeUnavailable, err, "database unreachable"))
			return
		}
		if !migrated.Load() {
			ok, err := d.Readiness.MigrationsCurrent(ctx)
			if err != nil {
				WriteError(w, r, d.Logger, blobplane.Wrap(blobplane.CodeUnavailable, err, "cannot read migration state"))
				return
			}
			if !ok {
				WriteError(w, r, d.Logger, blobplane.Errorf(blobplane.CodeUnavailable, "database schema is behind this build: run `api migrate`"))
				return
			}
			migrated.Store(true)
		}
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ready", "node_id": d.NodeID})
	}
}

func requestIDHeader(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", middleware.GetReqID(r.Context()))
		next.ServeHTTP(w, r)
	})
}

func accessLog(logger *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
			note := &requestNote{}
			next.ServeHTTP(ww, r.WithContext(context.WithValue(r.Context(), requestNoteKey{}, note)))
			attrs := []slog.Attr{
				slog.String("method", r.Method),
				slog.String("path", r.URL.Path),
				slog.String("route", routePattern(r)),
				slog.Int("status", ww.Status()),
				slog.Int("bytes", ww.BytesWritten()),
				slog.Duration("duration", time.Since(start)),
				slog.String("request_id", middleware.GetReqID(r.Context())),
				slog.String("remote", r.RemoteAddr),
			}
			// Who did what to which repository and blob (issue 31): the
			// principal once authenticated, the repository and digest once
			// the route named them.
			for _, kv := range [][2]string{{"principal", note.principal}, {"repository", note.repository}, {"digest", note.digest}} {
				if kv[1] != "" {
					attrs = append(attrs, slog.String(kv[0], kv[1]))
				}
			}
			logger.LogAttrs(r.Context(), slog.LevelInfo, "http", attrs...)
		})
	}
}

// requestNote is what the access log says of a request beyond its HTTP
// line, filled in as the request is understood.
type requestNote struct{ principal, repository, digest string }

type requestNoteKey struct{}

// noteRequest records part of the request's note (a no-op outside the
// access log).
func noteRequest(ctx context.Context, fill func(*requestNote)) {
	if n, ok := ctx.Value(requestNoteKey{}).(*requestNote); ok {
		fill(n)
	}
}

// recoverer turns a panic into a logged internal error with no stack trace
// in the response.
func recoverer(logger *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				if v := recover(); v != nil {
					if v == http.ErrAbortHandler {
						panic(v)
					}
					logger.ErrorContext(r.Context(), "panic in handler", "panic", v, "request_id", middleware.GetReqID(r.Context()))
					WriteError(w, r, logger, blobplane.Errorf(blobplane.CodeInternal, "internal error"))
				}
			}()
			next.ServeHTTP(w, r)
		})
	}
}
