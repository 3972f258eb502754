package handlers

import (
	"context"
	"log/slog"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/read"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// The OCI distribution blob API under /v2/ (issue 6). The flow itself
// (sessions, claims, verified writes, publication at the home,
// forwarding, acceptance) is upload.Flow's; these handlers translate
// requests into its calls and its answers and refusals into responses
// (ociStatus is the one place a refusal becomes a status and an OCI
// code). See docs/uploads.md.

// UploadStore is the Postgres side of the blob API: the flow's
// upload.Store, and the reads and reference deletion the handlers serve
// themselves. store.Store implements it.
type UploadStore interface {
	upload.Store
	// Placements lists d's placements.
	Placements(ctx context.Context, d blobplane.Digest) ([]placement.Placement, error)
	// FailPlacement records a detected loss of a verified placement.
	FailPlacement(ctx context.Context, k placement.Key, reason placement.Reason, epoch int64) (placement.Placement, error)
}

var _ UploadStore = (*store.Store)(nil)

// KeeperHome resolves homes from the lease keeper: the current verified
// map names repo's partition, and the keeper holds its lease, serving and
// inside the self-fence deadline.
type KeeperHome struct {
	NodeID string
	Keeper LeaseKeeper
}

// Home implements upload.HomeResolver.
func (k KeeperHome) Home(repo string) (upload.Home, bool) {
	vm := k.Keeper.Map()
	if vm == nil {
		return upload.Home{}, false
	}
	res, err := vm.ResolveKey(repo)
	if err != nil {
		return upload.Home{}, false
	}
	ls := k.Keeper.Lease(res.Partition.ID)
	if !ls.Held || !ls.Serving {
		return upload.Home{}, false
	}
	ctx, err := k.Keeper.Admit(res.Partition.ID, ls.Epoch)
	if err != nil {
		return upload.Home{}, false
	}
	return upload.Home{Partition: res.Partition.ID, Node: k.NodeID, Epoch: ls.Epoch, Ctx: ctx}, true
}

// OCI is what the /v2/ blob API needs: the store (the flow's, and the
// handlers' own reads), the flow's settings (upload.Config: Backends,
// Backend, Datacenter and Home are required) and the cluster secret.
type OCI struct {
	Store UploadStore
	upload.Config
	// ClusterSecret admits node-to-node calls to the internal finalize
	// endpoint (mounted only with it and an Authority).
	ClusterSecret string
	// Reads serves GET's bytes (issue 29); nil: this datacenter's
	// verified copies only, verified, no repairs (tests).
	Reads *read.Reader
	// Map is the current verified map (the keeper's): the partitions a
	// position token (X-Min-Position) may name. nil: none.
	Map func() *authority.VerifiedMap
}

type ociHandler struct {
	OCI
	flow   *upload.Flow
	logger *slog.Logger
}

// newOCIHandler is the blob API's handler over o, logging to logger
// unless o names its own.
func newOCIHandler(o *OCI, logger *slog.Logger) *ociHandler {
	h := &ociHandler{OCI: *o, logger: logger}
	if o.Logger != nil {
		h.logger = o.Logger
	}
	cfg := o.Config
	cfg.Logger = h.logger
	h.flow = upload.NewFlow(o.Store, cfg)
	if h.Reads == nil {
		h.Reads = &read.Reader{Datacenter: o.Datacenter, Backends: o.Backends, Ledger: o.Store, Logger: h.logger}
	}
	return h
}

func ociRoutes(r chi.Router, d Deps) {
	h := newOCIHandler(d.OCI, d.Logger)
	fail := func(w http.ResponseWriter, r *http.Request, err error) { h.fail(w, r, err, ociUnauthorized) }
	r.Group(func(r chi.Router) {
		r.Use(Authenticate(d.Auth, fail))
		if d.SyncGuard != nil {
			// Issue 32: no write acknowledged that the primary's loss
			// could take back (syncguard.go).
			r.Use(guardWrites(d.SyncGuard, func(w http.ResponseWriter, r *http.Request, err error) { h.fail(w, r, err, ociUnavailable) }))
		}
		r.Use(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
				next.ServeHTTP(w, r)
			})
		})
		r.Use(minPosition(h.Map, h.fail)) // ZBP-5 R107, R108
		r.Get("/v2/", func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, http.StatusOK, struct{}{}) })
		r.HandleFunc("/v2/*", h.route)
		r.Get("/v1/operations/{id}", h.operation)
	})
	if d.Authority != nil && h.ClusterSecret != "" {
		internalRoutes(r, d, h)
	}
}

// route dispatches /v2/<name>/blobs/... by hand: repository names contain
// slashes, which chi patterns cannot match in the middle of a path.
func (h *ociHandler) route(w http.ResponseWriter, r *http.Request) {
	p := strings.TrimPrefix(r.URL.Path, "/v2/")
	i := strings.LastIndex(p, "/blobs/")
	if i <= 0 {
		h.fail(w, r, blobplane.Errorf(blobplane.CodeNotFound, "no route for %s %s", r.Method, r.URL.Path), ociUnsupported)
		return
	}
	name, rest := p[:i], p[i+len("/blobs/"):]
	if !auth.ValidRepository(name) {
		h.fail(w, r, blobplane.Errorf(blobplane.CodeInvalid, "repository name %q is not valid", name), ociNameInvalid)
		return
	}
	noteRequest(r.Context(), func(n *requestNote) {
		n.repository = name
		// Only a well-formed digest is logged: a client's text is not.
		for _, v := range []string{rest, r.URL.Query().Get("digest"), r.URL.Query().Get("mount")} {
			if d, err := blobplane.ParseDigest(v); err == nil {
				n.digest = string(d)
				break
			}
		}
	})
	perm := auth.Write
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		if !strings.HasPrefix(rest, "uploads/") {
			perm = auth.Read
		}
	}
	// Rights first, before any blob state is touched: a caller without
	// them gets one answer whether or not the blob exists (S8).
	if err := CheckPermission(r.Context(), name, perm); err != nil {
		h.fail(w, r, err, ociDenied)
		return
	}
	switch {
	case rest == "uploads/" || rest == "uploads":
		if r.Method != http.MethodPost {
			h.methodNotAllowed(w, r)
			return
		}
		h.startUpload(w, r, name)
	case strings.HasPrefix(rest, "uploads/"):
		id := strings.TrimPrefix(rest, "uploads/")
		switch r.Method {
		case http.MethodPatch:
			h.patchUpload(w, r, name, id)
		case http.MethodPut:
			h.putUpload(w, r, name, id)
		case http.MethodGet:
			h.uploadStatus(w, r, name, id)
		case http.MethodDelete:
			h.cancelUpload(w, r, name, id)
		default:
			h.methodNotAllowed(w, r)
		}
	default:
		d, err := blobplane.ParseDigest(rest)
		if err != nil {
			h.fail(w, r, err, ociDigestInvalid)
			return
		}
		switch r.Method {
		case http.MethodHead, http.MethodGet:
			h.getBlob(w, r, name, d)
		case http.MethodDelete:
			h.deleteBlob(w, r, name, d)
		default:
			h.methodNotAllowed(w, r)
		}
	}
}

func (h *ociHandler) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	h.writeOCI(w, r, http.StatusMethodNotAllowed, ociUnsupported, r.Method+" is not supported on "+r.URL.Path)
}
