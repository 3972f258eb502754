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
