package sweep

import (
	"encoding/json"
	"fmt"

	"github.com/blobplane/blobplane/store"
)

// The ownership marker (issue 29, L1: "no cleanup deletes an object the
// database cannot vouch for being unowned; a backend attached to another
// or a restored database is left alone").
//
// The inventory deletes what nothing in Postgres accounts for, so
// pointed at a fresh or restored database it would take every object of
// the backend. Each backend therefore carries a marker
// (backend.Janitor), written by the first inventory pass that finds
// neither a marker nor a record of one, naming this database's identity
// (store.BackendRecord.Cluster), the datacenter, the backend's name and a
// pass number; the database keeps its own record of it. Every pass
// compares the two (Judge) before it deletes anything, then advances the
// record's pass and rewrites the marker with it: a database restored from
// before a pass finds the marker ahead of its record, and deletes
// nothing. Pure: no I/O here, tested cell by cell.

// Marker is the document stored on a backend.
type Marker struct {
	Format     int    `json:"format"`
	Cluster    string `json:"cluster"`
	Datacenter string `json:"datacenter"`
	Backend    string `json:"backend"`
	Pass       int64  `json:"pass"`
	Note       string `json:"note,omitempty"`
}

// markerFormat is the only format written and read.
const markerFormat = 1

const markerNote = "Written by Blobplane's inventory: this backend belongs to the database named by cluster. " +
	"Do not copy it to another backend or edit it; to hand the backend to another database, re-adopt it there."

// NewMarker is the marker of backend in datacenter for the record rec.
func NewMarker(rec store.BackendRecord, datacenter, backend string) Marker {
	return Marker{Format: markerFormat, Cluster: rec.Cluster, Datacenter: datacenter, Backend: backend, Pass: rec.Pass, Note: markerNote}
}

// Encode renders m as stored.
func (m Marker) Encode() []byte {
	b, _ := json.MarshalIndent(m, "", "  ") // plain fields: never fails
	return append(b, '\n')
}

// ParseMarker reads a stored marker.
func ParseMarker(data []byte) (Marker, error) {
	var m Marker
	if err := json.Unmarshal(data, &m); err != nil {
		return Marker{}, fmt.Errorf("marker: %w", err)
	}
	if m.Format != markerFormat || m.Cluster == "" || m.Datacenter == "" || m.Backend == "" || m.Pass < 1 {
		return Marker{}, fmt.Errorf("marker: format %d, cluster %q, datacenter %q, backend %q, pass %d: not a marker this version writes",
			m.Format, m.Cluster, m.Datacenter, m.Backend, m.Pass)
	}
	return m, nil
}

// Verdict is what Judge decides for one pass over one backend.
type Verdict struct {
	// Action is what the pass does about the marker before anything
	// else.
	Action MarkerAction
	// Refusal, when Action is Refuse, says why the pass deletes nothing.
	Refusal Refusal
}

// MarkerAction is what a pass does about the marker.
type MarkerAction string

const (
	// Adopt: neither a marker nor a record: claim the backend (record,
	// then marker), then proceed.
	Adopt MarkerAction = "adopt"
	// FinishAdoption: the record exists but the marker was never
	// confirmed (a pass stopped between the two): write the marker, then
	// proceed.
	FinishAdoption MarkerAction = "finish_adoption"
	// Advance: the marker agrees: advance the record's pass, rewrite the
	// marker, then proceed.
	Advance MarkerAction = "advance"
	// Refuse: delete nothing; report why.
	Refuse MarkerAction = "refuse"
)

// Refusal is why an inventory pass deletes nothing on a backend.
type Refusal string

const (
	// RefuseForeign: the marker names another database, datacenter or
	// backend, or this database has no record of writing it (restored
	// from before it adopted the backend).
	RefuseForeign Refusal = "marker_foreign"
	// RefuseMissing: the database wrote a marker there and it is gone
	// (the backend was replaced, wiped, or is another store).
	RefuseMissing Refusal = "marker_missing"
	// RefuseUnreadable: the marker is not one this version writes.
	RefuseUnreadable Refusal = "marker_unreadable"
	// RefuseBehind: the marker names a pass the database has not
	// reached: the database was restored from before that pass.
	RefuseBehind Refusal = "database_behind"
	// RefuseEmpty: the ledger knows no placement on the backend: the
	// database looks empty (fresh, or restored into the wrong place).
	RefuseEmpty Refusal = "database_empty"
)

// Refusals lists every refusal, for metrics.
var Refusals = []Refusal{RefuseForeign, RefuseMissing, RefuseUnreadable, RefuseBehind, RefuseEmpty}

// Judge decides, from the database's record and the backend's marker,
// what a pass over the backend named backend in datacenter may do.
// marker is nil when the backend has none; parseErr is ParseMarker's
// error for one that does not parse.
//
//	record \ marker      | none             | ours, pass <= record's | ours, pass > record's | another's     | unreadable
//	---------------------+------------------+------------------------+-----------------------+---------------+-----------
//	none                 | adopt            | foreign                | foreign               | foreign       | unreadable
//	adopted, unconfirmed | finish adoption  | finish adoption        | behind                | foreign       | unreadable
//	adopted, confirmed   | missing          | advance                | behind                | foreign       | unreadable
//
// "Ours" is a marker naming this database's identity, this datacenter and
// this backend. A pass that would proceed is refused anyway when the
// ledger knows no placement on the backend (empty).
func Judge(rec store.BackendRecord, marker *Marker, parseErr error, datacenter, backend string) Verdict {
	v := judgeMarker(rec, marker, parseErr, datacenter, backend)
	if v.Action != Refuse && !rec.HasPlacements {
		return Verdict{Action: Refuse, Refusal: RefuseEmpty}
	}
	return v
}

func judgeMarker(rec store.BackendRecord, marker *Marker, parseErr error, datacenter, backend string) Verdict {
	refuse := func(r Refusal) Verdict { return Verdict{Action: Refuse, Refusal: r} }
	switch {
	case parseErr != nil:
		return refuse(RefuseUnreadable)
	case marker == nil && !rec.Adopted:
		return Verdict{Action: Adopt}
	case marker == nil && !rec.MarkerWritten:
		return Verdict{Action: FinishAdoption}
	case marker == nil:
		return refuse(RefuseMissing)
	case !rec.Adopted || rec.Cluster == "" || marker.Cluster != rec.Cluster || marker.Datacenter != datacenter || marker.Backend != backend:
		return refuse(RefuseForeign)
	case marker.Pass > rec.Pass:
		return refuse(RefuseBehind)
	case !rec.MarkerWritten:
		return Verdict{Action: FinishAdoption}
	}
	return Verdict{Action: Advance}
}
