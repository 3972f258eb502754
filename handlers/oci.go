package handlers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// The OCI distribution blob API under /v2/ (issue 6): upload sessions are
// intents (store.CreateIntent commits before the backend stages a byte),
// close verifies while promoting the staged bytes and records the
// placement, and publication is store.Finalize when this node is the
// repository's home. See docs/uploads.md.

// UploadStore is the Postgres side of uploads. store.Store implements it.
type UploadStore interface {
	// CreateIntent records a pending intent. Errors: invalid, not_found
	// (no such repository).
	CreateIntent(ctx context.Context, n upload.NewIntent) (upload.Intent, error)
	// GetIntent errors: not_found.
	GetIntent(ctx context.Context, op string) (upload.Intent, error)
	// ExtendIntent records progress per chunk. Errors: not_found, conflict
	// (upload.ErrIntentClosed).
	ExtendIntent(ctx context.Context, op, stagedLocation string, received int64, ttl time.Duration) (upload.Intent, error)
	// ClaimAndStage records the claimed digest and size on the intent and
	// stages the placement of k in one transaction, before any byte is
	// written at k; alreadyVerified: k was verified already. Errors:
	// not_found, conflict, digest_mismatch, stale_epoch. The Stage names
	// the generation the close may fail (FailStagedPlacement).
	ClaimAndStage(ctx context.Context, op string, k placement.Key, size int64) (upload.Stage, error)
	// ClaimSessionAndStage is ClaimAndStage of a pending session of
	// repository on k's backend that staged nothing, read and claimed in
	// one round trip; claimed false: nothing recorded, the session is
	// something else. Errors: those of ClaimAndStage's stage.
	ClaimSessionAndStage(ctx context.Context, op, repository string, k placement.Key, size int64) (in upload.Intent, claimed bool, st upload.Stage, err error)
	// OpenAndStage creates an intent declaring k's content (its claim)
	// and stages k, in one transaction: a single-request upload's first
	// step; staged false leaves the stage to ClaimAndStage. Errors: those
	// of CreateIntent.
	OpenAndStage(ctx context.Context, n upload.NewIntent, k placement.Key) (in upload.Intent, staged bool, err error)
	// ChainOpenAndStage and ChainClaimSessionAndStage send
	// OpenAndStage's (ClaimSessionAndStage's) statements and Finalize's
	// at once on one connection (see store.ChainedClose); nil: not
	// chained, the caller runs them one after the other.
	ChainOpenAndStage(ctx context.Context, n upload.NewIntent, k placement.Key, req upload.FinalizeRequest) *store.ChainedClose
	ChainClaimSessionAndStage(ctx context.Context, op, repository string, k placement.Key, size int64, req upload.FinalizeRequest) *store.ChainedClose
	// CreateMountIntent records a mount's intent, its possession the
	// mount from from (re-checked by Finalize at the home). Errors: those
	// of CreateIntent.
	CreateMountIntent(ctx context.Context, n upload.NewIntent, from string) (upload.Intent, error)
	// RecordPossession records that this close hashed op's bytes to d
	// (S9), with v's verification when set, so the home (forwarded or by
	// the finalize job) may publish it. Errors: not_found, conflict,
	// digest_mismatch (v's).
	RecordPossession(ctx context.Context, op string, d blobplane.Digest, size int64, v *upload.Verification) error
	// AcceptIntent takes a proven pending intent out of the reaper's
	// reach before its 202, enqueue (when set) running in the same
	// transaction. Errors: not_found, conflict.
	AcceptIntent(ctx context.Context, op string, enqueue func(ctx context.Context, tx pgx.Tx) error) error
	// AbandonIntent cancels a pending intent. Errors: not_found, conflict.
	AbandonIntent(ctx context.Context, op string) (upload.Intent, error)
	// Finalize publishes; see store.Store.Finalize for its refusals.
	Finalize(ctx context.Context, req upload.FinalizeRequest) (upload.Outcome, error)
	// OpenUsages is what the principals near a bound hold open (the
	// per-principal bounds' snapshot, principalBounds).
	OpenUsages(ctx context.Context, minSessions, minStaged int64) (map[string]upload.OpenUsage, error)
	// Outcome errors: not_found.
	Outcome(ctx context.Context, op string) (upload.Outcome, error)
	// ReferencedBlob answers existence from Postgres (or the store's existence
	// cache), never from a backend. Errors: not_found.
	ReferencedBlob(ctx context.Context, repository string, d blobplane.Digest) (int64, error)
	// DeleteReference errors: not_found.
	DeleteReference(ctx context.Context, repository string, d blobplane.Digest) error
	// Placements lists d's placements.
	Placements(ctx context.Context, d blobplane.Digest) ([]placement.Placement, error)
	// VerifyPlacement, FailPlacement: the ledger writes of an ingress
	// close after its bytes were written (see store).
	VerifyPlacement(ctx context.Context, k placement.Key, confirmed blobplane.Digest, confirmedSize, epoch int64) (placement.Placement, error)
	FailPlacement(ctx context.Context, k placement.Key, reason placement.Reason, epoch int64) (placement.Placement, error)
	// FailStagedPlacement fails only the stage a close made (its
	// generation, still pending): a close's mismatch never touches a row
	// another upload re-staged or verified (issue 26).
	FailStagedPlacement(ctx context.Context, k placement.Key, generation int64, reason placement.Reason) (bool, error)
}

var _ UploadStore = (*store.Store)(nil)

// HomeLease is this node's authority over a repository, when it has it.
type HomeLease struct {
	Partition string
	Node      string
	Epoch     uint64
	// Ctx ends when the lease is lost; publication runs under it.
	Ctx context.Context
}

// HomeResolver says whether this node is the repository's home right now.
type HomeResolver interface {
	// Home returns this node's lease over repo's partition, or ok false
	// when another node (or nobody) is the home.
	Home(repo string) (HomeLease, bool)
}

// KeeperHome resolves homes from the lease keeper: the current verified
// map names repo's partition, and the keeper holds its lease, serving and
// inside the self-fence deadline.
type KeeperHome struct {
	NodeID string
	Keeper LeaseKeeper
}

// Home implements HomeResolver.
func (k KeeperHome) Home(repo string) (HomeLease, bool) {
	vm := k.Keeper.Map()
	if vm == nil {
		return HomeLease{}, false
	}
	res, err := vm.ResolveKey(repo)
	if err != nil {
		return HomeLease{}, false
	}
	ls := k.Keeper.Lease(res.Partition.ID)
	if !ls.Held || !ls.Serving {
		return HomeLease{}, false
	}
	ctx, err := k.Keeper.Admit(res.Partition.ID, ls.Epoch)
	if err != nil {
		return HomeLease{}, false
	}
	return HomeLease{Partition: res.Partition.ID, Node: k.NodeID, Epoch: ls.Epoch, Ctx: ctx}, true
}

// OCI is what the /v2/ blob API needs. Store, Backends, Backend, Home and
// Datacenter are required.
type OCI struct {
	Store UploadStore
	// Backends are this datacenter's byte backends by name; Backend names
	// the one uploads stage into.
	Backends   map[string]backend.Backend
	Backend    string
	Datacenter string
	Home       HomeResolver
	// Replication enqueues replication work in the publishing transaction
	// (jobs.Replication); needed only when other datacenters exist.
	Replication upload.ReplicationEnqueuer
	// Targets is the replication policy (FinalizeRequest.Targets): nil
	// means every registered datacenter other than the ingress, empty none.
	Targets []string
	// MaxBlobSize bounds a blob's size (413 past it); 0 means
	// DefaultMaxBlobSize.
	MaxBlobSize int64
	// IntentTTL is how long an idle upload session lives; 0 means
	// DefaultIntentTTL.
	IntentTTL time.Duration
	// MaxOpenUploads and MaxStagedBytes bound what one principal holds
	// open: upload sessions, and bytes staged by chunked sessions (issue
	// 26: nothing a writer does exhausts the api for others); past them
	// 429 DENIED. 0 means DefaultMaxOpenUploads (DefaultMaxStagedBytes);
	// negative, no bound.
	MaxOpenUploads int64
	MaxStagedBytes int64
	// UsagePeriod is how often those bounds re-read what principals hold
	// open (principalBounds); 0 means DefaultUsagePeriod, negative at
	// every check (tests).
	UsagePeriod time.Duration
	// ClusterSecret admits node-to-node calls to the internal finalize
	// endpoint (mounted only with it and an Authority).
	ClusterSecret string
	// Forward hands finalization to the repository's home when this node
	// is not it; Later enqueues it when the home cannot be reached. Without
	// them a close away from the home leaves the intent pending (202).
	Forward HomeForwarder
	Later   FinalizeEnqueuer
	Logger  *slog.Logger
}

// Defaults of OCI.
const (
	DefaultMaxBlobSize    int64 = 10 << 30
	DefaultIntentTTL            = time.Hour
	DefaultMaxOpenUploads int64 = 1000
	DefaultMaxStagedBytes int64 = 100 << 30
	DefaultUsagePeriod          = time.Second
)

// ObjectLocation is the placement location of d's content-addressed object
// in any backend.
func ObjectLocation(d blobplane.Digest) string { return "sha256/" + d.Hex() }

// OCI error codes (distribution spec, "Error Codes").
const (
	ociBlobUnknown       = "BLOB_UNKNOWN"
	ociUploadInvalid     = "BLOB_UPLOAD_INVALID"
	ociUploadUnknown     = "BLOB_UPLOAD_UNKNOWN"
	ociDigestInvalid     = "DIGEST_INVALID"
	ociNameInvalid       = "NAME_INVALID"
	ociNameUnknown       = "NAME_UNKNOWN"
	ociSizeInvalid       = "SIZE_INVALID"
	ociUnauthorized      = "UNAUTHORIZED"
	ociDenied            = "DENIED"
	ociUnsupported       = "UNSUPPORTED"
	ociUnavailable       = "UNAVAILABLE" // not in the spec's table; clients treat 5xx as retryable
	ociRangeNotSatisfied = "BLOB_UPLOAD_INVALID"
)

// OCIErrorBody is the distribution spec's error document.
type OCIErrorBody struct {
	Errors []OCIError `json:"errors"`
}

// OCIError is one entry of OCIErrorBody.
type OCIError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Detail  any    `json:"detail,omitempty"`
}

type ociHandler struct {
	OCI
	logger *slog.Logger
	bounds *principalBounds
}

func ociRoutes(r chi.Router, d Deps) {
	o := d.OCI
	h := &ociHandler{OCI: *o, logger: d.Logger}
	if o.Logger != nil {
		h.logger = o.Logger
	}
	if h.MaxBlobSize <= 0 {
		h.MaxBlobSize = DefaultMaxBlobSize
	}
	if h.IntentTTL <= 0 {
		h.IntentTTL = DefaultIntentTTL
	}
	if h.MaxOpenUploads == 0 {
		h.MaxOpenUploads = DefaultMaxOpenUploads
	}
	if h.MaxStagedBytes == 0 {
		h.MaxStagedBytes = DefaultMaxStagedBytes
	}
	if h.UsagePeriod == 0 {
		h.UsagePeriod = DefaultUsagePeriod
	}
	h.bounds = &principalBounds{usages: h.Store.OpenUsages, maxOpen: h.MaxOpenUploads, maxStaged: h.MaxStagedBytes, period: h.UsagePeriod}
	fail := func(w http.ResponseWriter, r *http.Request, err error) { h.fail(w, r, err, ociUnauthorized) }
	r.Group(func(r chi.Router) {
		r.Use(Authenticate(d.Auth, fail))
		r.Use(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
				next.ServeHTTP(w, r)
			})
		})
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

// startUpload is POST /v2/<name>/blobs/uploads/[?digest=|?mount=&from=].
func (h *ociHandler) startUpload(w http.ResponseWriter, r *http.Request, name string) {
	ctx := r.Context()
	if m := r.URL.Query().Get("mount"); m != "" && h.mount(w, r, name, m, r.URL.Query().Get("from")) {
		return
	}
	var d blobplane.Digest
	if q := r.URL.Query().Get("digest"); q != "" {
		var err error
		if d, err = blobplane.ParseDigest(q); err != nil {
			h.fail(w, r, err, ociDigestInvalid)
			return
		}
	}
	size := upload.SizeUnknown
	if d != "" && r.ContentLength >= 0 {
		size = r.ContentLength
		if size > h.MaxBlobSize {
			h.fail(w, r, tooLarge(h.MaxBlobSize), ociSizeInvalid)
			return
		}
	}
	be, ok := h.Backends[h.Backend]
	if !ok {
		h.fail(w, r, blobplane.Errorf(blobplane.CodeInternal, "upload backend %q is not configured", h.Backend), ociUnavailable)
		return
	}
	p, _ := PrincipalOf(ctx)
	n := upload.NewIntent{
		Repository: name, Principal: p.Name, ExpectedDigest: d, ExpectedSize: size,
		IngressDatacenter: h.Datacenter, Backend: h.Backend, TTL: h.IntentTTL,
	}
	if err := h.bounds.admitSession(ctx, p.Name); err != nil {
		h.fail(w, r, err, ociDenied)
		return
	}
	if d != "" {
		// This request closes the session it opens: open only while it
		// runs (a stalled body is cut by the idle deadline).
		defer h.bounds.release(p.Name)
	}
	if d != "" && size != upload.SizeUnknown {
		// The whole blob in this request, its size known: the intent, its
		// claim and the stage are one round trip (OpenAndStage), made
		// while the body is written, and committed before the bytes
		// appear at d's key.
		k := h.objectKey(d, h.Backend)
		var chain *store.ChainedClose
		if req, ok := h.chainable(r, name, d, size, k); ok {
			chain = h.Store.ChainOpenAndStage(ctx, n, k, req)
			defer chain.Release() // publish or a failure path releases it first
		}
		h.close(w, r, be, upload.Intent{ExpectedDigest: d, ExpectedSize: size, Backend: h.Backend}, d, size, r.Body,
			func(ctx context.Context) claimResult {
				var in upload.Intent
				var staged bool
				var err error
				if chain != nil {
					in, staged, err = chain.Claim()
				} else {
					in, staged, err = h.Store.OpenAndStage(ctx, n, k)
				}
				if err != nil || staged {
					return claimResult{in: in, stage: freshStage, fallback: ociNameUnknown, err: err, chain: chain}
				}
				st, err := h.Store.ClaimAndStage(ctx, in.OperationID, k, size)
				return claimResult{in: in, stage: st, fallback: ociUploadInvalid, err: err}
			})
		return
	}
	// The intent commits before the backend stages anything (flow 1).
	in, err := h.Store.CreateIntent(ctx, n)
	if err != nil {
		h.fail(w, r, err, ociNameUnknown)
		return
	}
	// Staging starts with the first chunk (a session closed by one PUT
	// with the whole body never stages at all).
	if d == "" {
		h.sessionAnswer(w, name, in.OperationID, 0, http.StatusAccepted)
		return
	}
	h.closeWithBody(w, r, be, in, d)
}

// mount publishes digest m of repository from into name without bytes,
// through the same finalization as an upload, and reports whether it
// answered. It succeeds only when the caller can read from and from
// references m; it publishes at the home, or away from it by forwarding to
// the home. In every other case (no rights, unknown digest, the home
// unreachable, a refusal) the caller falls back to a plain upload session, so the
// answer is the same whether or not the digest exists elsewhere (S8).
func (h *ociHandler) mount(w http.ResponseWriter, r *http.Request, name, m, from string) bool {
	ctx := r.Context()
	d, err := blobplane.ParseDigest(m)
	if err != nil || !auth.ValidRepository(from) || CheckPermission(ctx, from, auth.Read) != nil {
		return false
	}
	size, err := h.Store.ReferencedBlob(ctx, from, d)
	if err != nil {
		return false
	}
	home, atHome := h.Home.Home(name)
	if !atHome && h.Forward == nil {
		return false
	}
	p, _ := PrincipalOf(ctx)
	// The intent's possession is the mount from from (S9), which the home
	// re-checks when it publishes: no bytes, no claim, only a repository
	// the principal can read that references d.
	in, err := h.Store.CreateMountIntent(ctx, upload.NewIntent{
		Repository: name, Principal: p.Name, ExpectedDigest: d, ExpectedSize: size,
		IngressDatacenter: h.Datacenter, Backend: h.Backend, TTL: h.IntentTTL,
	}, from)
	if err != nil {
		return false
	}
	if atHome {
		_, err = h.Store.Finalize(ctx, h.finalizeRequest(home, in.OperationID, d, size))
	} else {
		// Not the home: the home publishes it, or the mount falls back
		// (no finalize job: the client uploads instead).
		_, err = h.Forward.ForwardFinalize(ctx, name, in.OperationID)
	}
	if err != nil {
		if _, aerr := h.Store.AbandonIntent(context.WithoutCancel(ctx), in.OperationID); aerr != nil {
			h.logger.WarnContext(ctx, "cannot abandon a failed mount", "operation_id", in.OperationID, "err", aerr)
		}
		h.logger.InfoContext(ctx, "mount refused; falling back to an upload session", "digest", d, "from", from, "err", err)
		return false
	}
	h.published(w, name, d)
	return true
}

// patchUpload is PATCH /v2/<name>/blobs/uploads/<id>: one chunk, in order.
func (h *ociHandler) patchUpload(w http.ResponseWriter, r *http.Request, name, id string) {
	in, be, ok := h.session(w, r, name, id)
	if !ok {
		return
	}
	offset := in.ReceivedBytes
	if cr := r.Header.Get("Content-Range"); cr != "" {
		start, end, err := ParseContentRange(cr)
		if err != nil || start != in.ReceivedBytes || (r.ContentLength >= 0 && r.ContentLength != end-start+1) {
			h.rangeNotSatisfiable(w, r, name, in, fmt.Sprintf("Content-Range %q: the next chunk must start at byte %d", cr, in.ReceivedBytes))
			return
		}
	}
	n, ok := h.append(w, r, be, &in, offset)
	if !ok {
		return
	}
	h.sessionAnswer(w, name, in.OperationID, n, http.StatusAccepted)
}

// putUpload is PUT /v2/<name>/blobs/uploads/<id>?digest=: an optional last
// chunk, then close.
func (h *ociHandler) putUpload(w http.ResponseWriter, r *http.Request, name, id string) {
	d, err := blobplane.ParseDigest(r.URL.Query().Get("digest"))
	if err != nil {
		h.fail(w, r, err, ociDigestInvalid)
		return
	}
	if h.closeFreshSession(w, r, name, id, d) {
		return
	}
	in, be, ok := h.session(w, r, name, id)
	if !ok {
		return
	}
	if r.ContentLength == 0 && in.ExpectedDigest == d && in.ExpectedSize == in.ReceivedBytes && in.Possession == upload.PossessionUploaded {
		// A retried close: this session's own bytes were hashed to d and
		// recorded as its possession (S9); only publication failed, and a
		// refusal can succeed later. A claim alone (digest, size, received
		// bytes) is no possession: another tenant's verified copy of d
		// must not publish into this session (issue 26, attack 1).
		h.publish(w, r, in, d, in.ReceivedBytes, nil, nil, nil, false)
		return
	}
	if in.StagedLocation == "" && r.ContentLength == 0 && d != emptyBlob {
		// An empty close of a session that holds no bytes (and perhaps a
		// claim, which is no possession, S9): nothing to verify, nothing
		// to publish; said plainly rather than as the backend's refusal
		// of an empty staged upload id.
		h.fail(w, r, blobplane.Errorf(blobplane.CodeInvalid, "upload %s holds no bytes of %s: send them in this PUT, or PATCH them first", truncateID(id), d), ociUploadInvalid)
		return
	}
	if in.StagedLocation == "" && r.ContentLength != 0 {
		// The whole blob in this request: no staging.
		h.closeWithBody(w, r, be, in, d)
		return
	}
	if r.ContentLength != 0 {
		n, ok := h.append(w, r, be, &in, in.ReceivedBytes)
		if !ok {
			return
		}
		in.ReceivedBytes = n
	}
	h.close(w, r, be, in, d, in.ReceivedBytes, nil, h.claimStage(in, d, in.ReceivedBytes))
}

// closeFreshSession is putUpload's common close, the whole blob in this
// PUT of a session that staged nothing: the session's read and its claim
// (with the stage) are one round trip, before the body is written. It
// reports whether it answered; any other session is left untouched for
// the checked path.
func (h *ociHandler) closeFreshSession(w http.ResponseWriter, r *http.Request, name, id string, d blobplane.Digest) bool {
	size := r.ContentLength
	be, ok := h.Backends[h.Backend]
	if size <= 0 || size > h.MaxBlobSize || !ok {
		return false
	}
	k := h.objectKey(d, h.Backend)
	var chain *store.ChainedClose
	if req, ok := h.chainable(r, name, d, size, k); ok {
		// For a small body, chained with the publication. The claim is
		// the session's claim of exactly d and size, so close's content
		// check passes and publish (or a failure path) releases the
		// chain first.
		chain = h.Store.ChainClaimSessionAndStage(r.Context(), id, name, k, size, req)
		defer chain.Release()
	}
	var in upload.Intent
	var claimed bool
	var st upload.Stage
	var err error
	if chain != nil {
		in, claimed, st, err = chain.ClaimSession()
	} else {
		// As before a body is read: the claim completes even if the
		// client went away while chainable read (a cut-short body then
		// leaves the session claimed, received 0).
		in, claimed, st, err = h.Store.ClaimSessionAndStage(context.WithoutCancel(r.Context()), id, name, k, size)
	}
	if err != nil {
		h.fail(w, r, err, ociUploadInvalid)
		return true
	}
	if !claimed {
		return false
	}
	h.close(w, r, be, in, d, size, r.Body, func(context.Context) claimResult {
		return claimResult{in: in, stage: st, chain: chain}
	})
	return true
}

// closeWithBody closes a session whose whole blob is this request's body
// (a monolithic POST ?digest=, or a PUT with a body on a session that
// never staged): the bytes stream once, straight through the verifying
// write to d's content-addressed key, with no staged copy to write, sync,
// re-read and remove. A body of unknown length is staged first: the
// verifying write needs the size it must confirm.
func (h *ociHandler) closeWithBody(w http.ResponseWriter, r *http.Request, be backend.Backend, in upload.Intent, d blobplane.Digest) {
	if r.ContentLength < 0 {
		n, ok := h.append(w, r, be, &in, 0)
		if !ok {
			return
		}
		h.close(w, r, be, in, d, n, nil, h.claimStage(in, d, n))
		return
	}
	if r.ContentLength > h.MaxBlobSize {
		if _, err := h.Store.AbandonIntent(context.WithoutCancel(r.Context()), in.OperationID); err != nil {
			h.logger.WarnContext(r.Context(), "cannot abandon an oversized upload", "operation_id", in.OperationID, "err", err)
		}
		h.fail(w, r, tooLarge(h.MaxBlobSize), ociSizeInvalid)
		return
	}
	h.close(w, r, be, in, d, r.ContentLength, r.Body, h.claimStage(in, d, r.ContentLength))
}

// uploadStatus is GET /v2/<name>/blobs/uploads/<id>: where to resume.
func (h *ociHandler) uploadStatus(w http.ResponseWriter, r *http.Request, name, id string) {
	in, be, ok := h.session(w, r, name, id)
	if !ok {
		return
	}
	// The staged upload is the truth after a crash mid-chunk.
	var n int64
	if in.StagedLocation != "" {
		var err error
		if n, err = be.UploadSize(r.Context(), in.StagedLocation); err != nil {
			h.fail(w, r, err, ociUploadUnknown)
			return
		}
	}
	h.sessionAnswer(w, name, in.OperationID, n, http.StatusNoContent)
}

// cancelUpload is DELETE /v2/<name>/blobs/uploads/<id>: abandon on the row
// first, then delete the staged bytes.
func (h *ociHandler) cancelUpload(w http.ResponseWriter, r *http.Request, name, id string) {
	in, be, ok := h.session(w, r, name, id)
	if !ok {
		return
	}
	if _, err := h.Store.AbandonIntent(r.Context(), in.OperationID); err != nil {
		h.fail(w, r, err, ociUploadUnknown)
		return
	}
	if err := h.abortStaged(r.Context(), be, in); err != nil {
		h.logger.WarnContext(r.Context(), "staged bytes of a cancelled upload remain for the sweeper", "operation_id", in.OperationID, "err", err)
	}
	w.WriteHeader(http.StatusNoContent)
}

// session loads a pending upload of repository name.
func (h *ociHandler) session(w http.ResponseWriter, r *http.Request, name, id string) (upload.Intent, backend.Backend, bool) {
	in, err := h.Store.GetIntent(r.Context(), id)
	if err != nil || in.Repository != name || in.State != upload.IntentPending {
		if err == nil {
			err = blobplane.Errorf(blobplane.CodeNotFound, "upload %s is unknown to %s", truncateID(id), name)
		}
		h.fail(w, r, err, ociUploadUnknown)
		return upload.Intent{}, nil, false
	}
	be, ok := h.Backends[in.Backend]
	if !ok {
		h.fail(w, r, blobplane.Errorf(blobplane.CodeNotFound, "upload %s was staged on a backend this node does not have", id), ociUploadUnknown)
		return upload.Intent{}, nil, false
	}
	return in, be, true
}

// append streams the request body into the staged upload at offset and
// records the new size on the intent (moving its expiry). It answers the
// client itself when it fails.
func (h *ociHandler) append(w http.ResponseWriter, r *http.Request, be backend.Backend, in *upload.Intent, offset int64) (int64, bool) {
	ctx := r.Context()
	if in.StagedLocation == "" {
		// The first chunk starts staging. The intent names the staged
		// upload before any byte lands in it, so the reaper can always
		// find staged bytes through their intent.
		id, err := be.CreateUpload(ctx)
		if err != nil {
			h.fail(w, r, err, ociUnavailable)
			return 0, false
		}
		if _, err := h.Store.ExtendIntent(ctx, in.OperationID, id, offset, h.IntentTTL); err != nil {
			_ = be.AbortUpload(context.WithoutCancel(ctx), id)
			h.fail(w, r, err, ociUploadUnknown)
			return 0, false
		}
		in.StagedLocation = id
	}
	left := h.MaxBlobSize - offset
	staging, err := h.bounds.stagingAllowance(ctx, in.Principal)
	if err != nil {
		h.fail(w, r, err, ociUnavailable)
		return 0, false
	}
	if staging >= 0 && (r.ContentLength > staging || staging == 0) {
		// Refused before a byte is written: the session stays as it was,
		// and the client may send the chunk once other sessions closed.
		h.fail(w, r, stagingFull(in.Principal, h.MaxStagedBytes), ociDenied)
		return 0, false
	}
	if staging >= 0 && staging < left {
		left = staging
	}
	cb := &clientBody{r: r.Body}
	limit := &limitReader{r: cb, left: left}
	n, err := be.AppendUpload(ctx, in.StagedLocation, offset, limit)
	if !limit.exceeded {
		err = cb.blame(err)
	}
	if limit.exceeded && left < h.MaxBlobSize-offset {
		// A body of unknown length ran past the principal's staging
		// bound: the session cannot keep what it wrote.
		if _, aerr := h.Store.AbandonIntent(context.WithoutCancel(ctx), in.OperationID); aerr == nil {
			_ = h.abortStaged(context.WithoutCancel(ctx), be, *in)
		}
		h.fail(w, r, stagingFull(in.Principal, h.MaxStagedBytes), ociDenied)
		return 0, false
	}
	if limit.exceeded {
		// Past the maximum: the session cannot succeed any more.
		if _, aerr := h.Store.AbandonIntent(context.WithoutCancel(ctx), in.OperationID); aerr == nil {
			_ = h.abortStaged(context.WithoutCancel(ctx), be, *in)
		}
		h.fail(w, r, tooLarge(h.MaxBlobSize), ociSizeInvalid)
		return 0, false
	}
	if errors.Is(err, backend.ErrRangeInvalid) {
		cur, serr := be.UploadSize(ctx, in.StagedLocation)
		if serr == nil {
			in.ReceivedBytes = cur
		}
		h.rangeNotSatisfiable(w, r, in.Repository, *in, blobplane.ErrorMessage(err))
		return 0, false
	}
	if err != nil {
		h.fail(w, r, err, ociUploadInvalid)
		return 0, false
	}
	h.bounds.staged(in.Principal, n-offset)
	if _, err := h.Store.ExtendIntent(ctx, in.OperationID, "", n, h.IntentTTL); err != nil {
		h.fail(w, r, err, ociUploadUnknown)
		return 0, false
	}
	return n, true
}

// abortStaged deletes in's staged upload, if staging ever started.
func (h *ociHandler) abortStaged(ctx context.Context, be backend.Backend, in upload.Intent) error {
	if in.StagedLocation == "" {
		return nil
	}
	return be.AbortUpload(ctx, in.StagedLocation)
}

// close verifies the blob's size bytes while storing them as d's
// content-addressed object — promoted from the staged upload when body is
// nil, else streamed from body — records the placement, and publishes.
func (h *ociHandler) close(w http.ResponseWriter, r *http.Request, be backend.Backend, in upload.Intent, d blobplane.Digest, size int64, body io.Reader, claim claimFunc) {
	ctx := r.Context()
	if in.ExpectedDigest != "" && (in.ExpectedDigest != d || (in.ExpectedSize != upload.SizeUnknown && in.ExpectedSize != size)) {
		h.rejectContent(w, r, be, in, d, blobplane.Errorf(blobplane.CodeMismatch, "the upload declared %s, closed as %s with %d bytes", in.ExpectedDigest, d, size))
		return
	}
	// The intent claims d before any byte lands at d's key, and keeps the
	// claim until it is admitted or abandoned: no collection of d can be
	// decided between the promotion below and the publication (S6), and an
	// abandonment hands verified bytes back to the collector (L1). The
	// claim (with the placement's stage) runs while a body is written to
	// its private temp file; the backend waits for its commit before the
	// bytes appear at the key (WriteRequest.BeforeVisible). A staged
	// upload is claimed first, then promoted.
	k := h.objectKey(d, in.Backend)
	var claimed claimResult
	var deferredSync func() error
	var info backend.Info
	var err error
	if body == nil {
		claimed = claim(ctx)
		if claimed.err != nil {
			h.fail(w, r, claimed.err, claimed.fallback)
			return
		}
		in = claimed.in
		info, err = be.PromoteUpload(ctx, in.StagedLocation, backend.WriteRequest{Digest: d, Size: size})
	} else {
		cb := &clientBody{r: body}
		// The claim completes even if the client goes away mid-body: the
		// session is left as a claim made before the write would leave it.
		result := make(chan claimResult, 1)
		go func() { result <- claim(context.WithoutCancel(ctx)) }()
		wait := sync.OnceValue(func() claimResult { return <-result })
		// Both writes hash while they stream: the bytes must prove the
		// digest even when a verified copy exists (S8). An existing
		// object is the same content under the same key: one stored copy.
		info, err = be.Write(ctx, backend.WriteRequest{Digest: d, Size: size, Body: cb,
			BeforeVisible: func() error { return wait().err },
			DeferSync:     func(sync func() error) { deferredSync = sync }})
		err = cb.blame(err)
		// The claim's outcome comes first, whatever the write's: a refused
		// claim is the answer, as if it had run before the write.
		if claimed = wait(); claimed.err != nil {
			h.fail(w, r, claimed.err, claimed.fallback)
			return
		}
		in = claimed.in
	}
	if err != nil {
		claimed.chain.Release() // its statements hold the intent's and the placement's rows
	}
	if errors.Is(err, backend.ErrMismatch) {
		if !claimed.stage.AlreadyVerified {
			// Only the stage this close made (issue 26, attack 2): the row
			// may since hold another upload's stage or verified copy.
			if _, ferr := h.Store.FailStagedPlacement(context.WithoutCancel(ctx), k, claimed.stage.Generation, placement.DigestMismatch); ferr != nil {
				h.logger.WarnContext(ctx, "cannot record digest mismatch", "operation_id", in.OperationID, "err", ferr)
			}
		}
		h.rejectContent(w, r, be, in, d, err)
		return
	}
	if err != nil && body != nil {
		// Nothing was stored (a body cut short, the backend down): the
		// session resumes from byte 0, still claiming d.
		if _, rerr := h.Store.ExtendIntent(context.WithoutCancel(ctx), in.OperationID, "", 0, h.IntentTTL); rerr != nil {
			h.logger.WarnContext(ctx, "cannot reset the received size of a failed upload", "operation_id", in.OperationID, "err", rerr)
		}
	}
	if err != nil {
		h.fail(w, r, err, ociUploadInvalid)
		return
	}
	var verify *upload.Verification
	if !claimed.stage.AlreadyVerified {
		verify = &upload.Verification{Key: k, Digest: info.Digest, Size: info.Repr.ContentSize, Hashed: true}
	}
	// The write's last syncs (the object file's and its directory's) run
	// while publication's first round trip does; nothing commits before
	// they returned (FinalizeRequest.BeforeCommit).
	var durable func() error
	if deferredSync != nil {
		synced := make(chan error, 1)
		go func() { synced <- deferredSync() }()
		durable = sync.OnceValue(func() error { return <-synced })
	}
	// The write hashed this close's own bytes to d: possession (S9).
	h.publish(w, r, in, d, size, verify, durable, claimed.chain, true)
}

// chainBodyMax bounds the body an upload's close reads whole before its
// claim, to chain its close (chainable).
const chainBodyMax = 64 << 10

// chainable prepares the chained close (store.ChainedClose: the claim and
// the publication's statements sent at once, docs/performance.md item
// 31) of r, which carries the whole content of d, size bytes, for repo:
// when this node is repo's home and the body is small, it reads the body
// whole first (a small body arrives with its headers) and reports whether
// it hashes to d, with the publication the chain sends. Only then does
// nothing but the link stand between the claim and the publication. A
// body that does not hash to d is left to the unchained close, which
// answers for it: r.Body is replaced by the bytes read and whatever
// follows them.
func (h *ociHandler) chainable(r *http.Request, repo string, d blobplane.Digest, size int64, k placement.Key) (upload.FinalizeRequest, bool) {
	home, ok := h.Home.Home(repo)
	if !ok || size > chainBodyMax || size != r.ContentLength {
		return upload.FinalizeRequest{}, false
	}
	buf := make([]byte, size)
	got, err := io.ReadFull(r.Body, buf)
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(buf[:got]), r.Body), r.Body}
	if err != nil {
		return upload.FinalizeRequest{}, false
	}
	if sum := sha256.Sum256(buf); hex.EncodeToString(sum[:]) != d.Hex() {
		return upload.FinalizeRequest{}, false
	}
	req := h.finalizeRequest(home, "", d, size) // the chain names the operation
	req.Verify = &upload.Verification{Key: k, Digest: d, Size: size, Hashed: true}
	req.Proven = true // the body was hashed above
	return req, true
}

// finalizeRequest is the publication of operation op's content d, size
// bytes, fenced by home, with this handler's replication policy.
func (h *ociHandler) finalizeRequest(home HomeLease, op string, d blobplane.Digest, size int64) upload.FinalizeRequest {
	return upload.FinalizeRequest{OperationID: op, Digest: d, Size: size,
		Partition: home.Partition, Node: home.Node, Epoch: home.Epoch,
		Targets: h.Targets, Replication: h.Replication}
}

// emptyBlob is the digest of zero bytes, the one blob an empty close may
// carry.
const emptyBlob blobplane.Digest = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// freshStage is the stage of a key that had no row (OpenAndStage staged
// it): a new pending row's generation.
var freshStage = upload.Stage{Generation: 1}

// claimFunc records what must precede d's bytes at its key (the intent's
// claim and the placement's stage, S6).
type claimFunc func(ctx context.Context) claimResult

// claimResult is a claimFunc's answer: the intent, whether the placement
// is verified already, and the OCI code its error falls back to.
type claimResult struct {
	in       upload.Intent
	stage    upload.Stage
	fallback string
	err      error
	// chain, when set, holds the close's publication (store.ChainedClose,
	// chainable): publish finalizes through it, and any other path
	// releases it before anything else touches the intent.
	chain *store.ChainedClose
}

// claimStage is the claim of a close on the existing session in.
func (h *ociHandler) claimStage(in upload.Intent, d blobplane.Digest, size int64) claimFunc {
	return func(ctx context.Context) claimResult {
		st, err := h.Store.ClaimAndStage(ctx, in.OperationID, h.objectKey(d, in.Backend), size)
		return claimResult{in: in, stage: st, fallback: ociUploadInvalid, err: err}
	}
}

// objectKey is the placement d's bytes take on backend in this ingress's
// datacenter.
func (h *ociHandler) objectKey(d blobplane.Digest, backend string) placement.Key {
	return placement.Key{Digest: d, Backend: backend, Datacenter: h.Datacenter, Location: ObjectLocation(d)}
}

// publish finalizes verified content at the home; elsewhere it forwards
// to the home, and when the home cannot publish now it enqueues a finalize
// job and answers 202 with the operation. verify, when set, is the
// placement's verification still to record: at the home Finalize records
// it in its own transaction (one synchronous commit for the close),
// elsewhere it is recorded first. durable, when set, waits for the bytes'
// last sync: at the home Finalize calls it before its commit, elsewhere
// it is waited for first. chain, when set, is the close's chained
// publication (chainable), which Finalize goes through at the home.
// proven: this request hashed the intent's bytes to d (S9); elsewhere it
// is recorded with the verification before the home is asked.
func (h *ociHandler) publish(w http.ResponseWriter, r *http.Request, in upload.Intent, d blobplane.Digest, size int64, verify *upload.Verification, durable func() error, chain *store.ChainedClose, proven bool) {
	ctx := r.Context()
	defer chain.Release()
	home, ok := h.Home.Home(in.Repository)
	if !ok {
		chain.Release()
		if durable != nil {
			if err := durable(); err != nil {
				h.fail(w, r, err, ociUploadInvalid)
				return
			}
		}
		// A verification comes only with a close that hashed the bytes
		// (proven); both are recorded before the home is asked.
		if proven {
			if err := h.Store.RecordPossession(ctx, in.OperationID, d, size, verify); err != nil {
				h.fail(w, r, err, ociUploadInvalid)
				return
			}
		}
		h.publishAway(w, r, in, d)
		return
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if home.Ctx != nil {
		defer context.AfterFunc(home.Ctx, cancel)()
	}
	finalize := h.Store.Finalize
	if chain != nil {
		finalize = chain.Finalize
	}
	req := h.finalizeRequest(home, in.OperationID, d, size)
	req.Verify, req.BeforeCommit, req.Proven = verify, durable, proven
	if _, err := finalize(fctx, req); err != nil {
		h.fail(w, r, err, ociUploadInvalid)
		return
	}
	h.published(w, in.Repository, d)
}

// published answers a publication: 201 with the blob's location.
func (h *ociHandler) published(w http.ResponseWriter, repo string, d blobplane.Digest) {
	w.Header().Set("Location", "/v2/"+repo+"/blobs/"+string(d))
	w.Header().Set("Docker-Content-Digest", string(d))
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusCreated)
}

// publishAway is publication at an ingress that is not the home: forward
// to the home (201 as if local when it publishes; its final refusal as
// the local answer would be), else enqueue the finalize job and answer 202
// with the operation. The intent stays pending with its verified content
// until the home publishes it.
func (h *ociHandler) publishAway(w http.ResponseWriter, r *http.Request, in upload.Intent, d blobplane.Digest) {
	ctx := r.Context()
	if h.Forward != nil {
		_, err := h.Forward.ForwardFinalize(ctx, in.Repository, in.OperationID)
		if err == nil {
			h.published(w, in.Repository, d)
			return
		}
		if forwardedRefusalIsFinal(err) {
			h.fail(w, r, err, ociUploadInvalid)
			return
		}
		h.logger.WarnContext(ctx, "the home cannot publish now; finalization is queued", "operation_id", in.OperationID, "repository", in.Repository, "err", err)
	}
	// Acknowledged means kept (issue 27): before the 202 the intent is
	// accepted, out of the reaper's reach, with its finalize job inserted
	// in the same transaction.
	var enqueue func(context.Context, pgx.Tx) error
	if h.Later != nil {
		enqueue = func(ctx context.Context, tx pgx.Tx) error {
			return h.Later.EnqueueFinalizeTx(ctx, tx, in.Repository, in.OperationID)
		}
	}
	if err := h.Store.AcceptIntent(context.WithoutCancel(ctx), in.OperationID, enqueue); err != nil {
		h.fail(w, r, err, ociUnavailable)
		return
	}
	w.Header().Set("Location", "/v1/operations/"+in.OperationID)
	w.Header().Set("Docker-Upload-UUID", in.OperationID)
	w.Header().Set("Docker-Content-Digest", string(d))
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusAccepted)
}

// forwardedRefusalIsFinal reports whether the home's refusal is the answer
// the client gets, as it would from a local publication: other content
// than admitted, a closed intent or an obliterated digest, a revoked
// grant (the client may retry the close once it is restored). Anything
// else (unreachable, no authority, moved, no placement yet, a
// misconfigured secret) is work for the finalize job.
func forwardedRefusalIsFinal(err error) bool {
	switch blobplane.ErrorCode(err) {
	case blobplane.CodeMismatch, blobplane.CodeConflict, blobplane.CodeForbidden, blobplane.CodeNotFound, blobplane.CodeInvalid:
		return true
	}
	return false
}

// rejectContent ends an upload whose bytes are not the claimed content:
// abandoned on the row, staged bytes removed, DIGEST_INVALID.
func (h *ociHandler) rejectContent(w http.ResponseWriter, r *http.Request, be backend.Backend, in upload.Intent, d blobplane.Digest, cause error) {
	ctx := context.WithoutCancel(r.Context())
	if _, err := h.Store.AbandonIntent(ctx, in.OperationID); err == nil {
		if err := h.abortStaged(ctx, be, in); err != nil {
			h.logger.WarnContext(ctx, "staged bytes of a rejected upload remain for the sweeper", "operation_id", in.OperationID, "err", err)
		}
	}
	h.writeOCI(w, r, http.StatusBadRequest, ociDigestInvalid, blobplane.ErrorMessage(cause))
}

// getBlob is HEAD and GET /v2/<name>/blobs/<digest>. Existence comes from
// Postgres (through the existence cache); HEAD makes no backend request.
func (h *ociHandler) getBlob(w http.ResponseWriter, r *http.Request, name string, d blobplane.Digest) {
	ctx := r.Context()
	size, err := h.Store.ReferencedBlob(ctx, name, d)
	if err != nil {
		h.fail(w, r, err, ociBlobUnknown)
		return
	}
	w.Header().Set("Docker-Content-Digest", string(d))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Accept-Ranges", "bytes")
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		w.WriteHeader(http.StatusOK)
		return
	}
	var rng *backend.Range
	if hv := r.Header.Get("Range"); hv != "" {
		rr, err := ParseByteRange(hv, size)
		if err != nil {
			w.Header().Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
			h.fail(w, r, err, ociBlobUnknown)
			return
		}
		rng = &rr
	}
	ps, err := h.Store.Placements(ctx, d)
	if err != nil {
		h.fail(w, r, err, ociUnavailable)
		return
	}
	var obj *backend.Object
	for _, p := range ps {
		be, ok := h.Backends[p.Backend]
		if p.State != placement.Verified || p.Datacenter != h.Datacenter || !ok {
			continue
		}
		obj, err = be.Read(ctx, d, backend.ReadOptions{Range: rng})
		if err == nil {
			break
		}
		if !errors.Is(err, backend.ErrNotFound) {
			h.fail(w, r, err, ociUnavailable)
			return
		}
		// A reference plus a backend not-found is a detected loss.
		h.logger.ErrorContext(ctx, "verified placement lost its bytes", "digest", d, "backend", p.Backend)
		if _, ferr := h.Store.FailPlacement(context.WithoutCancel(ctx), p.Key, placement.SourceUnavailable, p.Epoch); ferr != nil {
			h.logger.WarnContext(ctx, "cannot record a lost placement", "digest", d, "err", ferr)
		}
	}
	if obj == nil {
		h.fail(w, r, blobplane.Errorf(blobplane.CodeUnavailable, "%s has no verified placement in datacenter %s; remote read-through is not available yet", d, h.Datacenter), ociUnavailable)
		return
	}
	defer obj.Body.Close()
	w.Header().Set("Content-Length", strconv.FormatInt(obj.Length, 10))
	status := http.StatusOK
	if rng != nil {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", rng.Offset, rng.Offset+rng.Length-1, size))
		status = http.StatusPartialContent
	}
	w.WriteHeader(status)
	// read(2)/write(2) through a pooled 256 KiB buffer. Hiding the
	// writer's ReadFrom (struct{io.Writer}) keeps net/http from handing an
	// identity file to sendfile(2), which measured slower here, for 1 GiB
	// and for 4 KiB (docs/performance.md).
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	if _, err := io.CopyBuffer(struct{ io.Writer }{w}, obj.Body, *bp); err != nil && !errors.Is(err, context.Canceled) {
		h.logger.WarnContext(ctx, "blob body failed mid-stream", "digest", d, "err", err)
	}
}

// copyBufs are getBlob's body buffers: large enough that a 1 GiB read is
// 4096 read/write pairs, reused so a 4 KiB read allocates none.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// deleteBlob is DELETE /v2/<name>/blobs/<digest>: the reference only.
func (h *ociHandler) deleteBlob(w http.ResponseWriter, r *http.Request, name string, d blobplane.Digest) {
	if err := h.Store.DeleteReference(r.Context(), name, d); err != nil {
		h.fail(w, r, err, ociBlobUnknown)
		return
	}
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusAccepted)
}

// operation is GET /v1/operations/<id>: the outcome of a publication, or
// the pending intent.
func (h *ociHandler) operation(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	in, err := h.Store.GetIntent(r.Context(), id)
	if err == nil {
		err = CheckPermission(r.Context(), in.Repository, auth.Read)
	}
	if err != nil {
		switch blobplane.ErrorCode(err) {
		case blobplane.CodeNotFound, blobplane.CodeForbidden, blobplane.CodeInvalid:
			// Absent, malformed and not yours: one answer, which neither
			// echoes the id nor confirms it exists (issue 26 point 3).
			err = blobplane.Errorf(blobplane.CodeNotFound, "unknown operation")
		}
		WriteAuthError(w, r, h.logger, err)
		return
	}
	if in.State == upload.IntentAdmitted {
		o, err := h.Store.Outcome(r.Context(), in.OperationID)
		if err != nil {
			WriteError(w, r, h.logger, err)
			return
		}
		WriteJSON(w, http.StatusOK, map[string]any{"state": in.State, "outcome": o})
		return
	}
	answer := map[string]any{"state": in.State, "repository": in.Repository, "digest": in.ExpectedDigest}
	if !in.AcceptedAt.IsZero() {
		// Answered 202: kept, awaiting publication by the home (issue 27).
		answer["accepted_at"] = in.AcceptedAt
	}
	WriteJSON(w, http.StatusOK, answer)
}

// sessionAnswer writes the headers of an open upload session.
func (h *ociHandler) sessionAnswer(w http.ResponseWriter, name, id string, size int64, status int) {
	w.Header().Set("Location", "/v2/"+name+"/blobs/uploads/"+id)
	w.Header().Set("Docker-Upload-UUID", id)
	w.Header().Set("Range", uploadRange(size))
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(status)
}

func (h *ociHandler) rangeNotSatisfiable(w http.ResponseWriter, r *http.Request, name string, in upload.Intent, msg string) {
	w.Header().Set("Location", "/v2/"+name+"/blobs/uploads/"+in.OperationID)
	w.Header().Set("Docker-Upload-UUID", in.OperationID)
	w.Header().Set("Range", uploadRange(in.ReceivedBytes))
	h.writeOCI(w, r, http.StatusRequestedRangeNotSatisfiable, ociRangeNotSatisfied, msg)
}

// uploadRange is the Range header of a session holding size bytes
// ("0-0" for none, as distribution answers).
func uploadRange(size int64) string {
	if size == 0 {
		return "0-0"
	}
	return "0-" + strconv.FormatInt(size-1, 10)
}

// fail answers err in the OCI format. The status comes from StatusOf; the
// OCI code from the error's kind, with fallback for the endpoint's own
// not-found or invalid answer.
func (h *ociHandler) fail(w http.ResponseWriter, r *http.Request, err error, fallback string) {
	code := blobplane.ErrorCode(err)
	status := StatusOf(code)
	oci := fallback
	switch code {
	case blobplane.CodeUnauthorized:
		oci = ociUnauthorized
		Challenge(w)
	case blobplane.CodeForbidden:
		oci = ociDenied
	case blobplane.CodeTooLarge:
		oci = ociSizeInvalid
	case blobplane.CodeMismatch:
		oci = ociDigestInvalid
	case blobplane.CodeUnavailable, blobplane.CodeInternal:
		oci = ociUnavailable
		w.Header().Set("Retry-After", "1")
	case blobplane.CodeStaleEpoch:
		status, oci = http.StatusServiceUnavailable, ociUnavailable // the home moved: retry
		w.Header().Set("Retry-After", "1")
	case blobplane.CodeTooManyRequests:
		// A per-principal bound (open sessions, staged bytes) or the
		// authentication failure limit: DENIED is the spec's code for a
		// refused operation; the status and Retry-After say "later".
		oci = ociDenied
		if w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", "1")
		}
	}
	if status >= 500 && !errors.Is(err, context.Canceled) {
		h.logger.ErrorContext(r.Context(), "oci request failed", "err", err, "path", r.URL.Path)
	} else if db, ok := databaseDetail(err); ok {
		// What Postgres said is logged, never answered (issue 26 point 10).
		h.logger.WarnContext(r.Context(), "oci request refused by the database", "err", err, "path", r.URL.Path, db)
	}
	h.writeOCI(w, r, status, oci, clientMessage(err))
}

func (h *ociHandler) writeOCI(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	if r.Method == http.MethodHead {
		w.WriteHeader(status)
		return
	}
	WriteJSON(w, status, OCIErrorBody{Errors: []OCIError{{Code: code, Message: msg}}})
}

func tooLarge(max int64) error {
	return blobplane.Errorf(blobplane.CodeTooLarge, "blob exceeds the maximum size of %d bytes", max)
}

func truncateID(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// clientBody is a request body that remembers whether reading it failed:
// the client cut it short of its Content-Length, stalled past the idle
// deadline or went away. That is the client's fault, answered 400
// BLOB_UPLOAD_INVALID, not a backend's 503 (found by FuzzOCIHandlers).
type clientBody struct {
	r   io.Reader
	err error
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}

// blame is err, a write's error, as the client's when reading the body
// failed first.
func (b *clientBody) blame(err error) error {
	if err == nil || b.err == nil || errors.Is(err, backend.ErrMismatch) {
		return err
	}
	return blobplane.Wrap(blobplane.CodeInvalid, b.err, "the request body could not be read whole (%v); send the blob again", b.err)
}

// limitReader fails once more than left bytes were asked of it.
type limitReader struct {
	r        io.Reader
	left     int64
	exceeded bool
}

var errTooLarge = errors.New("request body exceeds the maximum blob size")

func (l *limitReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// One byte more tells a body at the limit from one past it.
		var one [1]byte
		n, err := l.r.Read(one[:])
		if n > 0 {
			l.exceeded = true
			return 0, errTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// ParseContentRange parses an OCI chunk's Content-Range, "<start>-<end>"
// (inclusive; a "bytes " prefix is tolerated).
func ParseContentRange(s string) (start, end int64, err error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "bytes ")
	a, b, ok := strings.Cut(s, "-")
	bad := blobplane.Errorf(blobplane.CodeRangeInvalid, "Content-Range %q: want <start>-<end>", truncateID(s))
	if !ok || a == "" || b == "" || strings.ContainsAny(a+b, "+- ") {
		return 0, 0, bad
	}
	start, err1 := strconv.ParseInt(a, 10, 64)
	end, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || start < 0 || end < start {
		return 0, 0, bad
	}
	return start, end, nil
}

// digitsOnly reports whether s holds nothing but ASCII digits ("" too).
func digitsOnly(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ParseByteRange parses a single-range "Range: bytes=a-b" (or "a-" or
// "-n") against a blob of size bytes.
func ParseByteRange(s string, size int64) (backend.Range, error) {
	bad := blobplane.Errorf(blobplane.CodeRangeInvalid, "Range %q is not a satisfiable single byte range of a %d-byte blob", truncateID(s), size)
	spec, ok := strings.CutPrefix(s, "bytes=")
	if !ok || strings.Contains(spec, ",") {
		return backend.Range{}, bad
	}
	a, b, ok := strings.Cut(spec, "-")
	if !ok || !digitsOnly(a) || !digitsOnly(b) {
		// RFC 9110 §14.1.2: digits only (strconv.ParseInt would take a
		// sign; found by FuzzParseByteRange).
		return backend.Range{}, bad
	}
	var start, end int64
	var err error
	switch {
	case a == "" && b != "": // suffix
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n <= 0 {
			return backend.Range{}, bad
		}
		start, end = max(size-n, 0), size-1
	case a != "":
		if start, err = strconv.ParseInt(a, 10, 64); err != nil || start < 0 {
			return backend.Range{}, bad
		}
		end = size - 1
		if b != "" {
			if end, err = strconv.ParseInt(b, 10, 64); err != nil || end < start {
				return backend.Range{}, bad
			}
			end = min(end, size-1)
		}
	default:
		return backend.Range{}, bad
	}
	if start >= size || end < start {
		return backend.Range{}, bad
	}
	return backend.Range{Offset: start, Length: end - start + 1}, nil
}
