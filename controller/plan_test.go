package controller_test

import (
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/store"
)

// observed is a map of n partitions over nodes, every lease live on its
// primary, every node present and fresh.
func observed(t testing.TB, n int, nodes ...store.PlacementNode) controller.Observed {
	t.Helper()
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	addrs := make([]authority.NodeAddr, len(nodes))
	o := controller.Observed{Leases: map[string]authority.LeaseRecord{}, Nodes: map[string]store.PlacementNode{}, Present: map[string]bool{}, Now: now}
	for i, nd := range nodes {
		nd.Up, nd.Endpoint = true, "http://"+nd.ID+":8080"
		o.Nodes[nd.ID], o.Present[nd.ID] = nd, true
		addrs[i] = authority.NodeAddr{Node: nd.ID, Endpoint: nd.ID + ":8080"}
	}
	m, err := authority.EvenSplit{Version: 1, GeneratedAt: now, Partitions: n, Nodes: addrs, Class: "standard", Mode: authority.ModeDerived, State: authority.PrimaryServing}.Build()
	if err != nil {
		t.Fatal(err)
	}
	o.Map = m
	for _, p := range m.Partitions {
		o.Leases[p.ID] = authority.LeaseRecord{Partition: p.ID, Epoch: 3, OwnerNode: p.Primary.Node, State: authority.PrimaryServing, TTL: 10 * time.Second, ExpiresAt: now.Add(5 * time.Second)}
	}
	return o
}

var auto = controller.DefaultSettings.Auto

func TestPlanBrakes(t *testing.T) {
	t.Parallel()
	s := controller.Settings{MaxConcurrent: 8, MaxPerNode: 8, MaxMoveFraction: 0.25}
	nodes := []store.PlacementNode{{ID: "a", Datacenter: "eu-1"}, {ID: "b", Datacenter: "us-1"}, {ID: "c", Datacenter: "eu-1"}}
	drainA := func(t *testing.T) controller.Observed {
		o := observed(t, 12, nodes...)
		n := o.Nodes["a"]
		n.Draining = true
		o.Nodes["a"] = n
		return o
	}

	t.Run("same datacenter first, then load; cap R119", func(t *testing.T) {
		p := controller.ComputePlan(drainA(t), s, auto, controller.Override{})
		// a holds 4 of 12 partitions (1/3 of the slots); the cap of 1/4
		// lets 3 move.
		if len(p.Moves) != 3 || len(p.Held) != 1 || !strings.HasPrefix(p.Held[0].Held, "movement cap") {
			t.Fatalf("%+v", p)
		}
		for _, m := range p.Moves {
			if m.To != "c" || m.Kind != authority.KindHandoff || m.FromEpoch != 3 {
				t.Fatalf("move %+v: c shares a's datacenter", m)
			}
		}
	})
	t.Run("override lifts the cap", func(t *testing.T) {
		p := controller.ComputePlan(drainA(t), s, auto, controller.Override{By: "alice", Reason: "rack replacement"})
		if len(p.Moves) != 4 || len(p.Held) != 0 {
			t.Fatalf("%+v", p)
		}
	})
	t.Run("recovery of a gone node's expired leases", func(t *testing.T) {
		o := observed(t, 12, nodes...)
		o.Present["a"] = false
		for id, l := range o.Leases {
			if l.OwnerNode == "a" {
				l.ExpiresAt = o.Now.Add(-time.Second)
				o.Leases[id] = l
			}
		}
		p := controller.ComputePlan(o, controller.Settings{MaxMoveFraction: 1}, auto, controller.Override{})
		if len(p.Moves) != 4 || p.Moves[0].Kind != authority.KindRecover || p.Moves[0].Since.IsZero() {
			t.Fatalf("%+v", p)
		}
	})
	t.Run("concurrency R81 global", func(t *testing.T) {
		p := controller.ComputePlan(drainA(t), controller.Settings{MaxConcurrent: 2, MaxPerNode: 8, MaxMoveFraction: 1}, auto, controller.Override{})
		if len(p.Moves) != 2 || len(p.Held) != 2 || !strings.HasPrefix(p.Held[0].Held, "concurrency: 2 moves in flight") {
			t.Fatalf("%+v", p)
		}
	})
	t.Run("concurrency R81 per node", func(t *testing.T) {
		p := controller.ComputePlan(drainA(t), controller.Settings{MaxConcurrent: 8, MaxPerNode: 3, MaxMoveFraction: 1}, auto, controller.Override{})
		if len(p.Moves) != 3 || len(p.Held) != 1 || !strings.Contains(p.Held[0].Held, "max 3 per node") {
			t.Fatalf("%+v", p)
		}
	})
	t.Run("policy R118", func(t *testing.T) {
		p := controller.ComputePlan(drainA(t), s, map[string]bool{controller.TriggerRecover: true}, controller.Override{})
		if len(p.Moves) != 0 || !strings.HasPrefix(p.Held[0].Held, "awaiting an operator") {
			t.Fatalf("%+v", p)
		}
	})
	t.Run("no target", func(t *testing.T) {
		o := drainA(t)
		for _, id := range []string{"b", "c"} {
			n := o.Nodes[id]
			n.HeartbeatAge = time.Hour
			o.Nodes[id] = n
		}
		p := controller.ComputePlan(o, s, auto, controller.Override{})
		if len(p.Moves) != 0 || !strings.HasPrefix(p.Held[0].Held, "no target") {
			t.Fatalf("%+v", p)
		}
	})
	t.Run("a live lease never moves without a drain", func(t *testing.T) {
		o := observed(t, 12, nodes...)
		o.Present["a"] = false // gone, but its leases have not expired yet
		if p := controller.ComputePlan(o, s, auto, controller.Override{}); len(p.Moves)+len(p.Held) != 0 {
			t.Fatalf("%+v", p)
		}
	})
}

// Balance (A.8 step 3, R115, R116): once nothing is required, a
// datacenter's partitions spread over its eligible api nodes in the
// fewest moves, with hysteresis, and never across datacenters.
func TestPlanBalance(t *testing.T) {
	t.Parallel()
	withBalance := map[string]bool{controller.TriggerDrain: true, controller.TriggerRecover: true, controller.TriggerBalance: true}
	s := controller.Settings{MaxConcurrent: 8, MaxPerNode: 8, MaxMoveFraction: 1}
	// All 6 partitions on a; b and c (eu-1) and d (us-1) join empty.
	joined := func(t *testing.T) controller.Observed {
		o := observed(t, 6, store.PlacementNode{ID: "a", Datacenter: "eu-1"})
		for _, n := range []store.PlacementNode{{ID: "b", Datacenter: "eu-1"}, {ID: "c", Datacenter: "eu-1"}, {ID: "d", Datacenter: "us-1"}} {
			n.Up, n.Endpoint = true, "http://"+n.ID+":8080"
			o.Nodes[n.ID], o.Present[n.ID] = n, true
		}
		return o
	}
	loads := func(o controller.Observed, p controller.Plan) map[string]int {
		l := map[string]int{}
		for _, part := range o.Map.Partitions {
			l[part.Primary.Node]++
		}
		for _, m := range p.Moves {
			l[m.From]--
			l[m.To]++
		}
		return l
	}

	t.Run("spread to one in the fewest moves, same datacenter only", func(t *testing.T) {
		o := joined(t)
		p := controller.ComputePlan(o, s, withBalance, controller.Override{})
		if len(p.Moves) != 4 || len(p.Held) != 0 {
			t.Fatalf("6/0/0 takes 4 moves to 2/2/2: %+v", p)
		}
		for _, m := range p.Moves {
			if m.Trigger != controller.TriggerBalance || m.Kind != authority.KindHandoff || m.From != "a" || m.FromEpoch != 3 || m.ToEndpoint == "" {
				t.Fatalf("move %+v", m)
			}
		}
		if l := loads(o, p); l["a"] != 2 || l["b"] != 2 || l["c"] != 2 || l["d"] != 0 {
			t.Fatalf("loads after the plan %v: want a, b, c 2 each and nothing across datacenters", l)
		}
	})
	t.Run("a spread of one moves nothing", func(t *testing.T) {
		o := observed(t, 5, store.PlacementNode{ID: "a", Datacenter: "eu-1"}, store.PlacementNode{ID: "b", Datacenter: "eu-1"})
		if p := controller.ComputePlan(o, s, withBalance, controller.Override{}); len(p.Moves)+len(p.Held) != 0 {
			t.Fatalf("3/2 is balanced: %+v", p)
		}
	})
	t.Run("policy R118: listed, held for an operator", func(t *testing.T) {
		p := controller.ComputePlan(joined(t), s, map[string]bool{controller.TriggerDrain: true, controller.TriggerRecover: true}, controller.Override{})
		if len(p.Moves) != 0 || len(p.Held) != 4 || !strings.HasPrefix(p.Held[0].Held, "awaiting an operator") {
			t.Fatalf("%+v", p)
		}
	})
	t.Run("hysteresis R116: recently moved partitions stay", func(t *testing.T) {
		o := joined(t)
		o.LastMoved = map[string]time.Time{}
		for _, part := range o.Map.Partitions[:5] {
			o.LastMoved[part.ID] = o.Now.Add(-30 * time.Second) // within the 1 min cooldown
		}
		o.LastMoved[o.Map.Partitions[5].ID] = o.Now.Add(-time.Hour)
		p := controller.ComputePlan(o, s, withBalance, controller.Override{})
		if len(p.Moves) != 1 || p.Moves[0].Partition != o.Map.Partitions[5].ID {
			t.Fatalf("only the partition moved an hour ago may move: %+v", p)
		}
	})
	t.Run("a blip moves nothing: a node not present is neither source nor target", func(t *testing.T) {
		o := joined(t)
		o.Present["a"] = false // its leases are still live
		if p := controller.ComputePlan(o, s, withBalance, controller.Override{}); len(p.Moves)+len(p.Held) != 0 {
			t.Fatalf("%+v", p)
		}
		o = joined(t)
		o.Present["b"], o.Present["c"] = false, false
		if p := controller.ComputePlan(o, s, withBalance, controller.Override{}); len(p.Moves)+len(p.Held) != 0 {
			t.Fatalf("%+v", p)
		}
	})
	t.Run("constraints first R115: no balance beside a required move", func(t *testing.T) {
		o := joined(t)
		o.Present["d"] = false
		o.Map.Partitions[0].Primary.Node = "d" // d's partition, its lease expired
		l := o.Leases[o.Map.Partitions[0].ID]
		l.OwnerNode, l.ExpiresAt = "d", o.Now.Add(-time.Minute)
		o.Leases[o.Map.Partitions[0].ID] = l
		p := controller.ComputePlan(o, s, withBalance, controller.Override{})
		if len(p.Moves) != 1 || p.Moves[0].Trigger != controller.TriggerRecover {
			t.Fatalf("only the recovery: %+v", p)
		}
	})
	t.Run("freeze R123 holds balance", func(t *testing.T) {
		o := joined(t)
		o.Frozen = &store.FreezeState{By: "alice", Reason: "incident"}
		p := controller.ComputePlan(o, s, withBalance, controller.Override{})
		if len(p.Moves) != 0 || len(p.Held) != 1 || !strings.HasPrefix(p.Held[0].Held, "frozen") {
			t.Fatalf("%+v", p)
		}
	})
}

// R112: a partition goes only to a node of its class with room in its
// capacity budget — before any preference (constraints first); balance
// is held to the same constraints.
func TestPlanHonoursClassAndCapacity(t *testing.T) {
	t.Parallel()
	s := controller.Settings{MaxConcurrent: 8, MaxPerNode: 8, MaxMoveFraction: 1}
	drainA := func(t *testing.T, b, c store.PlacementNode) controller.Observed {
		o := observed(t, 6, store.PlacementNode{ID: "a", Datacenter: "eu-1"})
		for _, n := range []store.PlacementNode{b, c} {
			n.Up, n.Endpoint = true, "http://"+n.ID+":8080"
			o.Nodes[n.ID], o.Present[n.ID] = n, true
		}
		a := o.Nodes["a"]
		a.Draining = true
		o.Nodes["a"] = a
		return o
	}
	t.Run("class", func(t *testing.T) {
		// b shares a's datacenter but declares another class: c takes all.
		o := drainA(t, store.PlacementNode{ID: "b", Datacenter: "eu-1", Class: "gpu"}, store.PlacementNode{ID: "c", Datacenter: "us-1", Class: "standard"})
		p := controller.ComputePlan(o, s, auto, controller.Override{})
		if len(p.Moves) != 6 {
			t.Fatalf("%+v", p)
		}
		for _, m := range p.Moves {
			if m.To != "c" {
				t.Fatalf("move %+v to a node of another class", m)
			}
		}
	})
	t.Run("capacity", func(t *testing.T) {
		o := drainA(t, store.PlacementNode{ID: "b", Datacenter: "eu-1", Capacity: 2}, store.PlacementNode{ID: "c", Datacenter: "us-1", Capacity: 3})
		p := controller.ComputePlan(o, s, auto, controller.Override{})
		to := map[string]int{}
		for _, m := range p.Moves {
			to[m.To]++
		}
		if to["b"] != 2 || to["c"] != 3 || len(p.Held) != 1 || !strings.Contains(p.Held[0].Held, "capacity budget") {
			t.Fatalf("moves by target %v, held %+v: want b 2, c 3, one held for room", to, p.Held)
		}
	})
	t.Run("balance within budget and class", func(t *testing.T) {
		o := observed(t, 6, store.PlacementNode{ID: "a", Datacenter: "eu-1"})
		for _, n := range []store.PlacementNode{{ID: "b", Datacenter: "eu-1", Capacity: 1}, {ID: "c", Datacenter: "eu-1", Class: "gpu"}} {
			n.Up, n.Endpoint = true, "http://"+n.ID+":8080"
			o.Nodes[n.ID], o.Present[n.ID] = n, true
		}
		withBalance := map[string]bool{controller.TriggerBalance: true}
		p := controller.ComputePlan(o, s, withBalance, controller.Override{})
		if len(p.Moves) != 1 || p.Moves[0].To != "b" {
			t.Fatalf("balance: %+v, want one move to b (its budget is 1; c is of another class)", p)
		}
	})
}
