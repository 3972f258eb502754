package handlers

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/internal/nodeauth"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
)

// PlacementRouter answers the routing query (spec blob-placement.md,
// "Routing categories"). store.Store implements it.
type PlacementRouter interface {
	// PlacementRoutingFor returns d's placements split into routing
	// categories for a reader in datacenter, as a caller reading scope may
	// see them. A digest no repository in scope references (unless
	// scope.All), a digest without placements and a ledger not created yet
	// are all the same Routing with Known false, not an error (issue 26
	// point 3: naming a digest proves nothing). Errors: invalid for a
	// non-canonical digest or a bad datacenter label, unavailable when the
	// database cannot answer.
	PlacementRoutingFor(ctx context.Context, d blobplane.Digest, datacenter string, scope store.ReadScope) (placement.Routing, error)
}

// PlacementsBody is the JSON answer of GET /v1/blobs/{digest}/placements.
// Every list is present (possibly empty).
type PlacementsBody struct {
	Digest         string          `json:"digest"`
	Datacenter     string          `json:"datacenter"`
	Known          bool            `json:"known"`     // the ledger has any placement of the digest
	Serveable      bool            `json:"serveable"` // some placement is verified (S2: only verified serves)
	Local          []PlacementJSON `json:"local"`
	VerifiedRemote []PlacementJSON `json:"verified_remote"`
	Pending        []PlacementJSON `json:"pending"`
	Failed         []PlacementJSON `json:"failed"`
	Revoked        []PlacementJSON `json:"revoked"`
}

// PlacementJSON is one placement in a PlacementsBody.
type PlacementJSON struct {
	Backend      string    `json:"backend"`
	Datacenter   string    `json:"datacenter"`
	Location     string    `json:"location"`
	State        string    `json:"state"`
	Reason       string    `json:"reason,omitempty"`        // failure reason, with state failed
	RevokeReason string    `json:"revoke_reason,omitempty"` // with state revoked
	Size         int64     `json:"size"`
	Epoch        int64     `json:"epoch"`
	Generation   int64     `json:"generation"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// placementsRoutes mounts the routing query. datacenter is this node's own
// label, the default when the query names none.
//
// The answer says where a digest's bytes are and how large they are, so it
// is no public oracle (issue 26 point 3): the caller is a node presenting
// the cluster credential, or a principal (Authenticate), who sees a digest
// only through a repository it can read that references it, or everything
// with admin on every repository. Everyone else, for any digest, gets the
// answer of a digest without placements; an anonymous or wrongly
// credentialed caller gets 401 whatever it names. Without an
// authenticator the route is not mounted (fail closed).
func placementsRoutes(r chi.Router, d Deps) {
	if d.Auth == nil {
		d.Logger.Warn("routing query GET /v1/blobs/{digest}/placements not mounted: it needs an authenticator")
		return
	}
	var secret string
	if d.OCI != nil {
		secret = d.OCI.ClusterSecret
	}
	authn := Authenticate(d.Auth, func(w http.ResponseWriter, r *http.Request, err error) { WriteAuthError(w, r, d.Logger, err) })
	r.With(nodeOr(nodeCredential(secret), authn)).Get("/v1/blobs/{digest}/placements", func(w http.ResponseWriter, r *http.Request) {
		dg, err := blobplane.ParseDigest(chi.URLParam(r, "digest"))
		if err != nil {
			WriteError(w, r, d.Logger, err)
			return
		}
		dc := d.Datacenter
		if q := r.URL.Query(); q.Has("datacenter") {
			dc = q.Get("datacenter")
		}
		if !placement.ValidDatacenter(dc) {
			WriteError(w, r, d.Logger, blobplane.Errorf(blobplane.CodeInvalid, "datacenter %q: must be 1-63 lowercase letters, digits or dashes", dc))
			return
		}
		rt, err := d.Placements.PlacementRoutingFor(r.Context(), dg, dc, readScope(r.Context()))
		if err != nil {
			WriteError(w, r, d.Logger, err)
			return
		}
		WriteJSON(w, http.StatusOK, placementsBody(rt))
	})
}

// readScope is what the caller in ctx may see of the ledger: everything
// for a node or an admin of every repository, else the repositories its
// grants let it read; nothing without a principal (fail closed).
func readScope(ctx context.Context) store.ReadScope {
	if node, _ := ctx.Value(nodeCallerKey{}).(bool); node {
		return store.ReadScope{All: true}
	}
	p, ok := PrincipalOf(ctx)
	switch {
	case !ok:
		return store.ReadScope{}
	case p.Allowed(auth.AllRepositories, auth.Admin):
		return store.ReadScope{All: true}
	}
	return store.ReadScopeOf(p.Grants)
}

type nodeCallerKey struct{}

// nodeOr admits a request that isNode accepts as a node's, marked so in
// its context, and hands every other one to authn.
func nodeOr(isNode func(*http.Request) bool, authn func(http.Handler) http.Handler) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		users := authn(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if isNode(r) {
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), nodeCallerKey{}, true)))
				return
			}
			users.ServeHTTP(w, r)
		})
	}
}

// nodeCredential reports whether a request carries the cluster credential.
// It asks the node-to-node endpoints' own check (RequireClusterSecret: a
// request signed with the cluster secret, issue 26 point 8), discarding
// its refusal, so that the two never disagree on who is a node. No secret
// configured: nobody is.
func nodeCredential(secret string) func(*http.Request) bool {
	if secret == "" {
		return func(*http.Request) bool { return false }
	}
	check := RequireClusterSecret(secret, nil)
	return func(r *http.Request) bool {
		if scheme, _, _ := strings.Cut(r.Header.Get("Authorization"), " "); !strings.EqualFold(scheme, nodeauth.Scheme) {
			// A user's credentials (or none): not a node, without
			// running the check and discarding its refusal, which cost
			// a tenth of the routing query's api CPU (make bench).
			return false
		}
		admitted := false
		check(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { admitted = true })).ServeHTTP(discardResponse{}, r)
		return admitted
	}
}

// discardResponse swallows the answer of a check whose verdict is all
// nodeCredential wants.
type discardResponse struct{}

func (discardResponse) Header() http.Header         { return http.Header{} }
func (discardResponse) Write(b []byte) (int, error) { return len(b), nil }
func (discardResponse) WriteHeader(int)             {}

func placementsBody(rt placement.Routing) PlacementsBody {
	return PlacementsBody{
		Digest: string(rt.Digest), Datacenter: rt.Datacenter, Known: rt.Known, Serveable: rt.Serveable,
		Local: placementsJSON(rt.Local), VerifiedRemote: placementsJSON(rt.VerifiedRemote),
		Pending: placementsJSON(rt.Pending), Failed: placementsJSON(rt.Failed), Revoked: placementsJSON(rt.Revoked),
	}
}

func placementsJSON(ps []placement.Placement) []PlacementJSON {
	out := make([]PlacementJSON, len(ps))
	for i, p := range ps {
		out[i] = PlacementJSON{
			Backend: p.Backend, Datacenter: p.Datacenter, Location: p.Location, State: string(p.State),
			Reason: string(p.Reason), RevokeReason: string(p.RevokeReason),
			Size: p.Size, Epoch: p.Epoch, Generation: p.Generation, UpdatedAt: p.UpdatedAt.UTC(),
		}
	}
	return out
}
