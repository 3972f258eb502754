package app_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/client"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// cluster is two api nodes on one Postgres with a signed two-partition map
// giving one partition to each.
type cluster struct {
	st     *store.Store
	nodes  [2]*app.API
	signer authority.Signer
	m      *authority.Map
	// repos[i] is a repository whose home is nodes[i].
	repos [2]string
}

func startCluster(t testing.TB) *cluster {
	t.Helper()
	d := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	c := &cluster{st: store.New(d.Pool, nil)}
	done := make(chan error, 2)
	for i := range c.nodes {
		cfg := testConfig(t, d.URL)
		cfg.NodeID = fmt.Sprintf("node-%d", i)
		a, err := app.NewAPI(ctx, cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		c.nodes[i] = a
		go func() { done <- a.Serve(ctx) }()
	}
	t.Cleanup(func() {
		cancel()
		for range c.nodes {
			<-done
		}
	})

	c.publishTwoPartitionMap(t)
	// Both nodes adopt the map (NOTIFY) and acquire their partitions.
	waitFor(t, func() bool {
		for i, a := range c.nodes {
			code, _, _ := c.do(t, a, c.repos[i], nil)
			if code != http.StatusOK {
				return false
			}
		}
		return true
	})
	return c
}

// publishTwoPartitionMap signs and publishes map 1 giving one partition to
// each node, and picks a repository homed on each (c.repos).
func (c *cluster) publishTwoPartitionMap(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	pub, priv, _ := ed25519.GenerateKey(nil)
	now := time.Now()
	c.signer = authority.Signer{KeyID: "test-key", Key: priv}
	if err := c.st.PublishSigningKey(ctx, authority.TrustedKey{KeyID: "test-key", Alg: authority.SignatureAlg, PublicKey: pub, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	m, err := authority.EvenSplit{
		Version: 1, GeneratedAt: now, Partitions: 2, State: authority.PrimaryServing, Epoch: 1, Class: "standard", Mode: authority.ModeDerived,
		Nodes: []authority.NodeAddr{{Node: "node-0", Endpoint: c.nodes[0].Addr()}, {Node: "node-1", Endpoint: c.nodes[1].Addr()}},
	}.Build()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.signer.SignMap(m); err != nil {
		t.Fatal(err)
	}
	if err := c.st.PublishMap(ctx, m, nil); err != nil {
		t.Fatal(err)
	}
	c.m = m
	ix, err := authority.NewIndex(m)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; c.repos[0] == "" || c.repos[1] == ""; i++ {
		repo := fmt.Sprintf("team/app-%d", i)
		r, err := ix.ResolveKey(repo)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		if r.Partition.Primary.Node == "node-1" {
			n = 1
		}
		if c.repos[n] == "" {
			c.repos[n] = repo
		}
	}
}

func (c *cluster) do(t testing.TB, a *app.API, repo string, hdr map[string]string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, a.URL()+"/v1/home/"+repo, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func envelope(t testing.TB, body string) *authority.Envelope {
	t.Helper()
	env, err := authority.ParseEnvelope([]byte(body))
	if err != nil {
		t.Fatalf("not a routing envelope: %v\n%s", err, body)
	}
	return env
}

// V4 through real HTTP between two api nodes on one Postgres: every row of
// the routing decision table (R99–R102).
func TestV4_RoutingTableOverHTTP(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	home, other := c.nodes[0], c.nodes[1]
	repo := c.repos[0]
	slot := strconv.FormatUint(uint64(authority.SlotOf(repo, c.m.SlotBits)), 10)
	hdr := func(version uint64) map[string]string {
		return map[string]string{"Blobplane-Slot": slot, "Blobplane-Map-Version": strconv.FormatUint(version, 10)}
	}

	t.Run("R99 owner serves whatever the client's version", func(t *testing.T) {
		for _, v := range []uint64{0, 1, 99} {
			code, h, body := c.do(t, home, repo, hdr(v))
			if code != 200 || h.Get("Blobplane-Partition") == "" || h.Get("Blobplane-Epoch") == "" || !strings.Contains(body, `"node_id": "node-0"`) {
				t.Fatalf("client version %d: %d %v %s", v, code, h, body)
			}
		}
	})
	t.Run("R101 not owner, my map newer: MOVED with the assignment", func(t *testing.T) {
		code, _, body := c.do(t, other, repo, hdr(0))
		env := envelope(t, body)
		if code != 421 || env.Code != authority.RouteMoved || env.Assignment == nil || env.Assignment.Primary.Node != "node-0" || env.Assignment.Primary.Endpoint != home.Addr() {
			t.Fatalf("%d %s", code, body)
		}
	})
	t.Run("R101 not owner, same version: MISROUTED without assignment", func(t *testing.T) {
		code, _, body := c.do(t, other, repo, hdr(1))
		env := envelope(t, body)
		if code != 421 || env.Code != authority.RouteMisrouted || env.Assignment != nil {
			t.Fatalf("%d %s", code, body)
		}
	})
	t.Run("R101 R102 not owner, my map older: STALE_MAP, never a redirect", func(t *testing.T) {
		code, h, body := c.do(t, other, repo, hdr(7))
		env := envelope(t, body)
		if code != 503 || env.Code != authority.RouteStaleMap || env.Assignment != nil || env.RetryAfterMS == nil || h.Get("Retry-After") == "" {
			t.Fatalf("%d %s", code, body)
		}
	})
	t.Run("A.2 slot disagreement: MISROUTED", func(t *testing.T) {
		bad := hdr(1)
		bad["Blobplane-Slot"] = strconv.FormatUint((uint64(authority.SlotOf(repo, c.m.SlotBits))+1)%4096, 10)
		code, _, body := c.do(t, home, repo, bad)
		if env := envelope(t, body); code != 421 || env.Code != authority.RouteMisrouted {
			t.Fatalf("%d %s", code, body)
		}
	})
	t.Run("malformed routing headers are invalid", func(t *testing.T) {
		code, _, body := c.do(t, home, repo, map[string]string{"Blobplane-Map-Version": "one"})
		if code != 400 || !strings.Contains(body, `"code": "invalid"`) {
			t.Fatalf("%d %s", code, body)
		}
	})
	t.Run("R105 MISROUTED is counted", func(t *testing.T) {
		_, _, metrics := getMetrics(t, other)
		if !strings.Contains(metrics, `blobplane_routing_decisions_total{outcome="MISROUTED"}`) {
			t.Fatalf("no MISROUTED counter:\n%s", metrics)
		}
	})
	t.Run("R131 partitions show owner, epoch and lease expiry", func(t *testing.T) {
		resp, err := http.Get(other.URL() + "/v1/partitions")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			MapVersion uint64 `json:"map_version"`
			Partitions []struct {
				ID             string     `json:"id"`
				Epoch          uint64     `json:"epoch"`
				State          string     `json:"state"`
				Node           string     `json:"node"`
				LeaseExpiresAt *time.Time `json:"lease_expires_at"`
			} `json:"partitions"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		if body.MapVersion != 1 || len(body.Partitions) != 2 {
			t.Fatalf("%+v", body)
		}
		for _, p := range body.Partitions {
			if p.State != "SERVING" || p.Epoch < 1 || p.LeaseExpiresAt == nil || (p.Node != "node-0" && p.Node != "node-1") {
				t.Fatalf("partition %+v", p)
			}
		}
	})
	t.Run("map endpoints", func(t *testing.T) {
		for path, want := range map[string]int{"/v1/map": 200, "/v1/map?version=1": 200, "/v1/map?version=9": 404, "/v1/map/keys": 200, "/v1/map/delta?since=x": 400} {
			resp, err := http.Get(home.URL() + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
			}
		}
	})
	t.Run("R133 R134 R139 alarms", func(t *testing.T) {
		// Both partitions are owned and serving; nobody claims a partition
		// twice; the oldest version in use is the current one once both
		// nodes have reported (heartbeat) — a client presented version 7
		// above, but only versions > 0 that are older count.
		_, _, metrics := getMetrics(t, home)
		for _, want := range []string{
			"blobplane_unowned_slots 0", "blobplane_unowned_partitions 0", "blobplane_duplicate_primaries 0",
			"blobplane_map_oldest_version_in_use ", "blobplane_map_rejections_total 0", "blobplane_map_version 1",
			// Issue 31 point 6: which build, the Postgres pools, River's queues.
			`blobplane_build_info{binary="api",commit=`, `blobplane_db_pool_connections{pool="leases",state="acquired"}`,
			`blobplane_db_pool_max_connections{pool="main"}`, "blobplane_db_pool_acquire_wait_seconds_total", "blobplane_river_jobs_scrape_errors_total 0",
		} {
			if !strings.Contains(metrics, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
		// Claim partition 0 for a third node at the epoch node-0 holds:
		// the duplicate alarm fires. Stop node-0's lease: slots unowned.
		part := ""
		for _, p := range c.m.Partitions {
			if p.Primary.Node == "node-0" {
				part = p.ID
			}
		}
		l, err := c.st.Lease(context.Background(), part)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := c.st.RegisterNode(ctx, store.Node{ID: "intruder", Datacenter: "local", Role: "api", Endpoint: "127.0.0.1:9"}); err != nil {
			t.Fatal(err)
		}
		if err := c.st.ReportNode(ctx, "intruder", 1, []authority.PrimaryReport{{Partition: part, Epoch: l.Epoch}}); err != nil {
			t.Fatal(err)
		}
		if err := c.st.ReportNode(ctx, "node-0", 1, []authority.PrimaryReport{{Partition: part, Epoch: l.Epoch}}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.st.Pool().Exec(ctx, `UPDATE leases SET expires_at = now() - interval '1 second' WHERE partition_id = $1`, part); err != nil {
			t.Fatal(err)
		}
		_, _, metrics = getMetrics(t, other)
		for _, want := range []string{"blobplane_duplicate_primaries 1", "blobplane_unowned_partitions 1", "blobplane_unowned_slots 2048"} {
			if !strings.Contains(metrics, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
	})
}

// The Go client resolves locally, follows MOVED after applying the signed
// delta (R103), and fails fast on MISROUTED (R105).
func TestClientFollowsSignedDeltaAndCountsMisrouted(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := context.Background()
	cl := client.New(client.Config{Seed: c.nodes[1].URL()})
	get := func(repo string) (int, string, error) {
		resp, err := cl.Do(ctx, repo, func(ctx context.Context, base string) (*http.Request, error) {
			return http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/home/"+repo, nil)
		})
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	for i, repo := range c.repos {
		code, body, err := get(repo)
		if err != nil || code != 200 || !strings.Contains(body, fmt.Sprintf(`"node_id": "node-%d"`, i)) {
			t.Fatalf("%s: %d %s %v", repo, code, body, err)
		}
	}

	// Map 2 changes nothing the client needs; map 3 swaps the partitions'
	// primaries, with signed deltas from 2 and from 1 (controller.Publish
	// stores one from each recent version). The client still holds map 1,
	// two versions behind, so it goes to the old home, which answers MOVED
	// carrying the delta from 1; the client applies it and retries.
	mid := *c.m
	mid.Version, mid.GeneratedAt, mid.Signature = 2, time.Now(), nil
	if err := c.signer.SignMap(&mid); err != nil {
		t.Fatal(err)
	}
	midDelta, err := authority.Diff(c.m, &mid)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.signer.SignDelta(midDelta); err != nil {
		t.Fatal(err)
	}
	if err := c.st.PublishMap(ctx, &mid, midDelta); err != nil {
		t.Fatal(err)
	}
	m2 := *c.m
	m2.Version, m2.GeneratedAt, m2.Signature = 3, time.Now(), nil
	m2.Partitions = append([]authority.Partition(nil), c.m.Partitions...)
	for i := range m2.Partitions {
		p := &m2.Partitions[i]
		other := c.nodes[0]
		if p.Primary.Node == "node-0" {
			other = c.nodes[1]
		}
		p.Primary = authority.Primary{Node: other.Keeper().NodeID(), Endpoint: other.Addr(), State: authority.PrimaryServing}
		p.Epoch++
	}
	if err := c.signer.SignMap(&m2); err != nil {
		t.Fatal(err)
	}
	var deltas []*authority.Delta
	for _, base := range []*authority.Map{&mid, c.m} {
		delta, err := authority.Diff(base, &m2)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.signer.SignDelta(delta); err != nil {
			t.Fatal(err)
		}
		deltas = append(deltas, delta)
	}
	if err := c.st.PublishMap(ctx, &m2, deltas...); err != nil {
		t.Fatal(err)
	}
	// Wait until node-1 serves repos[0] (it took the partition over after
	// node-0 released it).
	waitFor(t, func() bool {
		code, _, _ := c.do(t, c.nodes[1], c.repos[0], nil)
		return code == 200
	})
	// The old home's MOVED to a client at version 1 carries the signed
	// delta from 1 to 3 (R103), not only the one from 2.
	req, _ := http.NewRequest(http.MethodGet, c.nodes[0].URL()+"/v1/home/"+c.repos[0], nil)
	req.Header.Set("Blobplane-Map-Version", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var env authority.Envelope
	err = json.NewDecoder(resp.Body).Decode(&env)
	resp.Body.Close()
	if err != nil || resp.StatusCode != authority.StatusMoved || env.MapDelta == nil ||
		env.MapDelta.BaseVersion != 1 || env.MapDelta.Version != 3 || env.MapDelta.Signature == nil {
		t.Fatalf("MOVED to a client two versions behind: %d %+v %v", resp.StatusCode, env, err)
	}
	code, body, err := get(c.repos[0])
	if err != nil || code != 200 || !strings.Contains(body, `"node_id": "node-1"`) {
		t.Fatalf("after the move: %d %s %v", code, body, err)
	}
	if cl.MapVersion() != 3 {
		t.Fatalf("client map version %d, want 3 (applied from the MOVED delta)", cl.MapVersion())
	}
	if cl.Misrouted() != 0 {
		t.Fatalf("misrouted %d", cl.Misrouted())
	}
}

func getMetrics(t testing.TB, a *app.API) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(a.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// R105: a MISROUTED answer fails the call at once (never retried) and is
// counted. Map 2 names node-0 as primary but publishes node-1's address, so
// a client holding map 2 reaches node-1, which holds the same map version
// and is not the owner.
func TestClientFailsFastOnMisrouted(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := context.Background()
	m2 := *c.m
	m2.Version, m2.GeneratedAt, m2.Signature = 2, time.Now(), nil
	m2.Partitions = append([]authority.Partition(nil), c.m.Partitions...)
	for i := range m2.Partitions {
		if p := &m2.Partitions[i]; p.Primary.Node == "node-0" {
			p.Primary.Endpoint = c.nodes[1].Addr()
		}
	}
	if err := c.signer.SignMap(&m2); err != nil {
		t.Fatal(err)
	}
	if err := c.st.PublishMap(ctx, &m2, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return c.nodes[1].Keeper().Map().Version() == 2 })
	cl := client.New(client.Config{Seed: c.nodes[1].URL()})
	calls := 0
	_, err := cl.Do(ctx, c.repos[0], func(ctx context.Context, base string) (*http.Request, error) {
		calls++
		return http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/home/"+c.repos[0], nil)
	})
	if !errors.Is(err, authority.ErrHashDisagreement) {
		t.Fatalf("err = %v, want a hash disagreement", err)
	}
	if calls != 1 || cl.Misrouted() != 1 {
		t.Fatalf("calls %d misrouted %d: MISROUTED must fail at once and be counted", calls, cl.Misrouted())
	}
}
