package handlers

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/quota"
	"github.com/blobplane/blobplane/replication/policy"
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
	ClearRepositoryQuota(ctx context.Context, repository string) (applied bool, position string, err error)
	// RepositoryQuota is one repository's quota and usage. Errors:
	// not_found.
	RepositoryQuota(ctx context.Context, repository string) (store.RepositoryQuota, error)
	// RepositoryQuotas lists the repositories with a quota.
	RepositoryQuotas(ctx context.Context) ([]store.RepositoryQuota, error)
	// SetTenantQuota, ClearTenantQuota, TenantQuota and TenantQuotas are
	// the same for a tenant, a prefix ending in / (its repositories
	// together).
	SetTenantQuota(ctx context.Context, prefix string, limit quota.Limit, principal string) (store.TenantQuota, error)
	ClearTenantQuota(ctx context.Context, prefix string) error
	TenantQuota(ctx context.Context, prefix string) (store.TenantQuota, error)
	TenantQuotas(ctx context.Context) ([]store.TenantQuota, error)
}

// QuotaJSON is one repository's or tenant's quota and usage in admin
// answers: Repository or Tenant (a prefix ending in /, its repositories
// together) names it. A zero max sets no limit on that measure; without
// a quota both are 0. MaxBytesPerMinute and MaxBlobsPerMinute, a
// repository's upload rate (absent: none; tenants have none), bound what
// it publishes in any minute.
type QuotaJSON struct {
	Repository        string     `json:"repository,omitempty"`
	Tenant            string     `json:"tenant,omitempty"`
	MaxBytes          int64      `json:"max_bytes"`
	MaxBlobs          int64      `json:"max_blobs"`
	MaxBytesPerMinute int64      `json:"max_bytes_per_minute,omitempty"`
	MaxBlobsPerMinute int64      `json:"max_blobs_per_minute,omitempty"`
	UsedBytes         int64      `json:"used_bytes"`
	UsedBlobs         int64      `json:"used_blobs"`
	SetBy             string     `json:"set_by,omitempty"`
	SetAt             *time.Time `json:"set_at,omitempty"`
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
// measure. The per-minute limits (a repository's upload rate) are refused
// for a tenant.
type SetQuotaRequest struct {
	MaxBytes          int64 `json:"max_bytes"`
	MaxBlobs          int64 `json:"max_blobs"`
	MaxBytesPerMinute int64 `json:"max_bytes_per_minute"`
	MaxBlobsPerMinute int64 `json:"max_blobs_per_minute"`
}

// errQuotaBody is the answer to a PUT body that is not a SetQuotaRequest.
var errQuotaBody = blobplane.Errorf(blobplane.CodeInvalid,
	`body must be JSON {"max_bytes": N, "max_blobs": M, "max_bytes_per_minute": R, "max_blobs_per_minute": S} (at least one positive; 0 or absent: no limit on that measure; the per-minute ones for a repository only)`)

// quotaRoutes mounts the quota routes on adminRoutes' group
// (authenticated, some admin grant) when d.Repositories is a QuotaAdmin.
// The path after /v1/admin/quotas/ names a repository (team/app) or a
// tenant (team/: every repository under it, together). Reading one needs
// admin on it (on every repository under a tenant); the list shows those
// the caller administers. Setting or clearing one needs admin on every
// repository (*:admin): a repository's or a tenant's own admin must not
// raise its quota.
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
		MaxBytesPerMinute: q.Limit.BytesPerMinute, MaxBlobsPerMinute: q.Limit.BlobsPerMinute, UsedBytes: q.Usage.Bytes, UsedBlobs: q.Usage.Blobs, SetBy: q.SetBy}
	if !q.SetAt.IsZero() {
		j.SetAt = &q.SetAt
	}
	return j
}

func tenantJSON(q store.TenantQuota) QuotaJSON {
	j := QuotaJSON{Tenant: q.Prefix, MaxBytes: q.Limit.Bytes, MaxBlobs: q.Limit.Blobs,
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
	ts, err := h.store.TenantQuotas(r.Context())
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	body := QuotasBody{Quotas: []QuotaJSON{}}
	for _, q := range ts {
		if policy.Governs(p, q.Prefix) {
			body.Quotas = append(body.Quotas, tenantJSON(q))
		}
	}
	for _, q := range qs {
		if p.Allowed(q.Repository, auth.Admin) {
			body.Quotas = append(body.Quotas, quotaJSON(q))
		}
	}
	WriteJSON(w, http.StatusOK, body)
}

// subject is the repository or tenant a quota route names (the rest of
// the path), once the caller may administer it (every repository under a
// tenant).
func (h quotaHandler) subject(w http.ResponseWriter, r *http.Request) (name string, tenant, ok bool) {
	name = chi.URLParam(r, "*")
	tenant = strings.HasSuffix(name, "/")
	check, allowed := auth.CheckRepository, func(p auth.Principal) bool { return p.Allowed(name, auth.Admin) }
	if tenant {
		check, allowed = store.CheckTenant, func(p auth.Principal) bool { return policy.Governs(p, name) }
	}
	if err := check(name); err != nil {
		WriteError(w, r, h.logger, err)
		return "", false, false
	}
	if p, _ := PrincipalOf(r.Context()); !allowed(p) {
		WriteAuthError(w, r, h.logger, &blobplane.Error{Code: blobplane.CodeForbidden, Message: "this token does not administer " + name})
		return "", false, false
	}
	noteRequest(r.Context(), func(n *requestNote) { n.repository = name })
	return name, tenant, true
}

func (h quotaHandler) get(w http.ResponseWriter, r *http.Request) {
	name, tenant, ok := h.subject(w, r)
	if !ok {
		return
	}
	if tenant {
		q, err := h.store.TenantQuota(r.Context(), name)
		if err != nil {
			WriteError(w, r, h.logger, err)
			return
		}
		WriteJSON(w, http.StatusOK, tenantJSON(q))
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
	name, tenant, ok := h.subject(w, r)
	if !ok {
		return
	}
	var req SetQuotaRequest
	if err := decodeStrict(w, r, 4<<10, &req, errQuotaBody); err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	p, _ := PrincipalOf(r.Context())
	limit := quota.Limit{Bytes: req.MaxBytes, Blobs: req.MaxBlobs, BytesPerMinute: req.MaxBytesPerMinute, BlobsPerMinute: req.MaxBlobsPerMinute}
	var j QuotaJSON
	applied := true
	if tenant {
		q, err := h.store.SetTenantQuota(r.Context(), name, limit, p.Name)
		if err != nil {
			WriteError(w, r, h.logger, err)
			return
		}
		j = tenantJSON(q) // in the ledger: applied when committed
	} else {
		q, err := h.store.SetRepositoryQuota(r.Context(), name, limit, p.Name)
		if err != nil {
			WriteError(w, r, h.logger, err)
			return
		}
		j, applied = quotaJSON(q), q.Applied
		if q.Position != "" {
			w.Header().Set(partstate.PositionHeader, q.Position) // ZBP-5-R107
		}
	}
	j.Applied = &applied
	h.logger.InfoContext(r.Context(), "quota set", "subject", name, "tenant", tenant, "max_bytes", req.MaxBytes, "max_blobs", req.MaxBlobs,
		"max_bytes_per_minute", req.MaxBytesPerMinute, "max_blobs_per_minute", req.MaxBlobsPerMinute, "principal", p.Name, "applied", applied)
	WriteJSON(w, http.StatusOK, j)
}

func (h quotaHandler) clear(w http.ResponseWriter, r *http.Request) {
	name, tenant, ok := h.subject(w, r)
	if !ok {
		return
	}
	applied, pos, err := true, "", error(nil)
	if tenant {
		err = h.store.ClearTenantQuota(r.Context(), name)
	} else {
		applied, pos, err = h.store.ClearRepositoryQuota(r.Context(), name)
	}
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	p, _ := PrincipalOf(r.Context())
	h.logger.InfoContext(r.Context(), "quota cleared", "subject", name, "tenant", tenant, "principal", p.Name, "applied", applied)
	if pos != "" {
		w.Header().Set(partstate.PositionHeader, pos) // ZBP-5-R107
	}
	w.WriteHeader(http.StatusNoContent)
}
