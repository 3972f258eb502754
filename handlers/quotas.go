package handlers

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/quota"
	"github.com/blobplane/blobplane/store"
)

// QuotaAdmin is the store behind /v1/admin/quotas (issue 33,
// docs/quotas.md). store.Store implements it; the routes are mounted when
// Deps.Repositories implements it too.
type QuotaAdmin interface {
	// SetRepositoryQuota sets repository's quota as principal. Errors:
	// invalid, not_found (no such repository).
	SetRepositoryQuota(ctx context.Context, repository string, limit quota.Limit, principal string) (store.RepositoryQuota, error)
	// ClearRepositoryQuota removes it, and says whether the home applied
	// the change; clearing none succeeds.
	ClearRepositoryQuota(ctx context.Context, repository string) (bool, error)
	// RepositoryQuota is one repository's quota and usage. Errors:
	// not_found.
	RepositoryQuota(ctx context.Context, repository string) (store.RepositoryQuota, error)
	// RepositoryQuotas lists the repositories with a quota.
	RepositoryQuotas(ctx context.Context) ([]store.RepositoryQuota, error)
}

// QuotaJSON is one repository's quota and usage in admin answers. A zero
// max sets no limit on that measure; without a quota both are 0.
type QuotaJSON struct {
	Repository string     `json:"repository"`
	MaxBytes   int64      `json:"max_bytes"`
	MaxBlobs   int64      `json:"max_blobs"`
	UsedBytes  int64      `json:"used_bytes"`
	UsedBlobs  int64      `json:"used_blobs"`
	SetBy      string     `json:"set_by,omitempty"`
	SetAt      *time.Time `json:"set_at,omitempty"`
	// Applied, in a PUT's answer: the repository's home holds the new
	// quota, so the next upload meets it. False: the home did not apply
	// it within 5 s (it is restoring or down); it will before it serves.
	Applied *bool `json:"applied,omitempty"`
}

// QuotasBody is the answer of GET /v1/admin/quotas.
type QuotasBody struct {
	Quotas []QuotaJSON `json:"quotas"`
}

// SetQuotaRequest is the body of PUT /v1/admin/quotas/<repository>: at
// least one positive limit; an absent or 0 one sets no limit on that
// measure.
type SetQuotaRequest struct {
	MaxBytes int64 `json:"max_bytes"`
	MaxBlobs int64 `json:"max_blobs"`
}

// errQuotaBody is the answer to a PUT body that is not a SetQuotaRequest.
var errQuotaBody = blobplane.Errorf(blobplane.CodeInvalid,
	`body must be JSON {"max_bytes": N, "max_blobs": M} (at least one positive; 0 or absent: no limit on that measure)`)

// quotaRoutes mounts the quota routes on adminRoutes' group
// (authenticated, some admin grant) when d.Repositories is a QuotaAdmin.
// Reading a repository's quota and usage needs admin on it; the list
// shows the repositories the caller administers. Setting or clearing one
// needs admin on every repository (*:admin): a repository's own admin
// must not raise its quota.
func quotaRoutes(r chi.Router, d Deps) {
	qa, ok := d.Repositories.(QuotaAdmin)
	if !ok {
		return
	}
	h := quotaHandler{store: qa, logger: d.Logger}
	r.Get("/quotas", h.list)
	r.Get("/quotas/*", h.get)
	r.With(requireGlobalAdmin).Put("/quotas/*", h.set)
	r.With(requireGlobalAdmin).Delete("/quotas/*", h.clear)
}

type quotaHandler struct {
	store  QuotaAdmin
	logger *slog.Logger
}

func quotaJSON(q store.RepositoryQuota) QuotaJSON {
	j := QuotaJSON{Repository: q.Repository, MaxBytes: q.Limit.Bytes, MaxBlobs: q.Limit.Blobs,
		UsedBytes: q.Usage.Bytes, UsedBlobs: q.Usage.Blobs, SetBy: q.SetBy}
	if !q.SetAt.IsZero() {
		j.SetAt = &q.SetAt
	}
	return j
}

func (h quotaHandler) list(w http.ResponseWriter, r *http.Request) {
	p, _ := PrincipalOf(r.Context())
	qs, err := h.store.RepositoryQuotas(r.Context())
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	body := QuotasBody{Quotas: []QuotaJSON{}}
	for _, q := range qs {
		if p.Allowed(q.Repository, auth.Admin) {
			body.Quotas = append(body.Quotas, quotaJSON(q))
		}
	}
	WriteJSON(w, http.StatusOK, body)
}

// repository is the repository a quota route names (the rest of the
// path), once the caller may administer it.
func (h quotaHandler) repository(w http.ResponseWriter, r *http.Request) (string, bool) {
	name := chi.URLParam(r, "*")
	if err := auth.CheckRepository(name); err != nil {
		WriteError(w, r, h.logger, err)
		return "", false
	}
	if err := CheckPermission(r.Context(), name, auth.Admin); err != nil {
		WriteAuthError(w, r, h.logger, err)
		return "", false
	}
	noteRequest(r.Context(), func(n *requestNote) { n.repository = name })
	return name, true
}

func (h quotaHandler) get(w http.ResponseWriter, r *http.Request) {
	name, ok := h.repository(w, r)
	if !ok {
		return
	}
	q, err := h.store.RepositoryQuota(r.Context(), name)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	WriteJSON(w, http.StatusOK, quotaJSON(q))
}

func (h quotaHandler) set(w http.ResponseWriter, r *http.Request) {
	name, ok := h.repository(w, r)
	if !ok {
		return
	}
	var req SetQuotaRequest
	if err := decodeStrict(w, r, 4<<10, &req, errQuotaBody); err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	p, _ := PrincipalOf(r.Context())
	q, err := h.store.SetRepositoryQuota(r.Context(), name, quota.Limit{Bytes: req.MaxBytes, Blobs: req.MaxBlobs}, p.Name)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	h.logger.InfoContext(r.Context(), "repository quota set", "repository", name, "max_bytes", req.MaxBytes, "max_blobs", req.MaxBlobs, "principal", p.Name, "applied", q.Applied)
	j := quotaJSON(q)
	j.Applied = &q.Applied
	WriteJSON(w, http.StatusOK, j)
}

func (h quotaHandler) clear(w http.ResponseWriter, r *http.Request) {
	name, ok := h.repository(w, r)
	if !ok {
		return
	}
	applied, err := h.store.ClearRepositoryQuota(r.Context(), name)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	p, _ := PrincipalOf(r.Context())
	h.logger.InfoContext(r.Context(), "repository quota cleared", "repository", name, "principal", p.Name, "applied", applied)
	w.WriteHeader(http.StatusNoContent)
}
