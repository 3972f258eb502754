package handlers

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/store"
)

// Node-to-node endpoints (docs/uploads.md). They accept only the cluster
// secret, never a user token, and run at the repository's home through the
// routing contract.

// HomeForwarder hands the finalization of a closed upload to its
// repository's home (jobs.HomeFinalizer: the routing client and the
// internal endpoint).
type HomeForwarder interface {
	// ForwardFinalize returns the outcome the home stored, or a
	// *blobplane.Error: the home's refusal with its code, or unavailable
	// when the home could not be reached.
	ForwardFinalize(ctx context.Context, repo, op string) (store.Outcome, error)
}

// FinalizeEnqueuer durably schedules a finalization for later
// (jobs.FinalizeQueue: a River job unique by operation id).
type FinalizeEnqueuer interface {
	EnqueueFinalize(ctx context.Context, repo, op string) error
}

// internalFinalizeCall is the body of POST /internal/v1/finalize/{id}
// (jobs.FinalizeCall).
type internalFinalizeCall struct {
	Repository string `json:"repository"`
}

type finalizeCallKey struct{}

// RequireClusterSecret is middleware that admits only
// "Authorization: Bearer <secret>", compared in constant time; anything
// else (no header, Basic, a user token, an empty configured secret) is 401.
func RequireClusterSecret(secret string, logger *slog.Logger) func(http.Handler) http.Handler {
	want := []byte(secret)
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			if len(want) == 0 || !strings.EqualFold(scheme, "Bearer") ||
				subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), want) != 1 {
				WriteError(w, r, logger, blobplane.Errorf(blobplane.CodeUnauthorized, "node-to-node endpoint: the cluster secret is required"))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// internalRoutes mounts POST /internal/v1/finalize/{operation_id}: cluster
// secret first, then the body (it names the repository, the routing key),
// then the routing contract, then Finalize under the admitted partition and
// epoch.
func internalRoutes(r chi.Router, d Deps, h *ociHandler) {
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
	r.With(RequireClusterSecret(h.ClusterSecret, h.logger), decode, a.RequireHome(key)).
		Post("/internal/v1/finalize/{operation_id}", func(w http.ResponseWriter, r *http.Request) {
			h.finalizeAtHome(w, r, a.NodeID, key(r), chi.URLParam(r, "operation_id"))
		})
}

// finalizeAtHome publishes operation op of repo with this node's authority:
// 201 and the outcome when it publishes now, 200 and the stored outcome
// when it had already published, or the refusal with its code (no outcome
// stored).
func (h *ociHandler) finalizeAtHome(w http.ResponseWriter, r *http.Request, node, repo, op string) {
	ctx := r.Context()
	home, ok := HomeOf(ctx)
	if !ok {
		WriteError(w, r, h.logger, blobplane.Errorf(blobplane.CodeInternal, "finalize without an admitted home"))
		return
	}
	in, err := h.Store.GetIntent(ctx, op)
	if err == nil && in.Repository != repo {
		// The routing key must be the intent's repository, or the fence
		// would check the wrong partition.
		err = blobplane.Errorf(blobplane.CodeNotFound, "operation %s is not an upload to %s", truncateID(op), repo)
	}
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	if in.State == store.IntentAdmitted {
		o, err := h.Store.Outcome(ctx, op)
		if err != nil {
			WriteError(w, r, h.logger, err)
			return
		}
		WriteJSON(w, http.StatusOK, o)
		return
	}
	if in.State == store.IntentPending && (in.ExpectedDigest == "" || in.ExpectedSize == store.SizeUnknown) {
		WriteError(w, r, h.logger, blobplane.Errorf(blobplane.CodeUnavailable, "upload %s has not closed yet", op))
		return
	}
	o, err := h.Store.Finalize(ctx, store.FinalizeRequest{
		OperationID: op, Digest: in.ExpectedDigest, Size: in.ExpectedSize,
		Partition: home.Partition, Node: node, Epoch: home.Epoch,
		Targets: h.Targets, Replication: h.Replication,
	})
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	WriteJSON(w, http.StatusCreated, o)
}
