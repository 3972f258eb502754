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
	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/store"
)

// ObliterationAdmin is the store behind /v1/admin/blobs/{digest}/obliterate
// (docs/obliteration.md). store.Store implements it; the routes are
// mounted when Deps.Repositories implements it too.
type ObliterationAdmin interface {
	// Obliterate takes the mark of d for principal with reason, removes
	// every reference and enqueues the obliterate job, in one
	// transaction; marked is false when d was obliterated already
	// (nothing new recorded). Errors: invalid, not_found (d was never
	// published), unavailable.
	Obliterate(ctx context.Context, d blobplane.Digest, principal, reason string) (st store.ObliterationStatus, marked bool, err error)
	// Unmark lifts the mark. Errors: invalid, not_found (d is not
	// obliterated), unavailable.
	Unmark(ctx context.Context, d blobplane.Digest, principal, reason string) (store.ObliterationStatus, error)
	// ObliterationStatus is d's state, current mark, what is left to
	// remove and audit history. Errors: invalid, not_found, unavailable.
	ObliterationStatus(ctx context.Context, d blobplane.Digest) (store.ObliterationStatus, error)
}

var _ ObliterationAdmin = (*store.Store)(nil)

// ObliterationRequest is the body of POST and DELETE
// /v1/admin/blobs/{digest}/obliterate: why (1 to 1024 bytes).
type ObliterationRequest struct {
	Reason string `json:"reason"`
}

// ObliterationJSON is one audit row in admin answers.
type ObliterationJSON struct {
	ID         int64      `json:"id"`
	Action     string     `json:"action"`
	Principal  string     `json:"principal"`
	Reason     string     `json:"reason"`
	At         time.Time  `json:"at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// ObliterationLeftJSON is what an obliteration still has to remove.
type ObliterationLeftJSON struct {
	References     int64 `json:"references"`
	PendingUploads int64 `json:"pending_uploads"`
	Placements     int64 `json:"placements"`
	OwedDeletions  int64 `json:"owed_deletions"`
}

// ObliterationStatusJSON is the answer of every
// /v1/admin/blobs/{digest}/obliterate route.
type ObliterationStatusJSON struct {
	Digest string `json:"digest"`
	// State is the blob state row's: live, collected or obliterated.
	State       string `json:"state"`
	Obliterated bool   `json:"obliterated"`
	// Mark is the current mark while obliterated.
	Mark    *ObliterationJSON    `json:"mark,omitempty"`
	Left    ObliterationLeftJSON `json:"left"`
	History []ObliterationJSON   `json:"history"`
}

// maxObliterationBody bounds a request body: a reason of
// store.MaxObliterationReason bytes, every one JSON-escaped.
const maxObliterationBody = 8 << 10

// errObliterationBody is the answer to a body that is not an
// ObliterationRequest.
var errObliterationBody = blobplane.Errorf(blobplane.CodeInvalid, `body must be JSON {"reason": "why"} (1 to %d bytes)`, store.MaxObliterationReason)

// obliterationRoutes mounts POST (obliterate), DELETE (unmark) and GET
// (status and history) of /v1/admin/blobs/{digest}/obliterate on
// adminRoutes' group when d.Repositories is an ObliterationAdmin. An
// obliteration reaches every repository, so every route needs admin on
// all of them (*:admin), checked before anything is read or parsed: any
// other caller learns nothing, not even whether the digest is valid.
func obliterationRoutes(r chi.Router, d Deps) {
	oa, ok := d.Repositories.(ObliterationAdmin)
	if !ok {
		return
	}
	h := obliterationHandler{store: oa, logger: d.Logger, total: obliterationsTotal(d.Metrics)}
	r.Route("/blobs/{digest}/obliterate", func(r chi.Router) {
		r.Use(requireGlobalAdmin)
		r.Post("/", h.obliterate)
		r.Delete("/", h.unmark)
		r.Get("/", h.status)
	})
}

// obliterationsTotal is blobplane_obliterations_total{action} on m's
// registry (the one registered before, when another router shares m).
func obliterationsTotal(m *Metrics) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "blobplane_obliterations_total",
		Help: "Obliteration marks taken (action obliterate) and lifted (action unmark) through this api's admin API.",
	}, []string{"action"})
	if m == nil {
		return c
	}
	if err := m.Registry.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing
			}
		}
		return c
	}
	for _, a := range []store.ObliterationAction{store.ActionObliterate, store.ActionUnmark} {
		c.WithLabelValues(string(a)) // both series from the start, at 0
	}
	return c
}

type obliterationHandler struct {
	store  ObliterationAdmin
	logger *slog.Logger
	total  *prometheus.CounterVec
}

// obliterate is POST: 202 with the new mark (its job finishes the rest),
// 200 when the digest was obliterated already.
func (h obliterationHandler) obliterate(w http.ResponseWriter, r *http.Request) {
	d, reason, ok := h.request(w, r)
	if !ok {
		return
	}
	p, _ := PrincipalOf(r.Context())
	st, marked, err := h.store.Obliterate(r.Context(), d, p.Name, reason)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	status := http.StatusOK
	if marked {
		status = http.StatusAccepted
		h.total.WithLabelValues(string(store.ActionObliterate)).Inc()
		h.logger.InfoContext(r.Context(), "blob obliterated", "digest", d, "principal", p.Name)
	}
	WriteJSON(w, status, obliterationStatusJSON(st))
}

// unmark is DELETE: 200 with the digest's state after the mark.
func (h obliterationHandler) unmark(w http.ResponseWriter, r *http.Request) {
	d, reason, ok := h.request(w, r)
	if !ok {
		return
	}
	p, _ := PrincipalOf(r.Context())
	st, err := h.store.Unmark(r.Context(), d, p.Name, reason)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	h.total.WithLabelValues(string(store.ActionUnmark)).Inc()
	h.logger.InfoContext(r.Context(), "blob obliteration lifted", "digest", d, "principal", p.Name, "state", st.State)
	WriteJSON(w, http.StatusOK, obliterationStatusJSON(st))
}

// status is GET: the current mark, what is left and the audit history.
func (h obliterationHandler) status(w http.ResponseWriter, r *http.Request) {
	d, err := blobplane.ParseDigest(chi.URLParam(r, "digest"))
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	st, err := h.store.ObliterationStatus(r.Context(), d)
	if err != nil {
		WriteError(w, r, h.logger, err)
		return
	}
	WriteJSON(w, http.StatusOK, obliterationStatusJSON(st))
}

// request parses a POST's or DELETE's digest and reason; otherwise it
// answers 400 and returns false.
func (h obliterationHandler) request(w http.ResponseWriter, r *http.Request) (blobplane.Digest, string, bool) {
	d, err := blobplane.ParseDigest(chi.URLParam(r, "digest"))
	if err == nil {
		var req ObliterationRequest
		if req, err = decodeObliteration(w, r); err == nil {
			if err = store.CheckObliterationReason(req.Reason); err == nil {
				return d, req.Reason, true
			}
		}
	}
	WriteError(w, r, h.logger, err)
	return "", "", false
}

// decodeObliteration reads an ObliterationRequest: one JSON object, no
// unknown field, at most maxObliterationBody bytes.
func decodeObliteration(w http.ResponseWriter, r *http.Request) (ObliterationRequest, error) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxObliterationBody))
	dec.DisallowUnknownFields()
	var req ObliterationRequest
	if err := dec.Decode(&req); err != nil {
		return ObliterationRequest{}, blobplane.Wrap(blobplane.CodeInvalid, err, "%s", errObliterationBody.Message)
	}
	if err := dec.Decode(new(json.RawMessage)); !errors.Is(err, io.EOF) {
		return ObliterationRequest{}, errObliterationBody
	}
	return req, nil
}

func obliterationStatusJSON(st store.ObliterationStatus) ObliterationStatusJSON {
	out := ObliterationStatusJSON{
		Digest: string(st.Digest), State: st.State, Obliterated: st.State == "obliterated",
		Left: ObliterationLeftJSON{References: st.Left.References, PendingUploads: st.Left.PendingUploads,
			Placements: st.Left.Placements, OwedDeletions: st.Left.OwedDeletions},
		History: []ObliterationJSON{},
	}
	for _, o := range st.History {
		out.History = append(out.History, obliterationJSON(o))
	}
	if st.Mark != nil {
		m := obliterationJSON(*st.Mark)
		out.Mark = &m
	}
	return out
}

func obliterationJSON(o store.Obliteration) ObliterationJSON {
	out := ObliterationJSON{ID: o.ID, Action: string(o.Action), Principal: o.Principal, Reason: o.Reason, At: o.At}
	if !o.FinishedAt.IsZero() {
		out.FinishedAt = &o.FinishedAt
	}
	return out
}
