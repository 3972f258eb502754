package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/internal/nodeauth"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/upload"
)

// Node-to-node endpoints (docs/uploads.md). They accept only requests
// signed with the cluster secret, never a user token, and run at the
// repository's home through the routing contract.

// internalFinalizeCall is the body of POST /internal/v1/finalize/{id}
// (jobs.FinalizeCall).
type internalFinalizeCall struct {
	Repository string `json:"repository"`
}

type finalizeCallKey struct{}

// RequireClusterSecret is middleware that admits only requests signed with
// the cluster secret (internal/nodeauth: an HMAC over method, request URI,
// body digest, timestamp and nonce). The secret itself never travels, so
// a captured request proves nothing past its window and is refused if
// replayed within it; the signature binds the operation and the body
// (issue 26 point 8). The body is read, at most nodeauth.MaxBody bytes,
// before the check, and handed on unchanged. Anything else (no header, a
// static Bearer secret, Basic, a user token, a stale, replayed or
// mismatched signature, an empty configured secret) is 401.
func RequireClusterSecret(secret string, logger *slog.Logger) func(http.Handler) http.Handler {
	v := nodeauth.NewVerifier([]byte(secret))
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := v.VerifyRequest(r); err != nil {
				code := blobplane.CodeUnauthorized
				switch {
				case errors.Is(err, nodeauth.ErrTooLarge):
					code = blobplane.CodeTooLarge
				case errors.Is(err, nodeauth.ErrBusy):
					code = blobplane.CodeUnavailable
				}
				WriteError(w, r, logger, blobplane.Errorf(code, "node-to-node endpoint: a request signed with the cluster secret is required: %s", err))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// internalRoutes mounts the node-to-node endpoints on the public router,
// unless Deps.InternalListener says they have a listener of their own
// (NewInternalRouter).
func internalRoutes(r chi.Router, d Deps, h *ociHandler) {
	if d.InternalListener {
		return // issue 26 point 8: never on the public listener then
	}
	mountInternal(r, d, h)
}

// NewInternalRouter serves only the node-to-node endpoints, for a listener
// of their own (BLOBPLANE_INTERNAL_LISTEN); the public router built from
// the same Deps (with InternalListener set) leaves them out. It needs
// d.Authority and d.OCI with a ClusterSecret, and is built after NewRouter
// when both share d.Authority (NewRouter registers its metrics).
func NewInternalRouter(d Deps) (http.Handler, error) {
	if d.Authority == nil || d.OCI == nil || d.OCI.ClusterSecret == "" {
		return nil, errors.New("internal router: needs the routing authority, the blob API and a cluster secret")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Metrics == nil {
		d.Metrics = NewMetrics()
	}
	if a := d.Authority; a.routed == nil {
		if a.Logger == nil {
			a.Logger = d.Logger
		}
		a.register(d.Metrics.Registry)
	}
	if d.BodyIdleTimeout <= 0 {
		d.BodyIdleTimeout = DefaultBodyIdleTimeout
	}
	h := newOCIHandler(d.OCI, d.Logger)
	r := chi.NewRouter()
	// Blob bodies cross here (issue 28, 29): each read and write has an
	// idle deadline, the whole exchange none.
	r.Use(idleDeadlines(d.BodyIdleTimeout))
	r.Use(middleware.RequestID)
	r.Use(requestIDHeader)
	r.Use(traceRequests) // continues the calling node's trace
	r.Use(accessLog(d.Logger))
	r.Use(recoverer(d.Logger))
	mountInternal(r, d, h)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, r, d.Logger, blobplane.Errorf(blobplane.CodeNotFound, "no route for %s %s on the internal listener", r.Method, r.URL.Path))
	})
	return r, nil
}

// mountInternal mounts POST /internal/v1/finalize/{operation_id}: the
// signature first, then the body (it names the repository, the routing
// key), then the routing contract, then Finalize under the admitted
// partition and epoch.
func mountInternal(r chi.Router, d Deps, h *ociHandler) {
	a := d.Authority
	decode := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var call internalFinalizeCall
			b, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
			if err == nil {
				err = json.Unmarshal(b, &call)
			}
			if err != nil || !auth.ValidRepository(call.Repository) {
				WriteError(w, r, h.logger, blobplane.Errorf(blobplane.CodeInvalid, `body must be {"repository": "<a valid repository name>"}`))
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), finalizeCallKey{}, call)))
		})
	}
	key := func(r *http.Request) string {
		call, _ := r.Context().Value(finalizeCallKey{}).(internalFinalizeCall)
		return call.Repository
	}
	// Issue 28: a node of another datacenter copying a blob reads this
	// datacenter's verified bytes here (jobs.RemoteSource).
	r.With(RequireClusterSecret(h.ClusterSecret, h.logger)).Get("/internal/v1/blobs/{digest}", h.internalBlob)
	r.With(RequireClusterSecret(h.ClusterSecret, h.logger), decode, a.RequireHome(key)).
		Post("/internal/v1/finalize/{operation_id}", func(w http.ResponseWriter, r *http.Request) {
			h.finalizeAtHome(w, r, a.NodeID, key(r), chi.URLParam(r, "operation_id"))
		})
	// A DELETE of a blob received away from the home (ZBP-5 R19:
	// repository state changes at the home, under its epoch).
	r.With(RequireClusterSecret(h.ClusterSecret, h.logger), decode, a.RequireHome(key)).
		Post("/internal/v1/references/delete/{digest}", func(w http.ResponseWriter, r *http.Request) {
			h.deleteReferenceAtHome(w, r, a.NodeID, key(r), chi.URLParam(r, "digest"))
		})
}

// deleteReferenceAtHome removes repo's reference to digest under this
// node's admitted lease: 204 with the position it was applied at
// (X-Partition-Position), or the refusal with its code (not_found: no
// reference).
func (h *ociHandler) deleteReferenceAtHome(w http.ResponseWriter, r *http.Request, node, repo, digest string) {
	home, ok := HomeOf(r.Context())
	if !ok {
		WriteError(w, r, h.logger, blobplane.Errorf(blobplane.CodeInternal, "delete without an admitted home"))
		return
	}
	d, err := blobplane.ParseDigest(digest)
	var pos string
	if err == nil {
		pos, err = h.flow.DeleteReferenceAtHome(r.Context(), upload.Home{Partition: home.Partition, Node: node, Epoch: home.Epoch}, repo, d)
	}
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	if pos != "" {
		w.Header().Set(partstate.PositionHeader, pos)
	}
	w.WriteHeader(http.StatusNoContent)
}

// finalizeAtHome publishes operation op of repo with this node's authority
// (upload.Flow.FinalizeAtHome): 201 and the outcome when it publishes
// now, 200 and the stored outcome when it had already published, or the
// refusal with its code (no outcome stored).
func (h *ociHandler) finalizeAtHome(w http.ResponseWriter, r *http.Request, node, repo, op string) {
	home, ok := HomeOf(r.Context())
	if !ok {
		WriteError(w, r, h.logger, blobplane.Errorf(blobplane.CodeInternal, "finalize without an admitted home"))
		return
	}
	o, published, err := h.flow.FinalizeAtHome(r.Context(), upload.Home{Partition: home.Partition, Node: node, Epoch: home.Epoch}, repo, op)
	switch {
	case err != nil:
		WriteError(w, r, h.logger, err)
	case published:
		WriteJSON(w, http.StatusCreated, o)
	default:
		WriteJSON(w, http.StatusOK, o)
	}
}

// internalBlob is GET /internal/v1/blobs/{digest}: a verified copy of
// digest in this datacenter, whole (200) or a single range of it (206),
// for a transfer into another datacenter or a read served there (issue
// 29). Whole reads are verified here as they stream, and the reader
// verifies again what it receives. No repository is involved: the caller
// is a node, not a user.
func (h *ociHandler) internalBlob(w http.ResponseWriter, r *http.Request) {
	d, err := blobplane.ParseDigest(chi.URLParam(r, "digest"))
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	var rng *backend.Range
	if hv := r.Header.Get("Range"); hv != "" {
		size, err := h.localSize(r.Context(), d)
		if err != nil {
			WriteError(w, r, h.logger, err)
			return
		}
		rr, err := ParseByteRange(hv, size)
		if err != nil {
			w.Header().Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
			WriteError(w, r, h.logger, err)
			return
		}
		rng = &rr
	}
	b, err := h.Reads.OpenLocal(r.Context(), d, rng)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Docker-Content-Digest", string(d))
	h.send(w, r, d, b, rng, b.From.Size)
}

// localSize is the size of d as this datacenter's verified copies record
// it. Errors: unavailable when there is none here.
func (h *ociHandler) localSize(ctx context.Context, d blobplane.Digest) (int64, error) {
	ps, err := h.Store.Placements(ctx, d)
	if err != nil {
		return 0, err
	}
	for _, p := range ps {
		if p.State == placement.Verified && p.Datacenter == h.Datacenter {
			return p.Size, nil
		}
	}
	return 0, blobplane.Errorf(blobplane.CodeUnavailable, "%s has no verified copy in datacenter %s", d, h.Datacenter)
}
