package controller_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/store"
)

// observer reports what the test sets per node, and the map version each
// node's keeper serves from (the fleet's keepers are the nodes).
type observer struct {
	t       *testing.T
	f       *fleet
	mu      sync.Mutex
	errors  map[string]float64
	calls   int
	checked bool
}

func (o *observer) Sample(ctx context.Context, n store.PlacementNode) (controller.CanarySample, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls++
	if v := o.f.keepers[n.ID].Map().Version(); v >= 2 && !o.checked {
		// The canary node serves from it and nothing is decided yet:
		// b, not a canary node, must not adopt it (R120).
		o.checked = true
		o.f.keepers["b"].RefreshMap(ctx)
		if got := o.f.keepers["b"].Map().Version(); got != 1 {
			o.t.Errorf("b adopted version %d while it was a canary for a", got)
		}
	}
	// Each sample sees 100 more requests; errors as set.
	return controller.CanarySample{MapVersion: o.f.keepers[n.ID].Map().Version(), Requests: float64(100 * o.calls), Errors: o.errors[n.ID] * float64(o.calls)}, nil
}

// canaryRun publishes a canary for node a of a map that moves b's
// partition to a, and runs a's keeper until it serves from it, as the
// canary's watch does; it returns the watch's result.
func canaryRun(t *testing.T, f *fleet, obs *observer) (controller.CanaryResult, uint64) {
	t.Helper()
	ctx := context.Background()
	// The canary map re-places what an unregistered node held: mark b
	// down so `publish` computes a move of its partition.
	if err := f.st.MarkNodeDown(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { // the canary node follows the published maps, as its keeper does
		defer close(done)
		for f.keepers["a"].Map().Version() < 2 {
			f.keepers["a"].RefreshMap(ctx)
			time.Sleep(5 * time.Millisecond) // a keeper's refresh, faster
		}
	}()
	res, err := controller.PublishCanary(ctx, f.st, f.key.Signer(), controller.PublishOptions{}, controller.CanaryOptions{
		Nodes: []string{"a"}, Window: 50 * time.Millisecond, MaxErrorRatio: 0.05, Observer: obs, Poll: 5 * time.Millisecond,
	})
	<-done
	if err != nil {
		t.Fatal(err)
	}
	return res, res.Version
}

// R120, R121: a canary version is adopted only by its nodes until it is
// promoted, then by everyone.
func TestCanaryPromotedAfterAGoodWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 2, "a", "b")
	obs := &observer{t: t, f: f, errors: map[string]float64{}}
	// Before the watch decides, b (not a canary node) must not see it.
	res, v := canaryRun(t, f, obs)
	if !res.Promoted || v != 2 || !obs.checked {
		t.Fatalf("result %+v", res)
	}
	f.keepers["b"].RefreshMap(ctx)
	if got := f.keepers["b"].Map().Version(); got != 2 {
		t.Fatalf("after the promotion b serves from version %d", got)
	}
	latest, _ := f.st.LatestMap(ctx)
	if latest.Version != 2 {
		t.Fatalf("everyone's latest map: %d", latest.Version)
	}
}

// R121: a canary whose nodes answer errors past the stated outcome is
// withdrawn: a newer version with the previous content follows, which
// every node adopts.
func TestCanaryWithdrawnWhenErrorsRise(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 2, "a", "b")
	obs := &observer{t: t, f: f, errors: map[string]float64{"a": 20}} // 20% 5xx
	before, _ := f.st.LatestMap(ctx)
	res, v := canaryRun(t, f, obs)
	if res.Promoted || res.Withdrawn != v+1 || !strings.Contains(res.Decision, "5xx") {
		t.Fatalf("result %+v", res)
	}
	after, err := f.st.LatestMap(ctx)
	if err != nil || after.Version != v+1 {
		t.Fatalf("latest after the withdrawal: %v %v", after, err)
	}
	for _, p := range before.Partitions {
		if q := after.Partition(p.ID); q == nil || q.Primary.Node != p.Primary.Node {
			t.Fatalf("the withdrawal's map differs from the one before the canary: %+v vs %+v", q, p)
		}
	}
	for _, n := range []string{"a", "b"} {
		f.keepers[n].RefreshMap(ctx)
		if got := f.keepers[n].Map().Version(); got != v+1 {
			t.Fatalf("%s serves from version %d after the withdrawal, want %d", n, got, v+1)
		}
	}
	if pending, _ := f.st.PendingCanaries(ctx); len(pending) != 0 {
		t.Fatalf("pending canaries after the withdrawal: %v", pending)
	}
}

// R122: a map completing a move past its seal is published while a canary
// is pending, and supersedes it.
func TestCanaryNeverHoldsBackACompletion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 2, "a", "b")
	part := f.held("a")[0]
	if err := f.st.MarkNodeDraining(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	f.round(t)
	f.tick(t, "b")
	f.tick(t, "a")
	f.tick(t, "b") // sealed, claimed, ready
	// A canary lands meanwhile (any content: a copy of the map).
	m, _ := f.st.LatestMap(ctx)
	c := m.Clone()
	c.Signature, c.Version = nil, m.Version+1
	c.Partitions[0].Standbys = []authority.Standby{}
	c.GeneratedAt = c.GeneratedAt.Add(time.Millisecond)
	if err := f.key.Signer().SignMap(c); err != nil {
		t.Fatal(err)
	}
	if err := f.st.PublishCanary(ctx, c, store.Canary{Nodes: []string{"b"}, MaxErrorRatio: 0.01, Window: time.Minute}); err != nil {
		t.Fatal(err)
	}
	f.round(t)
	if primary, v := f.primaryOf(t, part); primary != "b" || v <= c.Version {
		t.Fatalf("the completion: map v%d names %s (canary v%d)", v, primary, c.Version)
	}
	if pending, _ := f.st.PendingCanaries(ctx); len(pending) != 0 {
		t.Fatalf("R122: the superseded canary is still pending: %v", pending)
	}
}

// The production observer reads a real api router's exposition.
func TestMetricsObserverReadsTheExposition(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{}))
	defer srv.Close()
	for range 3 {
		resp, err := http.Get(srv.URL + "/v1/no-such-route")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	s, err := controller.MetricsObserver{}.Sample(context.Background(), store.PlacementNode{ID: "x", Endpoint: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if s.Requests != 3 || s.Errors != 0 {
		t.Fatalf("sample %+v: three 404s", s)
	}
}
