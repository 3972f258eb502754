package controller_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority/keeper"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/store"
)

// liveNode is an api node as far as placement sees it: registered, its
// presence lock held, its keeper running its own loop (woken by
// notifications). restart stops it and starts it again, as a platform
// restarting the process would.
type liveNode struct {
	id, endpoint string
	st           *store.Store
	mu           sync.Mutex
	stop         func()
}

// start may run on another goroutine: failures are t.Error.
func (n *liveNode) start(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := n.st.RegisterNode(ctx, store.Node{ID: n.id, Datacenter: "eu-1", Role: "api", Endpoint: "http://" + n.endpoint}); err != nil {
		t.Error(err)
		cancel()
		return
	}
	// The previous process's backend ends a moment after its connection
	// closed: its lock goes with it.
	p, err := n.st.HoldPresence(ctx, n.id)
	for deadline := time.Now().Add(10 * time.Second); blobplane.ErrorCode(err) == blobplane.CodeConflict && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // polling for the old backend's exit
		p, err = n.st.HoldPresence(ctx, n.id)
	}
	if err != nil {
		t.Error(err)
		cancel()
		return
	}
	kp, err := keeper.New(n.st, keeper.Config{NodeID: n.id, Endpoint: n.endpoint})
	if err != nil {
		t.Error(err)
		p.Release()
		cancel()
		return
	}
	stopCaches := store.New(n.st.Pool(), nil).StartCaches(ctx, store.CacheOptions{MapPublished: kp.Notify, HandoffChanged: kp.Notify})
	done := make(chan struct{})
	go func() { defer close(done); kp.Run(ctx) }()
	n.mu.Lock()
	n.stop = func() { cancel(); stopCaches(); <-done; p.Release() }
	n.mu.Unlock()
}

func (n *liveNode) halt() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stop != nil {
		n.stop()
		n.stop = nil
	}
}

// R80: a rollout is a sequence of live handoffs, one node at a time —
// never two nodes draining at once — each node restarted only once it
// holds nothing, and the restarted nodes take their share back at the
// end (R115); a node that does not come back stops the rollout there.
func TestRolloutRestartsOneNodeAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, k := setup(t)
	nodes := map[string]*liveNode{}
	for i, id := range []string{"a", "b", "c"} {
		register(t, st, id, fmt.Sprintf("http://127.0.0.1:%d000", i+1))
	}
	if _, err := controller.Publish(ctx, st, k.Signer(), controller.PublishOptions{Partitions: 6}); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"a", "b", "c"} {
		nodes[id] = &liveNode{id: id, endpoint: fmt.Sprintf("127.0.0.1:%d000", i+1), st: st}
		nodes[id].start(t)
		defer nodes[id].halt()
	}
	svc := &controller.Service{Store: st, Signer: k.Signer(), Settings: controller.Settings{Tick: 100 * time.Millisecond}, AppliedBy: "rollout test"}

	var steps []string
	restarted := make(chan struct{}, 3)
	err := controller.Rollout(ctx, svc, controller.RolloutRequest{Nodes: []string{"a", "b", "c"}, DrainWait: time.Minute, RestartWait: time.Minute},
		func(e controller.RolloutEvent) {
			steps = append(steps, e.Node+":"+e.Step)
			if e.Step != "drained" {
				return
			}
			// Only this node drains, and it holds nothing now.
			pn, err := st.PlacementNodes(ctx)
			if err != nil {
				t.Error(err)
			}
			for _, n := range pn {
				if n.Draining != (n.ID == e.Node) {
					t.Errorf("at %s drained: %s draining %v", e.Node, n.ID, n.Draining)
				}
			}
			if done, err := controller.Retired(ctx, st, e.Node); !done || err != nil {
				t.Errorf("%s reported drained while holding partitions (%v)", e.Node, err)
			}
			// The platform restarts it.
			n := nodes[e.Node]
			go func() {
				n.halt()
				n.start(t)
				restarted <- struct{}{}
			}()
		})
	if err != nil {
		t.Fatalf("rollout: %v (steps %v)", err, steps)
	}
	want := "a:draining a:drained a:restarted b:draining b:drained b:restarted c:draining c:drained c:restarted :balanced"
	if got := strings.Join(steps, " "); got != want {
		t.Fatalf("steps\n got %s\nwant %s", got, want)
	}
	for range 3 {
		<-restarted
	}
	m, err := st.LatestMap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	homes := map[string]int{}
	for _, p := range m.Partitions {
		homes[p.Primary.Node]++
	}
	if homes["a"] != 2 || homes["b"] != 2 || homes["c"] != 2 {
		t.Fatalf("homes after the rollout: %v, want 2 each", homes)
	}

	// A node that is not restarted stops the rollout, the rest untouched.
	err = controller.Rollout(ctx, svc, controller.RolloutRequest{Nodes: []string{"a", "b"}, DrainWait: time.Minute, RestartWait: 300 * time.Millisecond},
		func(controller.RolloutEvent) {})
	if blobplane.ErrorCode(err) != blobplane.CodeUnavailable || !strings.Contains(err.Error(), "a was not restarted") {
		t.Fatalf("rollout with a node that never comes back: %v", err)
	}
	pn, err := st.PlacementNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range pn {
		if n.ID == "b" && n.Draining {
			t.Fatal("the rollout went past the node that did not come back")
		}
	}
	if err := controller.Rollout(ctx, svc, controller.RolloutRequest{Nodes: []string{"a", "a"}}, func(controller.RolloutEvent) {}); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
		t.Fatalf("a node listed twice: %v", err)
	}
}
