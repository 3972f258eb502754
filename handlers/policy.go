package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/replication/policy"
)

// PolicyAdmin is the store behind /v1/admin/replication-policies
// (docs/replication.md). store.Store implements it; the routes are
// mounted when Deps.Repositories implements it too.
type PolicyAdmin interface {
	// SetPolicy creates or replaces the policy of p.Prefix, recorded as
	// set by principal. Errors: invalid for a malformed prefix or
	// datacenter label, or a minimum out of range.
	SetPolicy(ctx context.Context, p policy.Policy, principal string) (policy.Policy, error)
	// DeletePolicy deletes the policy of prefix. Errors: not_found when
	// there is none.
	DeletePolicy(ctx context.Context, prefix string) error
	// Policies lists every stored policy ordered by prefix.
	Policies(ctx context.Context) ([]policy.Policy, error)
}

// PolicyJSON is one replication policy in admin answers.
type PolicyJSON struct {
	// Prefix is "" for the global policy, "team/" for every repository
	// under team/, "team/app" for that repository.
	Prefix            string     `json:"prefix"`
	Datacenters       []string   `json:"datacenters"`
	MinVerifiedCopies int        `json:"min_verified_copies"`
	SetBy             string     `json:"set_by,omitempty"`
	CreatedAt         *time.Time `json:"created_at,omitempty"`
	UpdatedAt         *time.Time `json:"updated_at,omitempty"`
}

// PoliciesBody is the answer of GET /v1/admin/replication-policies.
type PoliciesBody struct {
	Policies []PolicyJSON `json:"policies"`
}

// SetPolicyRequest is the body of PUT
// /v1/admin/replication-policies/<prefix>. Datacenters is required ([]
// for no replication); MinVerifiedCopies defaults to 1.
type SetPolicyRequest struct {
	Datacenters       *[]string `json:"datacenters"`
	MinVerifiedCopies *int      `json:"min_verified_copies,omitempty"`
}

// errPolicyBody is the answer to a PUT body that is not a SetPolicyRequest.
var errPolicyBody = blobplane.Errorf(blobplane.CodeInvalid,
	`body must be JSON {"datacenters": ["us-1", ...], "min_verified_copies": N} (datacenters required, [] for no replication; min_verified_copies default 1)`)

// policyRoutes mounts the replication policy routes on adminRoutes'
// group (authenticated, some admin grant) when d.Repositories is also a
// PolicyAdmin. The path after /v1/admin/replication-policies/ is the
// prefix, byte for byte: .../team/ is the policy of team/, .../team/app
// that of team/app, and .../ (the empty prefix) the global policy.
// Changing one needs admin on every repository its prefix matches
// (policy.Governs); the list shows the policies that govern something
// the caller administers (policy.Concerns).
func policyRoutes(r chi.Router, d Deps) {
	pa, ok := d.Repositories.(PolicyAdmin)
	if !ok {
		return
	}
	h := policyHandler{store: pa, logger: d.Logger}
	r.Get("/replication-policies", h.list)
	r.Put("/replication-policies/*", h.set)
	r.Delete("/replication-policies/*", h.delete)
}

type policyHandler struct {
	store  PolicyAdmin
	logger *slog.Logger
}

func (h policyHandler) list(w http.ResponseWriter, r *http.Request) {
	p, _ := PrincipalOf(r.Context())
	all, err := h.store.Policies(r.Context())
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	body := PoliciesBody{Policies: []PolicyJSON{}}
	for _, pol := range all {
		if policy.Concerns(p, pol.Prefix) {
			body.Policies = append(body.Policies, policyJSON(pol))
		}
	}
	WriteJSON(w, http.StatusOK, body)
}

func (h policyHandler) set(w http.ResponseWriter, r *http.Request) {
	prefix, ok := h.governed(w, r)
	if !ok {
		return
	}
	req, err := decodeSetPolicy(w, r)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	p, _ := PrincipalOf(r.Context())
	least := 1
	if req.MinVerifiedCopies != nil {
		least = *req.MinVerifiedCopies
	}
	stored, err := h.store.SetPolicy(r.Context(), policy.Policy{Prefix: prefix, Datacenters: *req.Datacenters, MinVerifiedCopies: least}, p.Name)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	WriteJSON(w, http.StatusOK, policyJSON(stored))
}

func (h policyHandler) delete(w http.ResponseWriter, r *http.Request) {
	prefix, ok := h.governed(w, r)
	if !ok {
		return
	}
	if err := h.store.DeletePolicy(r.Context(), prefix); err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// governed returns the request's prefix when the caller may change its
// policy; otherwise it answers (400 for a malformed prefix, 403 without
// admin on all it matches) and returns false. Nothing is read before.
func (h policyHandler) governed(w http.ResponseWriter, r *http.Request) (string, bool) {
	prefix := chi.URLParam(r, "*")
	if err := policy.CheckPrefix(prefix); err != nil {
		WriteError(w, r, h.logger, err)
		return "", false
	}
	if p, _ := PrincipalOf(r.Context()); !policy.Governs(p, prefix) {
		what := "every repository (*)"
		if prefix != policy.Global {
			what = "every repository the prefix " + prefix + " matches"
		}
		WriteError(w, r, h.logger, &blobplane.Error{Code: blobplane.CodeForbidden, Message: "this token lacks admin access to " + what})
		return "", false
	}
	return prefix, true
}

// decodeSetPolicy reads a SetPolicyRequest: one JSON object, no unknown
// field (a misspelt one would be silently dropped), datacenters present.
func decodeSetPolicy(w http.ResponseWriter, r *http.Request) (SetPolicyRequest, error) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	var req SetPolicyRequest
	if err := dec.Decode(&req); err != nil {
		return SetPolicyRequest{}, blobplane.Wrap(blobplane.CodeInvalid, err, "%s", errPolicyBody.Message)
	}
	if err := dec.Decode(new(json.RawMessage)); !errors.Is(err, io.EOF) || req.Datacenters == nil {
		return SetPolicyRequest{}, errPolicyBody
	}
	return req, nil
}

func policyJSON(p policy.Policy) PolicyJSON {
	out := PolicyJSON{Prefix: p.Prefix, Datacenters: p.Datacenters, MinVerifiedCopies: p.MinVerifiedCopies, SetBy: p.SetBy}
	if out.Datacenters == nil {
		out.Datacenters = []string{}
	}
	if !p.CreatedAt.IsZero() {
		out.CreatedAt, out.UpdatedAt = &p.CreatedAt, &p.UpdatedAt
	}
	return out
}
