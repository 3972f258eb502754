package client

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/blobplane/blobplane"
)

// The admin API (/v1/admin, docs/auth.md): tokens, grants and cluster
// operations need a *:admin grant; repositories need admin on each.

// Token is one token as admins see it: never its secret.
type Token struct {
	ID         string     `json:"id"`
	Principal  string     `json:"principal"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
	Grants     []string   `json:"grants"`
}

// Tokens lists tokens, of one principal when principal is not empty.
func (a *API) Tokens(ctx context.Context, principal string) ([]Token, error) {
	var body struct {
		Tokens []Token `json:"tokens"`
	}
	return body.Tokens, a.getJSON(ctx, "/v1/admin/tokens"+query("principal", principal), &body)
}

// NewToken is a token just created: Token is its secret, shown once.
type NewToken struct {
	ID        string   `json:"id"`
	Principal string   `json:"principal"`
	Grants    []string `json:"grants"`
	Token     string   `json:"token"`
}

// CreateToken issues a token for principal with grants
// ("team/*:write").
func (a *API) CreateToken(ctx context.Context, principal string, grants []string) (NewToken, error) {
	var t NewToken
	_, err := a.sendJSON(ctx, http.MethodPost, "/v1/admin/tokens", map[string]any{"principal": principal, "grants": grants}, &t, http.StatusCreated)
	return t, err
}

// RevokeToken revokes the token with id.
func (a *API) RevokeToken(ctx context.Context, id string) error {
	_, err := a.call(ctx, adminDelete("/v1/admin/tokens/"+url.PathEscape(id)), nil, http.StatusNoContent)
	return err
}

// PrincipalGrant is one grant a principal holds.
type PrincipalGrant struct {
	Principal string    `json:"principal"`
	Grant     string    `json:"grant"`
	CreatedAt time.Time `json:"created_at"`
}

// Grants lists grants, of one principal when principal is not empty.
func (a *API) Grants(ctx context.Context, principal string) ([]PrincipalGrant, error) {
	var body struct {
		Grants []PrincipalGrant `json:"grants"`
	}
	return body.Grants, a.getJSON(ctx, "/v1/admin/grants"+query("principal", principal), &body)
}

// AddGrants gives principal grants.
func (a *API) AddGrants(ctx context.Context, principal string, grants []string) error {
	_, err := a.sendJSON(ctx, http.MethodPost, "/v1/admin/grants", map[string]any{"principal": principal, "grants": grants}, nil, http.StatusOK, http.StatusCreated)
	return err
}

// RemoveGrants takes grants from principal.
func (a *API) RemoveGrants(ctx context.Context, principal string, grants []string) error {
	q := url.Values{"principal": {principal}, "grant": grants}
	_, err := a.call(ctx, adminDelete("/v1/admin/grants?"+q.Encode()), nil, http.StatusNoContent)
	return err
}

// Repository is one repository in admin answers.
type Repository struct {
	Name      string     `json:"name"`
	CreatedAt *time.Time `json:"created_at,omitempty"`
}

// Repositories lists the repositories the token administers.
func (a *API) Repositories(ctx context.Context) ([]Repository, error) {
	var body struct {
		Repositories []Repository `json:"repositories"`
	}
	return body.Repositories, a.getJSON(ctx, "/v1/admin/repositories", &body)
}

// CreateRepository creates name (idempotent).
func (a *API) CreateRepository(ctx context.Context, name string) error {
	_, err := a.sendJSON(ctx, http.MethodPost, "/v1/admin/repositories", map[string]string{"name": name}, nil, http.StatusCreated, http.StatusOK)
	return err
}

// DeleteRepository deletes name; refused while it references a blob or
// an upload into it is in flight.
func (a *API) DeleteRepository(ctx context.Context, name string) error {
	_, err := a.call(ctx, adminDelete("/v1/admin/repositories/"+name), nil, http.StatusNoContent)
	return err
}

// Obliterate marks d obliterated with reason (docs/obliteration.md):
// every reference is removed and its bytes deleted everywhere. The
// answer is the obliteration's status document.
func (a *API) Obliterate(ctx context.Context, d blobplane.Digest, reason string) (json.RawMessage, error) {
	var out json.RawMessage
	_, err := a.sendJSON(ctx, http.MethodPost, "/v1/admin/blobs/"+string(d)+"/obliterate", map[string]string{"reason": reason}, &out, http.StatusAccepted, http.StatusOK)
	return out, err
}

// ObliterationStatus is d's obliteration status document.
func (a *API) ObliterationStatus(ctx context.Context, d blobplane.Digest) (json.RawMessage, error) {
	var out json.RawMessage
	return out, a.getJSON(ctx, "/v1/admin/blobs/"+string(d)+"/obliterate", &out)
}

// Takeover forces partition's lease onto node (ZBP-5 R26–R28): the
// server records the token's principal as the operator, with reason.
// The answer is the new lease record.
func (a *API) Takeover(ctx context.Context, partition, node, endpoint, reason string) (json.RawMessage, error) {
	var out json.RawMessage
	in := map[string]string{"node": node, "reason": reason}
	if endpoint != "" {
		in["endpoint"] = endpoint
	}
	_, err := a.sendJSON(ctx, http.MethodPost, "/v1/admin/partitions/"+url.PathEscape(partition)+"/takeover", in, &out, http.StatusOK)
	return out, err
}

// Plan is the controller's current plan, as `controller plan --json`
// prints it.
func (a *API) Plan(ctx context.Context) (json.RawMessage, error) {
	var out json.RawMessage
	return out, a.getJSON(ctx, "/v1/admin/plan", &out)
}

// ApplyRequest is a queued request for the controller to apply its plan.
type ApplyRequest struct {
	RequestID int64 `json:"request_id"`
	Taken     bool  `json:"taken"`
	PlanID    int64 `json:"plan_id"`
}

// ApplyPlan asks the running controller to apply its plan (R119: a
// reason allows a plan past the move bound, recorded with the
// principal).
func (a *API) ApplyPlan(ctx context.Context, overrideReason string) (ApplyRequest, error) {
	var out ApplyRequest
	in := map[string]string{}
	if overrideReason != "" {
		in["override_reason"] = overrideReason
	}
	_, err := a.sendJSON(ctx, http.MethodPost, "/v1/admin/plan/apply", in, &out, http.StatusAccepted)
	return out, err
}

// ApplyRequestState is where a queued apply request stands.
func (a *API) ApplyRequestState(ctx context.Context, id int64) (ApplyRequest, error) {
	var out ApplyRequest
	return out, a.getJSON(ctx, "/v1/admin/plan/apply/"+strconv.FormatInt(id, 10), &out)
}

// adminDelete is a DELETE of ref: with a JSON content type and no body,
// as every write under /v1/admin must be (its cross-site guard, docs/auth.md).
func adminDelete(ref string) request {
	return request{method: http.MethodDelete, ref: ref, header: http.Header{"Content-Type": {"application/json"}},
		body: func() (io.Reader, int64) { return http.NoBody, 0 }}
}

// query is "?k=v", or "" when v is empty.
func query(k, v string) string {
	if v == "" {
		return ""
	}
	return "?" + url.QueryEscape(k) + "=" + url.QueryEscape(v)
}

// Quota is a repository's quota and usage, or a tenant's (a prefix
// ending in /: its repositories together) (docs/quotas.md). A zero max
// sets no limit on that measure.
type Quota struct {
	Repository string `json:"repository,omitempty"`
	Tenant     string `json:"tenant,omitempty"`
	QuotaLimit
	UsedBytes int64      `json:"used_bytes"`
	UsedBlobs int64      `json:"used_blobs"`
	SetBy     string     `json:"set_by,omitempty"`
	SetAt     *time.Time `json:"set_at,omitempty"`
}

// QuotaLimit is a quota's limits; 0 sets none on that measure. The
// per-minute ones bound a repository's upload rate (none for a tenant).
type QuotaLimit struct {
	MaxBytes          int64 `json:"max_bytes"`
	MaxBlobs          int64 `json:"max_blobs"`
	MaxBytesPerMinute int64 `json:"max_bytes_per_minute,omitempty"`
	MaxBlobsPerMinute int64 `json:"max_blobs_per_minute,omitempty"`
}

// Quotas lists the quotas of the repositories the token administers.
func (a *API) Quotas(ctx context.Context) ([]Quota, error) {
	var body struct {
		Quotas []Quota `json:"quotas"`
	}
	return body.Quotas, a.getJSON(ctx, "/v1/admin/quotas", &body)
}

// RepositoryQuota is repo's quota and usage (admin on repo); repo may be
// a tenant, a prefix ending in /.
func (a *API) RepositoryQuota(ctx context.Context, repo string) (Quota, error) {
	var q Quota
	return q, a.getJSON(ctx, "/v1/admin/quotas/"+repo, &q)
}

// SetQuota sets repo's quota (*:admin): at least one limit positive.
func (a *API) SetQuota(ctx context.Context, repo string, limit QuotaLimit) (Quota, error) {
	var q Quota
	_, err := a.sendJSON(ctx, http.MethodPut, "/v1/admin/quotas/"+repo, limit, &q, http.StatusOK)
	return q, err
}

// ClearQuota removes repo's quota (*:admin).
func (a *API) ClearQuota(ctx context.Context, repo string) error {
	_, err := a.call(ctx, adminDelete("/v1/admin/quotas/"+repo), nil, http.StatusNoContent)
	return err
}
