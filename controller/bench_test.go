package controller_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/authority/keeper"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/store"
)

// BenchmarkComputePlan is one round's planning over the size:
// 4,096 slots × 256 partitions × 50 nodes, one node draining (its ~5
// partitions handed off) and one gone with expired leases (recovered).
func BenchmarkComputePlan(b *testing.B) {
	nodes := make([]store.PlacementNode, 50)
	for i := range nodes {
		nodes[i] = store.PlacementNode{ID: fmt.Sprintf("n%02d", i), Datacenter: fmt.Sprintf("dc-%d", i%3)}
	}
	o := observed(b, 256, nodes...)
	if o.Map.SlotBits != 12 {
		b.Fatalf("slot bits %d", o.Map.SlotBits)
	}
	n := o.Nodes["n00"]
	n.Draining = true
	o.Nodes["n00"] = n
	o.Present["n01"] = false
	for id, l := range o.Leases {
		if l.OwnerNode == "n01" {
			l.ExpiresAt = o.Now.Add(-time.Second)
			o.Leases[id] = l
		}
	}
	s := controller.Settings{MaxConcurrent: 64, MaxPerNode: 64}
	var p controller.Plan
	b.ResetTimer()
	for b.Loop() {
		p = controller.ComputePlan(o, s, auto, controller.Override{})
	}
	b.StopTimer()
	if len(p.Moves) == 0 {
		b.Fatalf("no moves: %+v", p)
	}
	b.ReportMetric(float64(len(p.Moves)), "moves")
}

// BenchmarkHandoffUnavailability runs 50 live handoffs of one partition
// back and forth between two nodes whose keepers and the controller run
// as in production (their own loops, woken by Postgres notifications on
// one real database), and reports the outage of each — from the seal to
// the map naming the new home (R135) — as p50 and p99 beside the lease
// TTL, and the wall time per handoff (drain requested → published).
func BenchmarkHandoffUnavailability(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, k := setup(b)
	for i, n := range []string{"a", "b"} {
		register(b, st, n, fmt.Sprintf("http://127.0.0.1:%d000", i+1))
	}
	if _, err := controller.Publish(ctx, st, k.Signer(), controller.PublishOptions{Partitions: 1}); err != nil {
		b.Fatal(err)
	}
	var stops []func()
	for i, n := range []string{"a", "b"} {
		p, err := st.HoldPresence(ctx, n)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Release()
		kp, err := keeper.New(st, keeper.Config{NodeID: n, Endpoint: fmt.Sprintf("127.0.0.1:%d000", i+1)})
		if err != nil {
			b.Fatal(err)
		}
		// Each keeper wakes on map and handoff notifications, as an api's does.
		node := store.New(st.Pool(), nil)
		stop := node.StartCaches(ctx, store.CacheOptions{MapPublished: kp.Notify, HandoffChanged: kp.Notify})
		done := make(chan struct{})
		go func() { defer close(done); kp.Run(ctx) }()
		stops = append(stops, func() { stop(); <-done })
	}
	defer func() {
		cancel()
		for _, s := range stops {
			s()
		}
	}()
	wake := make(chan struct{}, 1)
	notify := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	stopCtl := st.StartCaches(ctx, store.CacheOptions{MapPublished: notify, HandoffChanged: notify})
	defer stopCtl()
	svc := &controller.Service{Store: st, Signer: k.Signer(), Settings: controller.Settings{Tick: 200 * time.Millisecond}}
	go func() { _ = svc.Run(ctx, wake) }()

	m, err := st.LatestMap(ctx)
	if err != nil {
		b.Fatal(err)
	}
	part := m.Partitions[0].ID
	holder := m.Partitions[0].Primary.Node
	waitServing := func(node string) {
		for {
			l, err := st.Lease(ctx, part)
			m, err2 := st.LatestMap(ctx)
			if err == nil && err2 == nil && l.OwnerNode == node && l.State == authority.PrimaryServing && m.Partition(part).Primary.Node == node {
				return
			}
			time.Sleep(5 * time.Millisecond) // polling the lease row and the map
		}
	}
	waitServing(holder)
	var outages, walls []time.Duration
	b.ResetTimer()
	for range 50 {
		other := map[string]string{"a": "b", "b": "a"}[holder]
		// Drain the holder; the other node is the only target.
		if _, err := st.RegisterNode(ctx, store.Node{ID: other, Datacenter: "eu-1", Role: "api", Endpoint: endpointOf(other)}); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := st.MarkNodeDraining(ctx, holder); err != nil {
			b.Fatal(err)
		}
		notify()
		waitServing(other)
		walls = append(walls, time.Since(start))
		var hs []authority.Handoff
		for {
			// The map is published, then the move recorded published.
			if hs, err = st.RecentHandoffs(ctx, 1); err != nil || len(hs) == 0 || hs[0].State == authority.HandoffPublished {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err != nil || len(hs) == 0 || hs[0].State != authority.HandoffPublished || hs[0].To != other {
			b.Fatalf("last handoff %+v %v", hs, err)
		}
		outages = append(outages, hs[0].Unavailable())
		holder = other
	}
	b.StopTimer()
	slices.Sort(outages)
	slices.Sort(walls)
	b.ReportMetric(float64(outages[len(outages)/2].Microseconds())/1000, "p50-unavailable-ms")
	b.ReportMetric(float64(outages[len(outages)*99/100].Microseconds())/1000, "p99-unavailable-ms")
	b.ReportMetric(float64(walls[len(walls)/2].Microseconds())/1000, "p50-handoff-ms")
	b.ReportMetric(keeper.DefaultTiming.TTL.Seconds()*1000, "lease-ttl-ms")
}

func endpointOf(n string) string {
	if n == "a" {
		return "http://127.0.0.1:1000"
	}
	return "http://127.0.0.1:2000"
}
