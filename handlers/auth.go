package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/store"
)

// Authenticator resolves a presented token to the principal it acts as,
// with that token's effective grants. store.Store implements it.
type Authenticator interface {
	// Authenticate returns the token's principal. Errors: unauthorized for
	// a malformed, unknown, wrong or revoked token; unavailable when the
	// credentials cannot be checked right now.
	Authenticate(ctx context.Context, token string) (auth.Principal, error)
}

// RepositoryAdmin is the store behind /v1/admin/repositories.
// store.Store implements it.
type RepositoryAdmin interface {
	// CreateRepository creates name; creating an existing repository
	// succeeds. Errors: invalid for a name outside the OCI grammar.
	CreateRepository(ctx context.Context, name string) error
	// ListRepositories returns every repository ordered by name.
	ListRepositories(ctx context.Context) ([]store.Repository, error)
	// DeleteRepository deletes the empty repository name. Errors:
	// invalid for a malformed name; not_found when there is none;
	// conflict while it still holds blob references or uploads.
	DeleteRepository(ctx context.Context, name string) error
}

// Realm is the realm of the WWW-Authenticate challenges.
const Realm = "blobplane"

type principalKey struct{}

// WithPrincipal returns ctx carrying p (what Authenticate does; exported
// for tests and internal callers that act as a known principal).
func WithPrincipal(ctx context.Context, p auth.Principal) context.Context {
	noteRequest(ctx, func(n *requestNote) { n.principal = p.Name })
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalOf returns the principal the Authenticate middleware put in
// ctx; ok is false on a route without authentication.
func PrincipalOf(ctx context.Context) (auth.Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(auth.Principal)
	return p, ok
}

// Credentials returns the token a request presents: the credentials of
// "Authorization: Bearer <token>", or the password of HTTP Basic with any
// username (what OCI clients such as oras and crane send after
// `login -u anything -p <token>`). ok is false when the request carries no
// Authorization header of either scheme.
func Credentials(r *http.Request) (token string, ok bool) {
	h := r.Header.Get("Authorization")
	if scheme, rest, found := strings.Cut(h, " "); found && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(rest), true
	}
	if _, password, found := r.BasicAuth(); found {
		return password, true
	}
	return "", false
}

// Challenge sets the WWW-Authenticate challenges every 401 carries: Basic
// first (OCI clients such as oras only read the first challenge, and Basic
// with the token as password is the scheme they can answer without a token
// service), then Bearer.
func Challenge(w http.ResponseWriter) {
	w.Header().Add("WWW-Authenticate", `Basic realm="`+Realm+`"`)
	w.Header().Add("WWW-Authenticate", `Bearer realm="`+Realm+`"`)
}

// WriteAuthError is WriteError that adds the WWW-Authenticate challenges
// to unauthorized answers.
func WriteAuthError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	if blobplane.ErrorCode(err) == blobplane.CodeUnauthorized {
		Challenge(w)
	}
	WriteError(w, r, logger, err)
}

// ErrNoCredentials is the answer to a request without credentials on an
// authenticated route.
var ErrNoCredentials = &blobplane.Error{Code: blobplane.CodeUnauthorized, Message: "authentication required: send a token as \"Authorization: Bearer <token>\" or as the HTTP Basic password"}

// Authenticate returns middleware that requires credentials and puts the
// principal in the request context (see PrincipalOf). A request without
// credentials, or with a malformed, unknown or revoked token, is answered
// by fail with an unauthorized error; fail nil writes the JSON error with
// status 401 and the WWW-Authenticate challenges (WriteAuthError). The OCI
// API passes its own fail to answer in the OCI error format. Behind
// NewRouter's failure limiter, an attempt from a client (or at a token id)
// with too many recent failures is answered by fail with a
// too_many_requests error (429) and Retry-After, unchecked (authlimit.go).
// Authentication costs one database query (see store.Store.Authenticate);
// every later permission decision on the request is pure.
func Authenticate(a Authenticator, fail func(w http.ResponseWriter, r *http.Request, err error)) func(http.Handler) http.Handler {
	if fail == nil {
		logger := slog.New(slog.DiscardHandler)
		fail = func(w http.ResponseWriter, r *http.Request, err error) { WriteAuthError(w, r, logger, err) }
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			token, ok := Credentials(r)
			if !ok {
				fail(w, r, ErrNoCredentials)
				return
			}
			p, err := authenticate(r, a, token) // through the failure limiter (issue 26 point 6)
			if err != nil {
				if t := (*throttled)(nil); errors.As(err, &t) {
					w.Header().Set("Retry-After", t.retryAfterHeader())
				}
				fail(w, r, err)
				return
			}
			next.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), p)))
		})
	}
}

// Denied is the answer to a caller that lacks perm on repo. It names only
// the repository and the permission, never anything about blobs, so a blob
// endpoint answers a caller without rights identically whether or not the
// blob exists anywhere (issue 6, S8): check the permission first (with
// CheckPermission or RequirePermission) and touch no blob state before it
// passes.
func Denied(repo string, perm auth.Permission) error {
	what := "repository " + repo
	if repo == auth.AllRepositories {
		what = "every repository (*)"
	}
	return &blobplane.Error{Code: blobplane.CodeForbidden, Message: "this token lacks " + perm.String() + " access to " + what}
}

// CheckPermission decides whether the request's principal has perm on repo
// (a repository name, or auth.AllRepositories to require a grant on every
// repository). It returns nil, an unauthorized error when ctx carries no
// principal (the route lacks Authenticate: fail closed), an invalid error
// for a malformed repository name, or Denied. It performs no I/O.
func CheckPermission(ctx context.Context, repo string, perm auth.Permission) error {
	p, ok := PrincipalOf(ctx)
	if !ok {
		return ErrNoCredentials
	}
	if repo != auth.AllRepositories {
		if err := auth.CheckRepository(repo); err != nil {
			return err
		}
	}
	if !p.Allowed(repo, perm) {
		return Denied(repo, perm)
	}
	return nil
}

// RequirePermission returns middleware, to be used after Authenticate,
// that lets a request through only when its principal has perm on the
// repository repoFn names (auth.AllRepositories for "every repository").
// Lacking rights is 403 with Denied's message, decided before the handler
// runs, so nothing about the resource leaks; no principal is 401 with the
// challenges.
func RequirePermission(repoFn func(*http.Request) string, perm auth.Permission) func(http.Handler) http.Handler {
	logger := slog.New(slog.DiscardHandler) // only 4xx are written here
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := CheckPermission(r.Context(), repoFn(r), perm); err != nil {
				WriteAuthError(w, r, logger, err)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// requireAnyAdmin admits principals holding admin on at least one pattern:
// the entry check of /v1/admin, whose routes then decide per repository.
func requireAnyAdmin(next http.Handler) http.Handler {
	logger := slog.New(slog.DiscardHandler)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := PrincipalOf(r.Context())
		if !ok {
			writeAdminAuthError(w, r, logger, ErrNoCredentials)
			return
		}
		if !p.HasAny(auth.Admin) {
			WriteAuthError(w, r, logger, &blobplane.Error{Code: blobplane.CodeForbidden, Message: "this token holds no admin grant"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// RepositoryJSON is one repository in admin answers.
type RepositoryJSON struct {
	Name      string     `json:"name"`
	CreatedAt *time.Time `json:"created_at,omitempty"`
}

// RepositoriesBody is the answer of GET /v1/admin/repositories.
type RepositoriesBody struct {
	Repositories []RepositoryJSON `json:"repositories"`
}

// CreateRepositoryRequest is the body of POST /v1/admin/repositories.
type CreateRepositoryRequest struct {
	Name string `json:"name"`
}

// requireGlobalAdmin requires admin on every repository (*:admin): for
// what acts on the whole cluster or on identity (tokens, grants,
// takeover, plans, obliteration, the River UI).
var requireGlobalAdmin = RequirePermission(func(*http.Request) string { return auth.AllRepositories }, auth.Admin)

// adminRoutes mounts /v1/admin. Every route under it requires
// authentication and an admin grant on some pattern, then checks admin on
// the repository it touches. Register every /v1/admin route here, inside
// the group, so none is ever served without those checks.
func adminRoutes(r chi.Router, d Deps) {
	r.Route("/v1/admin", func(r chi.Router) {
		// Cross-site and non-JSON writes are refused before
		// authentication, and a 401 challenges Bearer only (issue 26
		// point 7, csrf.go).
		r.Use(refuseCrossSite(d.Logger), requireJSONWrites, Authenticate(d.Auth, adminAuthFail(d.Logger)), requireAnyAdmin)
		if d.Repositories == nil {
			return
		}
		// GET lists the repositories the caller administers (all of them
		// with *:admin).
		r.Get("/repositories", func(w http.ResponseWriter, r *http.Request) {
			p, _ := PrincipalOf(r.Context())
			repos, err := d.Repositories.ListRepositories(r.Context())
			if err != nil {
				WriteError(w, r, d.Logger, err)
				return
			}
			body := RepositoriesBody{Repositories: []RepositoryJSON{}}
			for _, repo := range repos {
				if p.Allowed(repo.Name, auth.Admin) {
					body.Repositories = append(body.Repositories, RepositoryJSON{Name: repo.Name, CreatedAt: &repo.CreatedAt})
				}
			}
			WriteJSON(w, http.StatusOK, body)
		})
		// POST {"name": "team/app"} creates a repository (idempotent)
		// where the caller holds admin.
		r.Post("/repositories", func(w http.ResponseWriter, r *http.Request) {
			var req CreateRepositoryRequest
			if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
				WriteError(w, r, d.Logger, blobplane.Errorf(blobplane.CodeInvalid, "body must be JSON {\"name\": \"<repository>\"}"))
				return
			}
			if err := CheckPermission(r.Context(), req.Name, auth.Admin); err != nil {
				WriteAuthError(w, r, d.Logger, err)
				return
			}
			if err := d.Repositories.CreateRepository(r.Context(), req.Name); err != nil {
				WriteError(w, r, d.Logger, err)
				return
			}
			WriteJSON(w, http.StatusCreated, RepositoryJSON{Name: req.Name})
		})
		// DELETE /repositories/team/app deletes the empty repository
		// where the caller holds admin (the name is the rest of the
		// path: it contains slashes).
		r.Delete("/repositories/*", func(w http.ResponseWriter, r *http.Request) {
			name := chi.URLParam(r, "*")
			if err := CheckPermission(r.Context(), name, auth.Admin); err != nil {
				WriteAuthError(w, r, d.Logger, err)
				return
			}
			noteRequest(r.Context(), func(n *requestNote) { n.repository = name })
			if err := d.Repositories.DeleteRepository(r.Context(), name); err != nil {
				WriteError(w, r, d.Logger, err)
				return
			}
			p, _ := PrincipalOf(r.Context())
			d.Logger.InfoContext(r.Context(), "repository deleted", "repository", name, "principal", p.Name)
			w.WriteHeader(http.StatusNoContent)
		})
		// Replication policies (policy.go, docs/replication.md).
		policyRoutes(r, d)
		// Obliteration (obliterate.go, docs/obliteration.md).
		obliterationRoutes(r, d)
		// Tokens and grants (identity.go, docs/auth.md).
		identityRoutes(r, d)
		// Repository quotas (quotas.go, docs/quotas.md).
		quotaRoutes(r, d)
		// Partition state at the home or a standby (state.go).
		stateRoutes(r, d)
		// Takeover, plan and apply (cluster.go, docs/auth.md).
		clusterRoutes(r, d)
		// The cluster's format level and its finalize (format.go,
		// docs/quotas.md "Format levels").
		formatRoutes(r, d)
	})
}

// riverUIRoutes mounts the River UI behind admin on every repository.
func riverUIRoutes(r chi.Router, d Deps) {
	r.Handle("/riverui", http.RedirectHandler("/riverui/", http.StatusMovedPermanently))
	// Its own requests are same-origin; anything cross-site is refused,
	// and a 401 challenges Bearer only (issue 26 point 7). Its writes
	// (pause a queue, cancel a job) are not all JSON, so Content-Type is
	// not required here: Sec-Fetch-Site and Origin guard them.
	r.With(refuseCrossSite(d.Logger), Authenticate(d.Auth, adminAuthFail(d.Logger)), requireGlobalAdmin).
		Handle("/riverui/*", d.RiverUI)
}
