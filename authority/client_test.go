package authority

import (
	"errors"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
)

// network is an in-memory stand-in for the transport: endpoint → server.
type network map[string]*Server

// do runs one logical request through the client loop of A.1 and returns
// the endpoint that served it, the steps taken, and the final error.
func (n network) do(t *testing.T, c *Client, key string, fetch func() *Map) (string, []Step, error) {
	t.Helper()
	redirects := 0
	var steps []Step
	for range 20 { // the client's own bound must stop it well before this
		tg, err := c.Target(key)
		if err != nil {
			return "", steps, err
		}
		srv := n[tg.Endpoint]
		d := srv.Decide(Request{Key: tg.Key, Slot: tg.Slot, SlotBits: tg.SlotBits, MapVersion: tg.MapVersion})
		if d.Outcome == Serve {
			return tg.Endpoint, steps, nil
		}
		st := c.OnAnswer(d.Envelope, redirects, sep1)
		steps = append(steps, st)
		redirects = st.Redirects
		switch st.Action {
		case Fail:
			return "", steps, st.Err
		case FetchMap:
			if _, err := c.Install(fetch(), sep1); err != nil && !errors.Is(err, ErrNotNewer) {
				return "", steps, err
			}
		}
	}
	t.Fatal("client loop did not terminate")
	return "", nil, nil
}

func (rf *routeFixture) network(leases map[string]map[string]LeaseState, maps map[string]*VerifiedMap) network {
	n := network{}
	for node, ep := range map[string]string{"n_00": "10.0.0.1:7443", "n_01": "10.0.1.1:7443"} {
		n[ep] = rf.server(node, maps[node], leases[node])
	}
	return n
}

func newTestClient(rf *routeFixture, max int) *Client {
	return NewClient(rf.f.verifier, ClientConfig{MaxRedirects: max, NotReadyRetry: 50 * time.Millisecond, RefreshEvery: time.Minute, RefreshJitter: 0.2})
}

// TestR103_StaleMapClientFollowsSignedDelta: a client at 1487 reaches the
// old primary, which holds 1488; MOVED carries a signed delta; the client
// verifies, applies it, and the retry lands on the new primary.
func TestR103_StaleMapClientFollowsSignedDelta(t *testing.T) {
	t.Parallel()
	rf := setupRoute(t)
	net := rf.network(map[string]map[string]LeaseState{
		"n_01": {rf.partition: {Held: true, Epoch: rf.epoch1487 + 1, Serving: true}},
	}, map[string]*VerifiedMap{"n_00": rf.v1488, "n_01": rf.v1488})
	c := newTestClient(rf, 3)
	if _, err := c.Install(rf.v1487.Map(), sep1); err != nil {
		t.Fatal(err)
	}
	ep, steps, err := net.do(t, c, testKey, nil)
	if err != nil || ep != "10.0.1.1:7443" {
		t.Fatalf("served by %q, err %v, steps %+v", ep, err, steps)
	}
	if len(steps) != 1 || steps[0].Action != RetryNow || steps[0].Redirects != 1 {
		t.Fatalf("steps %+v", steps)
	}
	if c.Map().Version() != 1488 {
		t.Fatalf("client map %d after delta", c.Map().Version())
	}
}

// TestR101_ServerWithStaleMapAnswersStaleMap: the client is ahead; the old
// primary (still at 1487, lease lost) must not redirect it back (R102).
func TestR102_ServerBehindClientNeverRedirects(t *testing.T) {
	t.Parallel()
	rf := setupRoute(t)
	c := newTestClient(rf, 3)
	if _, err := c.Install(rf.v1488.Map(), sep1); err != nil {
		t.Fatal(err)
	}
	// n_01 is named by 1488 but its node has only 1487 and no lease yet:
	// the map says n_00, so n_01 is not the owner and its map is older.
	s := rf.server("n_01", rf.v1487, nil)
	tg, _ := c.Target(testKey)
	d := s.Decide(Request{Key: tg.Key, Slot: tg.Slot, MapVersion: tg.MapVersion})
	if d.Outcome != StaleMap {
		t.Fatalf("%v", d.Outcome)
	}
	st := c.OnAnswer(d.Envelope, 0, sep1)
	if st.Action != RetryAfter || st.After != 100*time.Millisecond || st.Redirects != 0 {
		t.Fatalf("step %+v", st)
	}
}

func TestR104_RedirectBound(t *testing.T) {
	t.Parallel()
	rf := setupRoute(t)
	c := newTestClient(rf, 3)
	if _, err := c.Install(rf.v1488.Map(), sep1); err != nil {
		t.Fatal(err)
	}
	// A server that keeps answering MOVED (here with no usable delta) is
	// followed at most MaxRedirects times for one logical request.
	env := &Envelope{Code: RouteMoved, Slot: 1, MapVersion: 9999}
	redirects := 0
	for i := 1; ; i++ {
		st := c.OnAnswer(env, redirects, sep1)
		redirects = st.Redirects
		if st.Action == Fail {
			wantErr(t, st.Err, ErrRedirectLoop)
			if i != 4 || !blobplane.IsRetryable(st.Err) {
				t.Fatalf("failed after %d answers, retryable=%v", i, blobplane.IsRetryable(st.Err))
			}
			return
		}
		if st.Action != FetchMap {
			t.Fatalf("step %+v", st)
		}
	}
}

func TestR105_MisroutedIsNotRetried(t *testing.T) {
	t.Parallel()
	rf := setupRoute(t)
	c := newTestClient(rf, 3)
	_, _ = c.Install(rf.v1488.Map(), sep1)
	// A node that agrees on the map but is not the owner: MISROUTED.
	net := network{"10.0.1.1:7443": rf.server("n_09", rf.v1488, nil)}
	_, steps, err := net.do(t, c, testKey, nil)
	wantErr(t, err, ErrHashDisagreement)
	if len(steps) != 1 || blobplane.IsRetryable(err) {
		t.Fatalf("MISROUTED retried or retryable: %+v", steps)
	}
}

func TestR103_ForgedOrUnsignedDeltaIsDiscarded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		delta   func(rf *routeFixture) *Delta
		counted uint64
	}{
		{"forged_endpoint", func(rf *routeFixture) *Delta {
			d := *rf.delta
			d.Changed = []Partition{rf.delta.Changed[0].Clone()}
			d.Changed[0].Primary.Endpoint = "10.6.6.6:7443" // hijack attempt
			return &d
		}, 1},
		{"unsigned", func(rf *routeFixture) *Delta {
			d := *rf.delta
			d.Signature = nil
			return &d
		}, 0},
		{"rogue_key", func(rf *routeFixture) *Delta {
			d := *rf.delta
			_ = newKey(t, "rogue", 66, aug1, dec31).signer.SignDelta(&d)
			return &d
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rf := setupRoute(t)
			c := newTestClient(rf, 3)
			_, _ = c.Install(rf.v1487.Map(), sep1)
			env := &Envelope{Code: RouteMoved, Slot: 3143, MapVersion: 1488,
				Assignment: &Assignment{Partition: rf.partition, Primary: AssignedNode{Node: "evil", Endpoint: "10.6.6.6:7443"}},
				MapDelta:   tc.delta(rf)}
			st := c.OnAnswer(env, 0, sep1)
			if st.Action != FetchMap || c.Map().Version() != 1487 {
				t.Fatalf("step %+v, map %d", st, c.Map().Version())
			}
			if got := rf.f.verifier.Rejected(); got != tc.counted {
				t.Fatalf("rejections = %d, want %d", got, tc.counted)
			}
			tg, _ := c.Target(testKey)
			if tg.Endpoint == "10.6.6.6:7443" {
				t.Fatal("client routed by an unverified assignment")
			}
		})
	}
}

func TestA1_TargetNoMapAndNotReady(t *testing.T) {
	t.Parallel()
	rf := setupRoute(t)
	c := newTestClient(rf, 3)
	_, err := c.Target(testKey)
	wantErr(t, err, ErrNoMap)
	m := rf.v1488.Map().Clone()
	m.Version = 1490
	m.Partition(rf.partition).Primary.State = PrimaryCatchingUp
	_ = rf.f.aug.signer.SignMap(m)
	if _, err := c.Install(m, sep1); err != nil {
		t.Fatal(err)
	}
	tg, err := c.Target(testKey)
	wantErr(t, err, ErrNotReady)
	if RetryAfterOf(err) != 50*time.Millisecond || tg.Node != "n_01" || tg.MapVersion != 1490 {
		t.Fatalf("target %+v retry %v", tg, RetryAfterOf(err))
	}
	// R12 via Install: a tampered newer map is rejected and the cache kept.
	bad := m.Clone()
	bad.Version = 1491
	if _, err := c.Install(bad, sep1); !errors.Is(err, ErrTampered) || c.Map().Version() != 1490 {
		t.Fatalf("install tampered: %v, map %d", err, c.Map().Version())
	}
}

func TestR106_JitteredRefresh(t *testing.T) {
	t.Parallel()
	base := time.Minute
	if got := JitteredInterval(base, 0.2, 0); got != 48*time.Second {
		t.Fatalf("low end %v", got)
	}
	if got := JitteredInterval(base, 0.2, 0.5); got != base {
		t.Fatalf("middle %v", got)
	}
	if got := JitteredInterval(base, 0.2, 0.999999); got >= 72*time.Second || got < 71*time.Second {
		t.Fatalf("high end %v", got)
	}
	if got := JitteredInterval(base, 5, 2); got <= 0 || got >= 2*base {
		t.Fatalf("clamped %v", got)
	}
	c := NewClient(nil, ClientConfig{RefreshEvery: base, RefreshJitter: 0.1})
	seen := map[time.Duration]bool{}
	for i := range 100 {
		seen[c.NextRefresh(float64(i)/100)] = true
	}
	if len(seen) < 90 {
		t.Fatalf("refresh intervals not spread: %d distinct", len(seen))
	}
}
