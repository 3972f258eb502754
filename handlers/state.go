package handlers

import (
	"errors"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/upload"
)

// GET /v1/admin/state/<repository> (issue 33, docs/quotas.md "Reading a
// repository's state"): what the repository's partition state holds of
// it — usage, quota, what it published in its rate window — and the
// position it was read at (X-Partition-Position).
//
// At the repository's home the read follows a catch-up that started after
// the request (it sees every commit before it). At a standby of its
// partition the read is served only when the request states a staleness
// bound (ZBP-5 R65: Blobplane-Max-Staleness, a Go duration such as 5s)
// and the standby applied everything its journal had sequenced within
// it; the answer says Blobplane-Served-By: standby. Anywhere else, or
// without the bound, the routing contract answers as for any request that
// must run at the home (421 with where it is).

// MaxStalenessHeader states the staleness a read accepts from a standby
// (ZBP-5 R65); ServedByHeader says who served it (primary or standby).
const (
	MaxStalenessHeader = "Blobplane-Max-Staleness"
	ServedByHeader     = "Blobplane-Served-By"
)

// maxStaleness bounds what a request may state: a standby caught up an
// hour ago is not a replica anyone should read.
const maxStaleness = time.Hour

// PartitionState is what serves repository state reads: this node's homes
// and standbys.
type PartitionState struct {
	Homes    *partstate.Homes
	Standbys *partstate.Standbys
}

// StateJSON is the answer of GET /v1/admin/state/<repository>.
type StateJSON struct {
	Repository string `json:"repository"`
	Partition  string `json:"partition"`
	// ServedBy is primary or standby; Position the state's position
	// (also X-Partition-Position); StalenessMS, from a standby, how long
	// ago it last applied everything sequenced.
	ServedBy          string `json:"served_by"`
	Position          string `json:"position"`
	StalenessMS       *int64 `json:"staleness_ms,omitempty"`
	UsedBytes         int64  `json:"used_bytes"`
	UsedBlobs         int64  `json:"used_blobs"`
	MaxBytes          int64  `json:"max_bytes"`
	MaxBlobs          int64  `json:"max_blobs"`
	MaxBytesPerMinute int64  `json:"max_bytes_per_minute,omitempty"`
	MaxBlobsPerMinute int64  `json:"max_blobs_per_minute,omitempty"`
	// PublishedBytes and PublishedBlobs are what it published in the
	// last minute, as its upload rate counts (0 without a rate).
	PublishedBytes int64 `json:"published_bytes_last_minute"`
	PublishedBlobs int64 `json:"published_blobs_last_minute"`
}

func stateJSON(repo, servedBy string, v partstate.View, pos partstate.Position) StateJSON {
	return StateJSON{Repository: repo, Partition: pos.Partition, ServedBy: servedBy, Position: pos.String(),
		UsedBytes: v.Usage.Bytes, UsedBlobs: v.Usage.Blobs, MaxBytes: v.Limit.Bytes, MaxBlobs: v.Limit.Blobs,
		MaxBytesPerMinute: v.Limit.BytesPerMinute, MaxBlobsPerMinute: v.Limit.BlobsPerMinute,
		PublishedBytes: v.Published.Bytes, PublishedBlobs: v.Published.Blobs}
}

// stateRoutes mounts the state read on adminRoutes' group (authenticated)
// when the node holds partition state and routes by the map. Reading
// needs admin on the repository, as its quota does.
func stateRoutes(r chi.Router, d Deps) {
	if d.State == nil || d.State.Homes == nil || d.Authority == nil {
		return
	}
	s := stateHandler{d: d}
	atHome := d.Authority.RequireHome(func(r *http.Request) string { return chi.URLParam(r, "*") })(http.HandlerFunc(s.primary))
	r.Get("/state/*", func(w http.ResponseWriter, r *http.Request) {
		repo := chi.URLParam(r, "*")
		if err := auth.CheckRepository(repo); err != nil {
			WriteError(w, r, d.Logger, err)
			return
		}
		if p, _ := PrincipalOf(r.Context()); !p.Allowed(repo, auth.Admin) {
			WriteAuthError(w, r, d.Logger, &blobplane.Error{Code: blobplane.CodeForbidden, Message: "this token does not administer " + repo})
			return
		}
		noteRequest(r.Context(), func(n *requestNote) { n.repository = repo })
		if v := r.Header.Get(MaxStalenessHeader); v != "" {
			bound, err := time.ParseDuration(v)
			if err != nil || bound <= 0 || bound > maxStaleness {
				WriteError(w, r, d.Logger, blobplane.Errorf(blobplane.CodeInvalid, "%s %q: want a duration such as 5s, above 0 and at most %s", MaxStalenessHeader, v, maxStaleness))
				return
			}
			if s.standby(w, r, repo, bound) {
				return
			}
		}
		atHome.ServeHTTP(w, r)
	})
}

type stateHandler struct{ d Deps }

// standby serves the read from this node's standby of repo's partition
// under bound, and reports whether it answered (false: this node is not
// its standby, so the home answers).
func (s stateHandler) standby(w http.ResponseWriter, r *http.Request, repo string, bound time.Duration) bool {
	if s.d.State.Standbys == nil {
		return false
	}
	vm := s.d.Authority.Keeper.Map()
	if vm == nil {
		return false
	}
	res, err := vm.ResolveKey(repo)
	if err != nil {
		return false
	}
	read, err := s.d.State.Standbys.Read(res.Partition.ID, repo, bound)
	if errors.Is(err, partstate.ErrNotStandby) {
		return false
	}
	if err != nil {
		w.Header().Set("Retry-After", "1")
		WriteError(w, r, s.d.Logger, err)
		return true
	}
	out := stateJSON(repo, "standby", read.View, read.Position)
	age := read.Age.Milliseconds()
	out.StalenessMS = &age
	w.Header().Set(partstate.PositionHeader, read.Position.String()) // ZBP-5 R65: the position served at
	w.Header().Set(ServedByHeader, "standby")
	WriteJSON(w, http.StatusOK, out)
	return true
}

// primary serves the read at the repository's home (RequireHome ran).
func (s stateHandler) primary(w http.ResponseWriter, r *http.Request) {
	repo := chi.URLParam(r, "*")
	h, _ := HomeOf(r.Context())
	v, pos, err := s.d.State.Homes.View(r.Context(), upload.Home{Partition: h.Partition, Node: s.d.NodeID, Epoch: h.Epoch}, repo)
	if err != nil {
		WriteError(w, r, s.d.Logger, err)
		return
	}
	w.Header().Set(partstate.PositionHeader, pos.String())
	w.Header().Set(ServedByHeader, "primary")
	WriteJSON(w, http.StatusOK, stateJSON(repo, "primary", v, pos))
}
