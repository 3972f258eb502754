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
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/store"
)

// IdentityAdmin is the store behind /v1/admin/tokens and
// /v1/admin/grants: who may authenticate, and with which grants.
// store.Store implements it; the routes are mounted when
// Deps.Repositories implements it too. Every route needs admin on every
// repository (*:admin): whoever mints tokens or grants can give itself
// anything.
type IdentityAdmin interface {
	// CreateToken issues a token for principal (created if new) holding
	// grants, and returns the token string (shown once, never stored)
	// and its id. Errors: invalid for a bad principal name or grant.
	CreateToken(ctx context.Context, principal string, grants []auth.Grant) (secret, id string, err error)
	// ListTokens returns every token, or principal's when it is not "",
	// newest first, without secrets.
	ListTokens(ctx context.Context, principal string) ([]store.TokenInfo, error)
	// RevokeToken revokes the token id from the next request on;
	// revoking a revoked token succeeds. Errors: not_found for an
	// unknown id.
	RevokeToken(ctx context.Context, id string) error
	// GrantPrincipal gives principal (created if new) grants that every
	// one of its valid tokens holds besides its own. Errors: invalid for
	// a bad principal name or grant.
	GrantPrincipal(ctx context.Context, principal string, grants []auth.Grant) error
	// RevokePrincipalGrants removes grants given with GrantPrincipal;
	// removing one the principal does not hold changes nothing.
	RevokePrincipalGrants(ctx context.Context, principal string, grants []auth.Grant) error
	// ListPrincipalGrants returns the grants given to principals (or to
	// principal when it is not ""), by principal.
	ListPrincipalGrants(ctx context.Context, principal string) ([]store.PrincipalGrant, error)
}

// TokenJSON is one token in GET /v1/admin/tokens: never its secret.
type TokenJSON struct {
	ID         string     `json:"id"`
	Principal  string     `json:"principal"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
	// Grants are the token's own (pattern:permission); its principal's
	// are in GET /v1/admin/grants.
	Grants []string `json:"grants"`
}

// TokensBody is the answer of GET /v1/admin/tokens.
type TokensBody struct {
	Tokens []TokenJSON `json:"tokens"`
}

// GrantsRequest is the body of POST /v1/admin/tokens and POST
// /v1/admin/grants: a principal and grants as pattern:permission.
type GrantsRequest struct {
	Principal string   `json:"principal"`
	Grants    []string `json:"grants"`
}

// CreatedTokenJSON is the answer of POST /v1/admin/tokens. Token is the
// only time the secret is shown.
type CreatedTokenJSON struct {
	ID        string   `json:"id"`
	Principal string   `json:"principal"`
	Grants    []string `json:"grants"`
	Token     string   `json:"token"`
}

// PrincipalGrantJSON is one grant given to a principal in GET
// /v1/admin/grants.
type PrincipalGrantJSON struct {
	Principal string    `json:"principal"`
	Grant     string    `json:"grant"`
	CreatedAt time.Time `json:"created_at"`
}

// PrincipalGrantsBody is the answer of GET /v1/admin/grants.
type PrincipalGrantsBody struct {
	Grants []PrincipalGrantJSON `json:"grants"`
}

// PrincipalJSON is a principal with grants: the answer of POST
// /v1/admin/grants (the grants given) and of GET /v1/whoami (the
// caller's effective grants).
type PrincipalJSON struct {
	Principal string   `json:"principal"`
	Grants    []string `json:"grants"`
}

// maxGrantsBody bounds a GrantsRequest.
const maxGrantsBody = 64 << 10

// errGrantsBody is the answer to a body that is not a GrantsRequest.
var errGrantsBody = blobplane.Errorf(blobplane.CodeInvalid, `body must be JSON {"principal": "ci", "grants": ["team/*:write", ...]}`)

// identityRoutes mounts the token and grant routes on adminRoutes' group
// when d.Repositories is an IdentityAdmin, behind admin on every
// repository, checked before anything is parsed or read: a team admin
// must never mint a *:admin token or widen its own grants.
func identityRoutes(r chi.Router, d Deps) {
	ia, ok := d.Repositories.(IdentityAdmin)
	if !ok {
		return
	}
	h := identityHandler{store: ia, logger: d.Logger}
	r.Group(func(r chi.Router) {
		r.Use(requireGlobalAdmin)
		r.Get("/tokens", h.listTokens)
		r.Post("/tokens", h.createToken)
		r.Delete("/tokens/{id}", h.revokeToken)
		r.Get("/grants", h.listGrants)
		r.Post("/grants", h.grant)
		r.Delete("/grants", h.revokeGrants)
	})
}

type identityHandler struct {
	store  IdentityAdmin
	logger *slog.Logger
}

func (h identityHandler) listTokens(w http.ResponseWriter, r *http.Request) {
	principal, ok := h.principalFilter(w, r)
	if !ok {
		return
	}
	toks, err := h.store.ListTokens(r.Context(), principal)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	body := TokensBody{Tokens: make([]TokenJSON, 0, len(toks))}
	for _, t := range toks {
		body.Tokens = append(body.Tokens, TokenJSON{ID: t.ID, Principal: t.Principal, CreatedAt: t.CreatedAt,
			LastUsedAt: t.LastUsed, RevokedAt: t.RevokedAt, Grants: nonNil(t.Grants)})
	}
	WriteJSON(w, http.StatusOK, body)
}

// createToken is POST: 201 with the token, whose secret appears in this
// answer only (and never in a log).
func (h identityHandler) createToken(w http.ResponseWriter, r *http.Request) {
	req, grants, ok := h.grantsRequest(w, r, false)
	if !ok {
		return
	}
	secret, id, err := h.store.CreateToken(r.Context(), req.Principal, grants)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	p, _ := PrincipalOf(r.Context())
	names := grantStrings(grants)
	h.logger.InfoContext(r.Context(), "token created", "token_id", id, "token_principal", req.Principal, "grants", names, "principal", p.Name)
	WriteJSON(w, http.StatusCreated, CreatedTokenJSON{ID: id, Principal: req.Principal, Grants: names, Token: secret})
}

// revokeToken is DELETE /tokens/{id}: the token id only, never the
// token (a secret in a URL ends up in logs).
func (h identityHandler) revokeToken(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	if !auth.ValidTokenID(id) {
		// No echo: the segment may be a whole token.
		WriteError(w, r, h.logger, blobplane.Errorf(blobplane.CodeInvalid, "the path must end in a token id (16 base32 characters), never in a token"))
		return
	}
	if err := h.store.RevokeToken(r.Context(), id); err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	p, _ := PrincipalOf(r.Context())
	h.logger.InfoContext(r.Context(), "token revoked", "token_id", id, "principal", p.Name)
	w.WriteHeader(http.StatusNoContent)
}

func (h identityHandler) listGrants(w http.ResponseWriter, r *http.Request) {
	principal, ok := h.principalFilter(w, r)
	if !ok {
		return
	}
	gs, err := h.store.ListPrincipalGrants(r.Context(), principal)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	body := PrincipalGrantsBody{Grants: make([]PrincipalGrantJSON, 0, len(gs))}
	for _, g := range gs {
		body.Grants = append(body.Grants, PrincipalGrantJSON{Principal: g.Principal, Grant: g.Grant, CreatedAt: g.CreatedAt})
	}
	WriteJSON(w, http.StatusOK, body)
}

// grant is POST /grants: 200 with the grants given (granting one held
// already changes nothing).
func (h identityHandler) grant(w http.ResponseWriter, r *http.Request) {
	req, grants, ok := h.grantsRequest(w, r, true)
	if !ok {
		return
	}
	if err := h.store.GrantPrincipal(r.Context(), req.Principal, grants); err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	p, _ := PrincipalOf(r.Context())
	names := grantStrings(grants)
	h.logger.InfoContext(r.Context(), "grants given", "grantee", req.Principal, "grants", names, "principal", p.Name)
	WriteJSON(w, http.StatusOK, PrincipalJSON{Principal: req.Principal, Grants: names})
}

// revokeGrants is DELETE /grants?principal=P&grant=G[&grant=...]: 204,
// whether or not the principal held them.
func (h identityHandler) revokeGrants(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	principal := q.Get("principal")
	if principal == "" || len(q["grant"]) == 0 {
		WriteError(w, r, h.logger, blobplane.Errorf(blobplane.CodeInvalid, "DELETE /v1/admin/grants needs ?principal=P and at least one &grant=pattern:permission"))
		return
	}
	grants, err := auth.ParseGrants(q["grant"])
	if err == nil {
		err = auth.CheckPrincipal(principal)
	}
	if err == nil {
		err = h.store.RevokePrincipalGrants(r.Context(), principal, grants)
	}
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	p, _ := PrincipalOf(r.Context())
	h.logger.InfoContext(r.Context(), "grants removed", "grantee", principal, "grants", grantStrings(grants), "principal", p.Name)
	w.WriteHeader(http.StatusNoContent)
}

// principalFilter is a list's ?principal= ("" for everyone); a malformed
// one is answered 400 and ok is false.
func (h identityHandler) principalFilter(w http.ResponseWriter, r *http.Request) (string, bool) {
	principal := r.URL.Query().Get("principal")
	if principal != "" {
		if err := auth.CheckPrincipal(principal); err != nil {
			WriteError(w, r, h.logger, err)
			return "", false
		}
	}
	return principal, true
}

// grantsRequest reads a GrantsRequest and parses its grants (at least
// one when needGrants); otherwise it answers 400 and ok is false.
func (h identityHandler) grantsRequest(w http.ResponseWriter, r *http.Request, needGrants bool) (GrantsRequest, []auth.Grant, bool) {
	var req GrantsRequest
	err := decodeStrict(w, r, maxGrantsBody, &req, errGrantsBody)
	if err == nil && (req.Principal == "" || needGrants && len(req.Grants) == 0) {
		err = errGrantsBody
	}
	var grants []auth.Grant
	if err == nil {
		grants, err = auth.ParseGrants(req.Grants)
	}
	if err == nil {
		err = auth.CheckPrincipal(req.Principal)
	}
	if err != nil {
		WriteError(w, r, h.logger, err)
		return GrantsRequest{}, nil, false
	}
	return req, grants, true
}

// decodeStrict reads one JSON object into v: no unknown field, nothing
// after it, at most limit bytes. Errors: usage (invalid) otherwise.
func decodeStrict(w http.ResponseWriter, r *http.Request, limit int64, v any, usage *blobplane.Error) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return blobplane.Wrap(blobplane.CodeInvalid, err, "%s", usage.Message)
	}
	if err := dec.Decode(new(json.RawMessage)); !errors.Is(err, io.EOF) {
		return usage
	}
	return nil
}

// whoamiRoute mounts GET /v1/whoami: any authenticated principal learns
// its name and effective grants (a CLI's login checks a token with it).
// Like the admin surface it refuses cross-site requests and challenges
// Bearer only, so no browser prompts for and caches a token.
func whoamiRoute(r chi.Router, d Deps) {
	r.With(refuseCrossSite(d.Logger), Authenticate(d.Auth, adminAuthFail(d.Logger))).
		Get("/v1/whoami", func(w http.ResponseWriter, r *http.Request) {
			p, _ := PrincipalOf(r.Context())
			WriteJSON(w, http.StatusOK, PrincipalJSON{Principal: p.Name, Grants: grantStrings(p.Grants)})
		})
}

// grantStrings is gs as pattern:permission, [] for none.
func grantStrings(gs []auth.Grant) []string {
	out := make([]string, 0, len(gs))
	for _, g := range gs {
		out = append(out, g.String())
	}
	return out
}

func nonNil(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	return ss
}
