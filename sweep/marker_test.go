package sweep_test

import (
	"errors"
	"testing"

	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/sweep"
)

// Judge's table (marker.go), cell by cell: what a pass over backend "fs"
// of eu-1 does for each record and marker.
func TestJudgeTable(t *testing.T) {
	t.Parallel()
	const us = "11111111-2222-3333-4444-555555555555"
	none := store.BackendRecord{Cluster: us, HasPlacements: true}
	unconfirmed := store.BackendRecord{Cluster: us, Adopted: true, Pass: 3, HasPlacements: true}
	confirmed := store.BackendRecord{Cluster: us, Adopted: true, Pass: 3, MarkerWritten: true, HasPlacements: true}
	ours := func(pass int64) *sweep.Marker {
		return &sweep.Marker{Format: 1, Cluster: us, Datacenter: "eu-1", Backend: "fs", Pass: pass}
	}
	other := func(edit func(*sweep.Marker)) *sweep.Marker { m := ours(1); edit(m); return m }
	unreadable := errors.New("marker: not json")
	adopt := sweep.Verdict{Action: sweep.Adopt}
	finish := sweep.Verdict{Action: sweep.FinishAdoption}
	advance := sweep.Verdict{Action: sweep.Advance}
	refuse := func(r sweep.Refusal) sweep.Verdict { return sweep.Verdict{Action: sweep.Refuse, Refusal: r} }
	cases := []struct {
		name   string
		rec    store.BackendRecord
		marker *sweep.Marker
		err    error
		want   sweep.Verdict
	}{
		{"no record, no marker", none, nil, nil, adopt},
		{"no record, our marker", none, ours(1), nil, refuse(sweep.RefuseForeign)},
		{"no record, marker ahead", none, ours(9), nil, refuse(sweep.RefuseForeign)},
		{"no record, another's marker", none, other(func(m *sweep.Marker) { m.Cluster = "another" }), nil, refuse(sweep.RefuseForeign)},
		{"no record, unreadable", none, nil, unreadable, refuse(sweep.RefuseUnreadable)},
		{"unconfirmed, no marker", unconfirmed, nil, nil, finish},
		{"unconfirmed, our marker", unconfirmed, ours(3), nil, finish},
		{"unconfirmed, our older marker", unconfirmed, ours(1), nil, finish},
		{"unconfirmed, marker ahead", unconfirmed, ours(4), nil, refuse(sweep.RefuseBehind)},
		{"unconfirmed, another's marker", unconfirmed, other(func(m *sweep.Marker) { m.Backend = "s3main" }), nil, refuse(sweep.RefuseForeign)},
		{"unconfirmed, unreadable", unconfirmed, nil, unreadable, refuse(sweep.RefuseUnreadable)},
		{"confirmed, no marker", confirmed, nil, nil, refuse(sweep.RefuseMissing)},
		{"confirmed, our marker", confirmed, ours(3), nil, advance},
		{"confirmed, our older marker (a later pass's write was lost)", confirmed, ours(2), nil, advance},
		{"confirmed, marker ahead (restored)", confirmed, ours(4), nil, refuse(sweep.RefuseBehind)},
		{"confirmed, another datacenter's marker", confirmed, other(func(m *sweep.Marker) { m.Datacenter = "us-1" }), nil, refuse(sweep.RefuseForeign)},
		{"confirmed, another database's marker", confirmed, other(func(m *sweep.Marker) { m.Cluster = "another" }), nil, refuse(sweep.RefuseForeign)},
		{"confirmed, unreadable", confirmed, nil, unreadable, refuse(sweep.RefuseUnreadable)},
	}
	for _, c := range cases {
		if got := sweep.Judge(c.rec, c.marker, c.err, "eu-1", "fs"); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
		// An empty ledger refuses whatever the marker says.
		empty := c.rec
		empty.HasPlacements = false
		want := c.want
		if want.Action != sweep.Refuse {
			want = refuse(sweep.RefuseEmpty)
		}
		if got := sweep.Judge(empty, c.marker, c.err, "eu-1", "fs"); got != want {
			t.Errorf("%s, empty ledger: %+v, want %+v", c.name, got, want)
		}
	}
}

// A marker reads back as written; anything else is unreadable.
func TestMarkerEncoding(t *testing.T) {
	t.Parallel()
	rec := store.BackendRecord{Cluster: "c", Adopted: true, Pass: 7}
	m := sweep.NewMarker(rec, "eu-1", "fs")
	got, err := sweep.ParseMarker(m.Encode())
	if err != nil || got != m {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, m)
	}
	for _, bad := range []string{``, `{}`, `not json`, `{"format":2,"cluster":"c","datacenter":"eu-1","backend":"fs","pass":1}`,
		`{"format":1,"cluster":"c","datacenter":"eu-1","backend":"fs","pass":0}`, `{"format":1,"datacenter":"eu-1","backend":"fs","pass":1}`} {
		if _, err := sweep.ParseMarker([]byte(bad)); err == nil {
			t.Errorf("ParseMarker(%q) accepted it", bad)
		}
	}
}
