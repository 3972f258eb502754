package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
)

// ClusterAdmin is the controller behind /v1/admin/partitions/{p}/takeover,
// /v1/admin/plan and /v1/admin/plan/apply (ZBP-5 A.8, R26–R28, R118,
// R119). controller.Admin implements it; Deps.Cluster nil leaves the
// routes unmounted.
type ClusterAdmin interface {
	// Takeover forces partition's lease onto node at the next epoch,
	// fencing its owner (R26, R27), with operator and reason recorded
	// on the lease (R28); endpoint "" means node's registered one.
	// Errors: invalid for a missing field or a node without a registered
	// endpoint; not_found for a partition in no map and without a lease.
	Takeover(ctx context.Context, partition, node, endpoint, operator, reason string) (authority.LeaseRecord, error)
	// PlanJSON is the plan a controller round would compute now, as
	// `controller plan --json` prints it. It changes nothing.
	PlanJSON(ctx context.Context) (json.RawMessage, error)
	// RequestApply queues a request that the running controller service
	// apply every plan kind in its next round (R118), recorded as by; a
	// non-empty overrideReason lets that plan move past the movement
	// cap (R119). It returns the request's id. Errors: unavailable when
	// no controller service runs to take it.
	RequestApply(ctx context.Context, by, overrideReason string) (int64, error)
	// ApplyRequestState says whether apply request id was taken, and the
	// plan its round recorded (0: none). Errors: not_found for an
	// unknown id.
	ApplyRequestState(ctx context.Context, id int64) (taken bool, plan int64, err error)
}

// TakeoverRequest is the body of POST
// /v1/admin/partitions/{partition}/takeover. There is no operator field:
// the operator recorded is the authenticated principal (ZBP-5 R28).
type TakeoverRequest struct {
	Node string `json:"node"`
	// Endpoint is the node's host:port; "" takes its registered one.
	Endpoint string `json:"endpoint,omitempty"`
	Reason   string `json:"reason"`
}

// ApplyPlanRequest is the body of POST /v1/admin/plan/apply (optional:
// an empty body is no override).
type ApplyPlanRequest struct {
	// OverrideReason lets the plan move more slots than the movement cap
	// allows, recorded with the caller as its author (ZBP-5 R119).
	OverrideReason string `json:"override_reason,omitempty"`
}

// ApplyQueuedJSON is the answer of POST /v1/admin/plan/apply (202, with
// Location: /v1/admin/plan/apply/{request_id}).
type ApplyQueuedJSON struct {
	RequestID int64 `json:"request_id"`
}

// ApplyStateJSON is the answer of GET /v1/admin/plan/apply/{id}.
type ApplyStateJSON struct {
	RequestID int64 `json:"request_id"`
	// Taken: a controller round took the request; PlanID is the plan it
	// recorded (0: it had nothing to start, or it is not taken yet).
	Taken  bool  `json:"taken"`
	PlanID int64 `json:"plan_id"`
}

// maxClusterBody bounds a takeover's or an apply's body.
const maxClusterBody = 8 << 10

var (
	errTakeoverBody = blobplane.Errorf(blobplane.CodeInvalid, `body must be JSON {"node": "n2", "reason": "why", "endpoint": "host:port" (optional)}; node and reason are required (ZBP-5 R28: a force-takeover records who and why)`)
	errApplyBody    = blobplane.Errorf(blobplane.CodeInvalid, `body must be empty or JSON {"override_reason": "why"}`)
)

// clusterRoutes mounts the takeover, plan and apply routes on
// adminRoutes' group when d.Cluster is set, behind admin on every
// repository: they act on the whole cluster.
func clusterRoutes(r chi.Router, d Deps) {
	if d.Cluster == nil {
		return
	}
	h := clusterHandler{cluster: d.Cluster, logger: d.Logger}
	r.Group(func(r chi.Router) {
		r.Use(requireGlobalAdmin)
		r.Post("/partitions/{partition}/takeover", h.takeover)
		r.Get("/plan", h.plan)
		r.Post("/plan/apply", h.apply)
		r.Get("/plan/apply/{id}", h.applyState)
	})
}

type clusterHandler struct {
	cluster ClusterAdmin
	logger  *slog.Logger
}

// takeover is POST: 200 with the lease record as it now stands.
func (h clusterHandler) takeover(w http.ResponseWriter, r *http.Request) {
	// Fields the body should not carry (an "operator", a "taken_by") are
	// ignored, never read: see below.
	var req TakeoverRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxClusterBody)).Decode(&req); err != nil {
		WriteError(w, r, h.logger, blobplane.Wrap(blobplane.CodeInvalid, err, "%s", errTakeoverBody.Message))
		return
	}
	if req.Node == "" || req.Reason == "" {
		WriteError(w, r, h.logger, errTakeoverBody)
		return
	}
	// ZBP-5 R28: a force-takeover records who and why; who is the
	// authenticated principal, never a name the client supplies.
	p, _ := PrincipalOf(r.Context())
	rec, err := h.cluster.Takeover(r.Context(), chi.URLParam(r, "partition"), req.Node, req.Endpoint, p.Name, req.Reason)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	h.logger.WarnContext(r.Context(), "lease force-takeover", "partition", rec.Partition, "epoch", rec.Epoch, "node", rec.OwnerNode,
		"operator", rec.TakenBy, "reason", rec.TakenReason, "principal", p.Name)
	WriteJSON(w, http.StatusOK, rec)
}

// plan is GET: the dry-run plan.
func (h clusterHandler) plan(w http.ResponseWriter, r *http.Request) {
	doc, err := h.cluster.PlanJSON(r.Context())
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	WriteJSON(w, http.StatusOK, doc)
}

// apply is POST: 202 with the queued request's id, and its Location.
func (h clusterHandler) apply(w http.ResponseWriter, r *http.Request) {
	var req ApplyPlanRequest
	if err := decodeStrict(w, r, maxClusterBody, &req, errApplyBody); err != nil && !errors.Is(err, io.EOF) {
		WriteError(w, r, h.logger, err)
		return
	}
	p, _ := PrincipalOf(r.Context())
	// ZBP-5 R119: an override records who and why; who is the caller.
	id, err := h.cluster.RequestApply(r.Context(), "api by "+p.Name, req.OverrideReason)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	h.logger.InfoContext(r.Context(), "controller apply requested", "request_id", id, "override_reason", req.OverrideReason, "principal", p.Name)
	w.Header().Set("Location", "/v1/admin/plan/apply/"+strconv.FormatInt(id, 10))
	WriteJSON(w, http.StatusAccepted, ApplyQueuedJSON{RequestID: id})
}

// applyState is GET /plan/apply/{id}: whether a round took the request.
func (h clusterHandler) applyState(w http.ResponseWriter, r *http.Request) {
	raw := chi.URLParam(r, "id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 {
		WriteError(w, r, h.logger, blobplane.Errorf(blobplane.CodeNotFound, "no apply request %q", truncated(raw)))
		return
	}
	taken, plan, err := h.cluster.ApplyRequestState(r.Context(), id)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	WriteJSON(w, http.StatusOK, ApplyStateJSON{RequestID: id, Taken: taken, PlanID: plan})
}

// truncated is s cut to 64 bytes for a message.
func truncated(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
