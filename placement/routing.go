package placement

import "github.com/blobplane/blobplane"

// Routing is the answer to the routing query for one digest, seen from one
// datacenter: the spec's routing categories. Every list is non-nil.
type Routing struct {
	Digest     blobplane.Digest
	Datacenter string // the querying node's datacenter

	Local          []Placement // verified in Datacenter: served without a network hop
	VerifiedRemote []Placement // verified in another datacenter: a peer can stream them
	Pending        []Placement // transfers still in flight
	Failed         []Placement // cannot serve until retried
	Revoked        []Placement // withdrawn from serving

	// Serveable: any verified placement, local or remote. Only verified
	// placements serve (DESIGN S2).
	Serveable bool
	// Known: the ledger has any row for the digest. A digest with only
	// pending or failed placements is known but not serveable, which a
	// router distinguishes from one with no placement at all.
	Known bool
}

// Route splits the placements of digest d into routing categories for a
// reader in datacenter. Rows of another digest are ignored; the order of
// rows within a category is kept.
func Route(d blobplane.Digest, datacenter string, rows []Placement) Routing {
	r := Routing{
		Digest: d, Datacenter: datacenter,
		Local: []Placement{}, VerifiedRemote: []Placement{}, Pending: []Placement{},
		Failed: []Placement{}, Revoked: []Placement{},
	}
	for _, p := range rows {
		if p.Digest != d {
			continue
		}
		r.Known = true
		switch p.State {
		case Verified:
			if p.Datacenter == datacenter {
				r.Local = append(r.Local, p)
			} else {
				r.VerifiedRemote = append(r.VerifiedRemote, p)
			}
		case Pending:
			r.Pending = append(r.Pending, p)
		case Failed:
			r.Failed = append(r.Failed, p)
		case Revoked:
			r.Revoked = append(r.Revoked, p)
		}
	}
	r.Serveable = len(r.Local) > 0 || len(r.VerifiedRemote) > 0
	return r
}
