package app_test

import (
	"context"
	"log/slog"
	"net/http"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/placement"
)

// Flow 3 (issue 28): a blob published in eu-1 is copied into us-1 by a
// us-1 worker, which reads it from an eu-1 node through the signed
// internal endpoint and verifies it on arrival; the ledger shows the
// verified copy, and us-1 serves the blob from its own backend.
func TestReplicationAcrossDatacenters(t *testing.T) {
	c := startTwoDatacenters(t)

	repo, content := c.repos[0], "a layer that must live in two datacenters"
	d := digestOf(content)
	if resp, body := c.send(t, "POST", c.nodes[0].URL()+"/v2/"+repo+"/blobs/uploads/?digest="+d, content, nil); resp.StatusCode != http.StatusCreated {
		t.Fatalf("upload in eu-1: %d %s", resp.StatusCode, body)
	}
	t.Cleanup(func() {
		if t.Failed() {
			rows, _ := c.d.Pool.Query(context.Background(), `SELECT kind, queue, state, attempt, coalesce(errors::text, '') FROM river_job`)
			for rows.Next() {
				var k, q, s, e string
				var a int
				rows.Scan(&k, &q, &s, &a, &e)
				t.Logf("job %s %s %s %d %s", k, q, s, a, e)
			}
			ps, _ := c.st.Placements(context.Background(), blobplane.Digest(d))
			t.Logf("placements %+v", ps)
		}
	})
	waitFor(t, func() bool {
		ps, err := c.st.Placements(context.Background(), blobplane.Digest(d))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Datacenter == "us-1" && p.State == placement.Verified && p.Size == int64(len(content)) {
				return true
			}
		}
		return false
	})
	waitFor(t, func() bool {
		return c.count(t, `SELECT count(*) FROM river_job WHERE kind = 'replicate' AND queue = 'replicate_us-1' AND state = 'completed'`) == 1
	})
	resp, body := c.send(t, "GET", c.nodes[1].URL()+"/v2/"+repo+"/blobs/"+d, "", nil)
	if resp.StatusCode != http.StatusOK || body != content {
		t.Fatalf("read in us-1: %d %q", resp.StatusCode, body)
	}
}

// startTwoDatacenters is startHomeCluster with node-0 in eu-1 and node-1
// in us-1, and a us-1 worker on the us-1 api's backends (every node of a
// datacenter sees the same backends), stopped at cleanup.
func startTwoDatacenters(t testing.TB) *homeCluster {
	t.Helper()
	dcs := [2]string{"eu-1", "us-1"}
	c := startHomeCluster(t, func(i int, cfg *config.Config) { cfg.Datacenter = dcs[i] })
	wcfg := testConfig(t, c.d.URL)
	wcfg.NodeID, wcfg.Datacenter, wcfg.Backends = "worker-us-1", "us-1", c.cfgs[1].Backends
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.RunWorker(ctx, wcfg, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	return c
}

// The internal blob endpoint answers only signed node calls: a user's
// token, even an admin's, and an anonymous caller are refused.
func TestInternalBlobEndpointRefusesUsers(t *testing.T) {
	c := startHomeCluster(t)
	repo, content := c.repos[0], "not for users"
	d := digestOf(content)
	if resp, body := c.send(t, "POST", c.nodes[0].URL()+"/v2/"+repo+"/blobs/uploads/?digest="+d, content, nil); resp.StatusCode != http.StatusCreated {
		t.Fatalf("upload: %d %s", resp.StatusCode, body)
	}
	if resp, _ := c.send(t, "GET", c.nodes[0].URL()+"/internal/v1/blobs/"+d, "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a user's token on the internal blob endpoint: %d", resp.StatusCode)
	}
	resp, err := http.Get(c.nodes[0].URL() + "/internal/v1/blobs/" + d)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("anonymous on the internal blob endpoint: %d", resp.StatusCode)
	}
}
