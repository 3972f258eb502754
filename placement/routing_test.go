package placement_test

import (
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
)

func row(d blobplane.Digest, dc, loc string, s placement.State) placement.Placement {
	p := placement.Placement{Key: placement.Key{Digest: d, Backend: "filesystem", Datacenter: dc, Location: loc}, State: s}
	if s == placement.Failed {
		p.Reason = placement.SourceUnavailable
	}
	if s == placement.Revoked {
		p.RevokeReason = placement.Reclamation
	}
	return p
}

func locs(ps []placement.Placement) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Location)
	}
	return strings.Join(out, ",")
}

// Every routing category of the spec, one case each, plus the distinction
// between "known but not serveable" and "no placement at all".
func TestRouteCategories(t *testing.T) {
	t.Parallel()
	d := blobplane.Digest("sha256:" + strings.Repeat("1", 64))
	other := blobplane.Digest("sha256:" + strings.Repeat("2", 64))
	for _, c := range []struct {
		name                                    string
		rows                                    []placement.Placement
		local, remote, pending, failed, revoked string
		serveable, known                        bool
	}{
		{name: "no rows"},
		{name: "local verified", rows: []placement.Placement{row(d, "eu-1", "a", placement.Verified)}, local: "a", serveable: true, known: true},
		{name: "remote verified", rows: []placement.Placement{row(d, "us-1", "b", placement.Verified)}, remote: "b", serveable: true, known: true},
		{name: "only pending", rows: []placement.Placement{row(d, "eu-1", "c", placement.Pending)}, pending: "c", known: true},
		{name: "only failed", rows: []placement.Placement{row(d, "eu-1", "d", placement.Failed)}, failed: "d", known: true},
		{name: "only revoked", rows: []placement.Placement{row(d, "us-1", "e", placement.Revoked)}, revoked: "e", known: true},
		{name: "other digest ignored", rows: []placement.Placement{row(other, "eu-1", "z", placement.Verified)}},
		{
			name: "mixed",
			rows: []placement.Placement{
				row(d, "eu-1", "l1", placement.Verified), row(d, "us-1", "r1", placement.Verified),
				row(d, "eu-1", "p1", placement.Pending), row(d, "ap-1", "f1", placement.Failed),
				row(d, "eu-1", "x1", placement.Revoked), row(d, "eu-1", "l2", placement.Verified),
			},
			local: "l1,l2", remote: "r1", pending: "p1", failed: "f1", revoked: "x1", serveable: true, known: true,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := placement.Route(d, "eu-1", c.rows)
			if r.Digest != d || r.Datacenter != "eu-1" {
				t.Fatalf("identity: %+v", r)
			}
			if got := [5]string{locs(r.Local), locs(r.VerifiedRemote), locs(r.Pending), locs(r.Failed), locs(r.Revoked)}; got != [5]string{c.local, c.remote, c.pending, c.failed, c.revoked} {
				t.Fatalf("categories = %q", got)
			}
			if r.Serveable != c.serveable || r.Known != c.known {
				t.Fatalf("serveable=%v known=%v, want %v %v", r.Serveable, r.Known, c.serveable, c.known)
			}
			if r.Local == nil || r.VerifiedRemote == nil || r.Pending == nil || r.Failed == nil || r.Revoked == nil {
				t.Fatal("categories must be non-nil so JSON shows [] rather than null")
			}
		})
	}
}
