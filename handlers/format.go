package handlers

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/store"
)

// FormatAdmin is the store behind /v1/admin/cluster/format (ZBP-5 R44,
// R88; docs/quotas.md "Format levels"). store.Store implements it; the
// routes are mounted when Deps.Repositories implements it too.
type FormatAdmin interface {
	// ClusterFormat is the cluster's format level and what each node's
	// running process reads.
	ClusterFormat(ctx context.Context) (store.ClusterFormat, error)
	// RaiseFormatLevel is finalize: it raises the level to `to` as by and
	// returns it before and after. Errors: invalid (a level this build
	// does not know), conflict (a live node reads less: a
	// *store.NodesBehindError rides along).
	RaiseFormatLevel(ctx context.Context, to int, by string) (before, after int, err error)
}

// ClusterFormatJSON is the answer of GET /v1/admin/cluster/format.
type ClusterFormatJSON struct {
	Level    int               `json:"level"`
	RaisedBy string            `json:"raised_by,omitempty"`
	RaisedAt *time.Time        `json:"raised_at,omitempty"`
	Nodes    []FormatNodeJSON  `json:"nodes"`
	Raised   *FormatRaisedJSON `json:"raised,omitempty"`
}

// FormatNodeJSON is one registered node: the level its running process
// reads (1: it reported none, an older build) and whether finalize counts
// it as running.
type FormatNodeJSON struct {
	Node        string `json:"node"`
	Role        string `json:"role"`
	ReadsFormat int    `json:"reads_format"`
	Live        bool   `json:"live"`
}

// FormatRaisedJSON, in a POST's answer, is the level before and after.
type FormatRaisedJSON struct {
	From int `json:"from"`
	To   int `json:"to"`
}

// RaiseFormatRequest is the body of POST /v1/admin/cluster/format.
type RaiseFormatRequest struct {
	Level int `json:"level"`
}

var errFormatBody = blobplane.Errorf(blobplane.CodeInvalid, `body must be JSON {"level": 2}`)

// formatRoutes mounts GET and POST /cluster/format on adminRoutes' group
// when d.Repositories is a FormatAdmin, behind admin on every repository:
// the level is the whole cluster's.
func formatRoutes(r chi.Router, d Deps) {
	fa, ok := d.Repositories.(FormatAdmin)
	if !ok {
		return
	}
	h := formatHandler{store: fa, logger: d.Logger}
	r.With(requireGlobalAdmin).Get("/cluster/format", h.get)
	r.With(requireGlobalAdmin).Post("/cluster/format", h.raise)
}

type formatHandler struct {
	store  FormatAdmin
	logger *slog.Logger
}

func (h formatHandler) view(ctx context.Context) (ClusterFormatJSON, error) {
	cf, err := h.store.ClusterFormat(ctx)
	if err != nil {
		return ClusterFormatJSON{}, err
	}
	out := ClusterFormatJSON{Level: cf.Level, RaisedBy: cf.RaisedBy, Nodes: make([]FormatNodeJSON, len(cf.Nodes))}
	if !cf.RaisedAt.IsZero() {
		out.RaisedAt = &cf.RaisedAt
	}
	for i, n := range cf.Nodes {
		out.Nodes[i] = FormatNodeJSON{Node: n.ID, Role: n.Role, ReadsFormat: n.Reading(), Live: n.Live()}
	}
	return out, nil
}

// get is GET: the level and every node's.
func (h formatHandler) get(w http.ResponseWriter, r *http.Request) {
	out, err := h.view(r.Context())
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	WriteJSON(w, http.StatusOK, out)
}

// raise is POST: finalize. 200 with the level before and after; 409 with
// the error naming the live nodes that read less.
func (h formatHandler) raise(w http.ResponseWriter, r *http.Request) {
	var req RaiseFormatRequest
	if err := decodeStrict(w, r, maxClusterBody, &req, errFormatBody); err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	p, _ := PrincipalOf(r.Context())
	before, after, err := h.store.RaiseFormatLevel(r.Context(), req.Level, "api by "+p.Name)
	if err != nil {
		var behind *store.NodesBehindError
		if errors.As(err, &behind) {
			h.logger.WarnContext(r.Context(), "cluster format finalize refused", "level", req.Level, "behind", len(behind.Nodes), "principal", p.Name)
		}
		WriteError(w, r, h.logger, err)
		return
	}
	if after != before {
		h.logger.WarnContext(r.Context(), "cluster format level raised", "from", before, "to", after, "principal", p.Name)
	}
	out, err := h.view(r.Context())
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	out.Raised = &FormatRaisedJSON{From: before, To: after}
	WriteJSON(w, http.StatusOK, out)
}
