package handlers

import (
	"context"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
)

// PlacementRouter answers the routing query (spec blob-placement.md,
// "Routing categories"). store.Store implements it.
type PlacementRouter interface {
	// PlacementRouting returns d's placements split into routing categories
	// for a reader in datacenter. A digest without placements, or a ledger
	// not created yet, is a Routing with Known false, not an error. Errors:
	// invalid for a non-canonical digest or a bad datacenter label,
	// unavailable when the database cannot answer.
	PlacementRouting(ctx context.Context, d blobplane.Digest, datacenter string) (placement.Routing, error)
}

// PlacementsBody is the JSON answer of GET /v1/blobs/{digest}/placements.
// Every list is present (possibly empty).
type PlacementsBody struct {
	Digest         string          `json:"digest"`
	Datacenter     string          `json:"datacenter"`
	Known          bool            `json:"known"`     // the ledger has any placement of the digest
	Serveable      bool            `json:"serveable"` // some placement is verified (S2: only verified serves)
	Local          []PlacementJSON `json:"local"`
	VerifiedRemote []PlacementJSON `json:"verified_remote"`
	Pending        []PlacementJSON `json:"pending"`
	Failed         []PlacementJSON `json:"failed"`
	Revoked        []PlacementJSON `json:"revoked"`
}

// PlacementJSON is one placement in a PlacementsBody.
type PlacementJSON struct {
	Backend      string    `json:"backend"`
	Datacenter   string    `json:"datacenter"`
	Location     string    `json:"location"`
	State        string    `json:"state"`
	Reason       string    `json:"reason,omitempty"`        // failure reason, with state failed
	RevokeReason string    `json:"revoke_reason,omitempty"` // with state revoked
	Size         int64     `json:"size"`
	Epoch        int64     `json:"epoch"`
	Generation   int64     `json:"generation"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// placementsRoutes mounts the routing query. datacenter is this node's own
// label, the default when the query names none.
func placementsRoutes(r chi.Router, d Deps) {
	r.Get("/v1/blobs/{digest}/placements", func(w http.ResponseWriter, r *http.Request) {
		dg, err := blobplane.ParseDigest(chi.URLParam(r, "digest"))
		if err != nil {
			WriteError(w, r, d.Logger, err)
			return
		}
		dc := d.Datacenter
		if q := r.URL.Query(); q.Has("datacenter") {
			dc = q.Get("datacenter")
		}
		if !placement.ValidDatacenter(dc) {
			WriteError(w, r, d.Logger, blobplane.Errorf(blobplane.CodeInvalid, "datacenter %q: must be 1-63 lowercase letters, digits or dashes", dc))
			return
		}
		rt, err := d.Placements.PlacementRouting(r.Context(), dg, dc)
		if err != nil {
			WriteError(w, r, d.Logger, err)
			return
		}
		WriteJSON(w, http.StatusOK, placementsBody(rt))
	})
}

func placementsBody(rt placement.Routing) PlacementsBody {
	return PlacementsBody{
		Digest: string(rt.Digest), Datacenter: rt.Datacenter, Known: rt.Known, Serveable: rt.Serveable,
		Local: placementsJSON(rt.Local), VerifiedRemote: placementsJSON(rt.VerifiedRemote),
		Pending: placementsJSON(rt.Pending), Failed: placementsJSON(rt.Failed), Revoked: placementsJSON(rt.Revoked),
	}
}

func placementsJSON(ps []placement.Placement) []PlacementJSON {
	out := make([]PlacementJSON, len(ps))
	for i, p := range ps {
		out[i] = PlacementJSON{
			Backend: p.Backend, Datacenter: p.Datacenter, Location: p.Location, State: string(p.State),
			Reason: string(p.Reason), RevokeReason: string(p.RevokeReason),
			Size: p.Size, Epoch: p.Epoch, Generation: p.Generation, UpdatedAt: p.UpdatedAt.UTC(),
		}
	}
	return out
}
