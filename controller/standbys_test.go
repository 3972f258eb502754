package controller

import (
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/store"
)

// Standby placement and the synced-standby preference are pure: these
// tests build what a round observes and check what it decides (ZBP-5 R60,
// R61, R73, R114).

var standbyNow = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// node is an api node id in datacenter dc.
func node(id, dc string) store.PlacementNode {
	return store.PlacementNode{ID: id, Datacenter: dc}
}

// standbyFleet observes a map of class whose partitions are homed, in
// order, on primaries (epoch 3, leases live on them), over nodes of that
// class, every one eligible: present, fresh, up, with an endpoint. No
// standbys yet.
func standbyFleet(t *testing.T, class string, primaries []string, nodes ...store.PlacementNode) Observed {
	t.Helper()
	o := Observed{Leases: map[string]authority.LeaseRecord{}, Nodes: map[string]store.PlacementNode{}, Present: map[string]bool{}, Now: standbyNow}
	for _, n := range nodes {
		n.Up, n.Endpoint, n.Class = true, "http://"+n.ID+":8080", class
		o.Nodes[n.ID], o.Present[n.ID] = n, true
	}
	addrs := []authority.NodeAddr{{Node: primaries[0], Endpoint: primaries[0] + ":8080"}}
	m, err := authority.EvenSplit{Version: 1, GeneratedAt: standbyNow, Partitions: len(primaries), Nodes: addrs,
		Class: class, Mode: authority.ModeMixed, Epoch: 3, State: authority.PrimaryServing}.Build()
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range primaries {
		setPrimary(m, m.Partitions[i].ID, p, p+":8080")
		id := m.Partitions[i].ID
		o.Leases[id] = authority.LeaseRecord{Partition: id, Epoch: 3, OwnerNode: p, State: authority.PrimaryServing, TTL: 10 * time.Second, ExpiresAt: standbyNow.Add(5 * time.Second)}
	}
	o.Map = m
	return o
}

// placed is o's map with its standbys placed under classes.
func placed(t *testing.T, o Observed, classes classTable, skip map[string]bool) *authority.Map {
	t.Helper()
	m := o.Map.Clone()
	placeStandbys(m, classes, o, DefaultSettings, skip)
	if err := authority.Validate(m); err != nil {
		t.Fatalf("R7: the placed map is not valid: %v", err)
	}
	return m
}

// standbysOf lists each partition's standby nodes, joined by "+", in
// map order.
func standbysOf(m *authority.Map) []string {
	out := make([]string, len(m.Partitions))
	for i, p := range m.Partitions {
		out[i] = strings.Join(standbyNodes(p.Standbys), "+")
	}
	return out
}

func eq(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

// ZBP-5 R60, R61: under node diversity each partition gets its class's one
// standby, never its primary, published SYNCING with lag 0, spread over
// the nodes; with one node there is none to place (R114: fewer, and the
// health report says so).
func TestStandbysUnderNodeDiversity(t *testing.T) {
	t.Parallel()
	o := standbyFleet(t, DefaultClass, []string{"a", "b", "c", "a", "b", "c"}, node("a", "eu-1"), node("b", "eu-1"), node("c", "eu-1"))
	m := placed(t, o, standbyClasses, nil)
	per := map[string]int{}
	for _, p := range m.Partitions {
		if len(p.Standbys) != 1 {
			t.Fatalf("R60: partition %s has %d standbys, want 1", p.ID, len(p.Standbys))
		}
		s := p.Standbys[0]
		if s.Node == p.Primary.Node || s.State != authority.StandbySyncing || s.LagRecords != 0 || s.Endpoint != s.Node+":8080" {
			t.Fatalf("R61: partition %s on %s: standby %+v", p.ID, p.Primary.Node, s)
		}
		per[s.Node]++
	}
	if per["a"] != 2 || per["b"] != 2 || per["c"] != 2 {
		t.Fatalf("standbys not spread: %v", per)
	}

	alone := placed(t, standbyFleet(t, DefaultClass, []string{"a", "a"}, node("a", "eu-1")), standbyClasses, nil)
	if got := standbysOf(alone); !eq(got, []string{"", ""}) {
		t.Fatalf("R114: one node has no standby to offer: %v", got)
	}
}

// Under node diversity a standby in the primary's datacenter comes
// first: a failover to it keeps the home near its writers
// (partstate.QuotaClass).
func TestStandbysPreferThePrimarysDatacenter(t *testing.T) {
	t.Parallel()
	o := standbyFleet(t, DefaultClass, []string{"a"}, node("a", "eu-1"), node("b", "us-1"), node("c", "eu-1"))
	if got := standbysOf(placed(t, o, standbyClasses, nil)); !eq(got, []string{"c"}) {
		t.Fatalf("standby %v, want c (a's datacenter) before b", got)
	}
}

// ZBP-5 R61, R114: under datacenter diversity a standby is only ever in
// another datacenter than its primary's; with every node in one, there is
// none; a node with no datacenter proves nothing and is never chosen.
func TestStandbysUnderDatacenterDiversity(t *testing.T) {
	t.Parallel()
	geo := classTable{"geo": {Name: "geo", Standbys: 1, Diversity: partstate.DiversityDatacenter}}
	nodes := []store.PlacementNode{node("a", "eu-1"), node("b", "eu-1"), node("c", "us-1"), node("x", "")}
	o := standbyFleet(t, "geo", []string{"a", "b", "c", "c"}, nodes...)
	m := placed(t, o, geo, nil)
	// a's and b's go to c, the only other datacenter; c's spread over eu-1.
	if got := standbysOf(m); !eq(got, []string{"c", "c", "a", "b"}) {
		t.Fatalf("standbys %v", got)
	}

	same := standbyFleet(t, "geo", []string{"a", "b"}, node("a", "eu-1"), node("b", "eu-1"), node("x", ""))
	if got := standbysOf(placed(t, same, geo, nil)); !eq(got, []string{"", ""}) {
		t.Fatalf("R114: one datacenter has no standby to offer: %v", got)
	}
}

// Several standbys spread over failure domains where they can: a second
// standby goes to a datacenter the first is not in.
func TestStandbysSpreadOverDomains(t *testing.T) {
	t.Parallel()
	two := classTable{"geo2": {Name: "geo2", Standbys: 2, Diversity: partstate.DiversityDatacenter}}
	o := standbyFleet(t, "geo2", []string{"a"}, node("a", "eu-1"), node("b", "us-1"), node("c", "us-1"), node("d", "ap-1"))
	if got := standbysOf(placed(t, o, two, nil)); !eq(got, []string{"b+d"}) {
		t.Fatalf("standbys %v, want b (first by id) and d (another datacenter than b's)", got)
	}
	// With two domains left for three nodes, the second shares one.
	delete(o.Nodes, "d")
	if got := standbysOf(placed(t, o, two, nil)); !eq(got, []string{"b+c"}) {
		t.Fatalf("standbys %v, want b+c", got)
	}
}

// A standby that is still eligible and valid stays, whoever has fewer
// assignments now; one whose node drains, leaves or goes stale is
// replaced; partitions with a move in flight and classes the controller
// does not know keep what they have.
func TestStandbyPlacementIsStable(t *testing.T) {
	t.Parallel()
	o := standbyFleet(t, DefaultClass, []string{"a", "b", "c"}, node("a", "eu-1"), node("b", "eu-1"), node("c", "eu-1"))
	first := placed(t, o, standbyClasses, nil)
	if got := standbysOf(first); !eq(got, []string{"b", "c", "a"}) {
		t.Fatalf("first placement %v", got)
	}
	o.Map = first
	o.Nodes["d"], o.Present["d"] = store.PlacementNode{ID: "d", Datacenter: "eu-1", Up: true, Endpoint: "http://d:8080"}, true
	if again := placed(t, o, standbyClasses, nil); !sameStandbys(first, again) {
		t.Fatalf("a new node moved valid standbys: %v", standbysOf(again))
	}

	for name, leave := range map[string]func(o *Observed){
		"draining":     func(o *Observed) { n := o.Nodes["b"]; n.Draining = true; o.Nodes["b"] = n },
		"disconnected": func(o *Observed) { o.Present["b"] = false },
		"stale":        func(o *Observed) { n := o.Nodes["b"]; n.HeartbeatAge = time.Hour; o.Nodes["b"] = n },
		"down":         func(o *Observed) { n := o.Nodes["b"]; n.Up = false; o.Nodes["b"] = n },
	} {
		t.Run(name, func(t *testing.T) {
			o := o
			o.Nodes, o.Present = cloneMap(o.Nodes), cloneMap(o.Present)
			leave(&o)
			// a's standby b goes to d (no standby yet); the others stay.
			if got := standbysOf(placed(t, o, standbyClasses, nil)); !eq(got, []string{"d", "c", "a"}) {
				t.Fatalf("standbys %v", got)
			}
			// With a move of a's partition in flight, it keeps b for now.
			skip := map[string]bool{first.Partitions[0].ID: true}
			if got := standbysOf(placed(t, o, standbyClasses, skip)); !eq(got, []string{"b", "c", "a"}) {
				t.Fatalf("a partition with a move in flight: %v", got)
			}
		})
	}

	other := first.Clone()
	for i := range other.Partitions {
		other.Partitions[i].Class = "batch" // no class the controller places for
	}
	o.Map = other
	n := o.Nodes["b"]
	n.Draining = true
	o.Nodes = cloneMap(o.Nodes)
	o.Nodes["b"] = n
	if got := standbysOf(placed(t, o, standbyClasses, nil)); !eq(got, []string{"b", "c", "a"}) {
		t.Fatalf("an unknown class's standbys are not the controller's: %v", got)
	}
}

// A standby promoted to primary stops being its standby, and another is
// placed; more standbys than the class asks are cut to the first ones.
func TestStandbysAfterPromotion(t *testing.T) {
	t.Parallel()
	o := standbyFleet(t, DefaultClass, []string{"a", "b", "c"}, node("a", "eu-1"), node("b", "eu-1"), node("c", "eu-1"))
	m := placed(t, o, standbyClasses, nil)
	id := m.Partitions[0].ID // on a, standby b
	setPrimary(m, id, "b", "b:8080")
	if p := m.Partition(id); len(p.Standbys) != 0 {
		t.Fatalf("the promoted standby is still listed: %+v", p.Standbys)
	}
	n := o.Nodes["a"]
	n.Draining = true // the old primary drained away
	o.Nodes["a"] = n
	o.Map = m
	if got := standbysOf(placed(t, o, standbyClasses, nil)); got[0] != "c" {
		t.Fatalf("after the promotion: %v, want c (a drains)", got)
	}

	m.Partition(id).Standbys = []authority.Standby{
		{Node: "c", Endpoint: "c:8080", State: authority.StandbySynced},
		{Node: "d", Endpoint: "d:8080", State: authority.StandbySyncing}, // not a node at all
		{Node: "a", Endpoint: "a:8080", State: authority.StandbySyncing},
	}
	p := placed(t, o, standbyClasses, nil).Partition(id)
	if len(p.Standbys) != 1 || p.Standbys[0].Node != "c" || p.Standbys[0].State != authority.StandbySynced {
		t.Fatalf("kept standbys %+v: c stays as published", p.Standbys)
	}
}

func cloneMap[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// ZBP-5 R73: a drain or a failover goes to the partition's synced standby
// before a less loaded node, and to the less loaded one when the
// standby's report is stale, at another epoch, not caught up, or when the
// synced node is not the map's standby. The epoch is the lease's when the
// map's is behind it (a first map says 0).
func TestMoveTargetPrefersTheSyncedStandby(t *testing.T) {
	t.Parallel()
	// a homes p; c homes two more and is p's standby; b homes nothing.
	base := func(t *testing.T) Observed {
		o := standbyFleet(t, DefaultClass, []string{"a", "c", "c"}, node("a", "eu-1"), node("b", "eu-1"), node("c", "eu-1"))
		o.Map.Partitions[0].Standbys = []authority.Standby{{Node: "c", Endpoint: "c:8080", State: authority.StandbySyncing}}
		return o
	}
	synced := store.StandbyReport{Node: "c", Generation: 1, Epoch: 3, AppliedLSN: 40, HeadLSN: 40, ReportedAgo: time.Second, CaughtUpAgo: time.Second}
	drain := func(o *Observed) { n := o.Nodes["a"]; n.Draining = true; o.Nodes["a"] = n }
	fail := func(o *Observed) {
		o.Present["a"] = false
		l := o.Leases[o.Map.Partitions[0].ID]
		l.ExpiresAt = o.Now.Add(-time.Second)
		o.Leases[l.Partition] = l
	}
	for _, tc := range []struct {
		name   string
		report func(r *store.StandbyReport) bool // false: no report
		want   string
		lease  uint64 // the lease's epoch when not the map's 3
	}{
		{"synced", func(r *store.StandbyReport) bool { return true }, "c", 0},
		{"no report", func(r *store.StandbyReport) bool { return false }, "b", 0},
		{"stale report", func(r *store.StandbyReport) bool { r.ReportedAgo = time.Minute; return true }, "b", 0},
		{"another epoch", func(r *store.StandbyReport) bool { r.Epoch = 2; return true }, "b", 0},
		{"never caught up", func(r *store.StandbyReport) bool { r.CaughtUpAgo = -1; return true }, "b", 0},
		{"the lease's epoch, the map behind", func(r *store.StandbyReport) bool { r.Epoch = 4; return true }, "c", 4},
		{"the map's epoch, the lease ahead", func(r *store.StandbyReport) bool { return true }, "b", 4},
		{"b synced but not its standby", func(r *store.StandbyReport) bool { r.Node = "b"; return true }, "b", 0},
	} {
		for how, move := range map[authority.HandoffKind]func(*Observed){authority.KindHandoff: drain, authority.KindRecover: fail} {
			t.Run(tc.name+"/"+string(how), func(t *testing.T) {
				o := base(t)
				p := o.Map.Partitions[0]
				r := synced
				r.Partition = p.ID
				if tc.report(&r) {
					o.Standbys = map[string][]store.StandbyReport{p.ID: {r}}
				}
				if tc.lease != 0 {
					l := o.Leases[p.ID]
					l.Epoch = tc.lease
					o.Leases[p.ID] = l
				}
				move(&o)
				plan := ComputePlan(o, Settings{MaxMoveFraction: 1}, DefaultSettings.Auto, Override{})
				if len(plan.Moves) != 1 || plan.Moves[0].Kind != how || plan.Moves[0].To != tc.want {
					t.Fatalf("plan %+v: want a %s to %s", plan, how, tc.want)
				}
				suffix := "; to its synced standby c"
				if got := strings.HasSuffix(plan.Moves[0].Reason, suffix); got != (tc.want == "c") {
					t.Fatalf("reason %q: the synced standby is said when, and only when, it is the target", plan.Moves[0].Reason)
				}
			})
		}
	}
}
