// Package testnode runs real api nodes (and a worker) in a test's
// process, on one pgtest database and a published, signed partition map
// giving each node one partition: what a client's end-to-end tests need
// (cmd/blobctl's). Each node has its own filesystem backend and data dir.
package testnode

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// ClusterSecret is every test cluster's node-to-node secret.
const ClusterSecret = "testnode-cluster-secret-0123456789abcdef"

// Cluster is n api nodes; node i is the home of Repos[i].
type Cluster struct {
	DB    *pgtest.DB
	Store *store.Store
	Nodes []*app.API
	// Repos[i] is a repository (team/app-<k>) whose home is Nodes[i]. It
	// does not exist until something creates it.
	Repos []string
	Map   *authority.Map
	// Signer signed Map; its key is published (a controller service can
	// sign the next maps with it).
	Signer authority.Signer
	// Backends[i] is node i's filesystem backend directory.
	Backends []string
	cfgs     []*config.Config
	stops    []func()
}

// Start starts n nodes, publishes the map and waits until each node is
// the home of its repository. Everything stops at tb's cleanup.
func Start(tb testing.TB, n int) *Cluster {
	tb.Helper()
	return start(tb, n, 0)
}

// StartWithStandbys is Start with a map that names standbys standbys of
// each partition (round-robin: node i+1 first), which the nodes follow.
func StartWithStandbys(tb testing.TB, n, standbys int) *Cluster {
	tb.Helper()
	return start(tb, n, standbys)
}

func start(tb testing.TB, n, standbys int) *Cluster {
	tb.Helper()
	d := pgtest.New(tb)
	c := &Cluster{DB: d, Store: store.New(d.Pool, nil), Nodes: make([]*app.API, n), Repos: make([]string, n),
		cfgs: make([]*config.Config, n), stops: make([]func(), n), Backends: make([]string, n)}
	for i := range n {
		c.cfgs[i], c.Backends[i] = nodeConfig(tb, d.URL, fmt.Sprintf("node-%d", i))
		c.start(tb, i)
	}
	tb.Cleanup(func() {
		for i := range c.stops {
			c.Stop(i)
		}
	})
	c.publish(tb, standbys)
	for i := range n {
		c.WaitHome(tb, i)
	}
	return c
}

// nodeConfig is a node's config and its backend's directory.
func nodeConfig(tb testing.TB, url, id string) (*config.Config, string) {
	dir := tb.TempDir()
	spec, err := backend.ParseSpec("fs=filesystem:" + dir)
	if err != nil {
		tb.Fatal(err)
	}
	return &config.Config{
		Backends:    []backend.Spec{spec},
		DatabaseURL: url, Listen: "127.0.0.1:0", Datacenter: "local", NodeID: id,
		DataDir: filepath.Join(tb.TempDir(), "data"), LogFormat: "text", ShutdownTimeout: 10 * time.Second,
		ClusterSecret: ClusterSecret, Queues: map[string]int{"default": 2},
	}, dir
}

// start runs node i (again, on its previous address once it has one).
func (c *Cluster) start(tb testing.TB, i int) {
	tb.Helper()
	if c.Nodes[i] != nil {
		c.cfgs[i].Listen = c.Nodes[i].Addr()
	}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.NewAPI(ctx, c.cfgs[i], slog.New(slog.DiscardHandler))
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	c.Nodes[i] = a
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	c.stops[i] = func() { cancel(); <-done }
}

// Stop shuts node i down: its lease is released, its address refuses.
func (c *Cluster) Stop(i int) {
	if c.stops[i] != nil {
		c.stops[i]()
		c.stops[i] = nil
	}
}

// Restart starts node i again on its address and waits until it is the
// home of Repos[i] again.
func (c *Cluster) Restart(tb testing.TB, i int) {
	tb.Helper()
	c.start(tb, i)
	c.WaitHome(tb, i)
}

// URL is node i's base URL.
func (c *Cluster) URL(i int) string { return c.Nodes[i].URL() }

// publish signs and publishes a map with one partition per node, and
// picks each node's repository.
func (c *Cluster) publish(tb testing.TB, standbys int) {
	tb.Helper()
	ctx := context.Background()
	pub, priv, _ := ed25519.GenerateKey(nil)
	now := time.Now()
	signer := authority.Signer{KeyID: "testnode-key", Key: priv}
	c.Signer = signer
	if err := c.Store.PublishSigningKey(ctx, authority.TrustedKey{KeyID: signer.KeyID, Alg: authority.SignatureAlg, PublicKey: pub,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour)}); err != nil {
		tb.Fatal(err)
	}
	nodes := make([]authority.NodeAddr, len(c.Nodes))
	owner := map[string]int{}
	for i, a := range c.Nodes {
		nodes[i] = authority.NodeAddr{Node: c.cfgs[i].NodeID, Endpoint: a.Addr()}
		owner[c.cfgs[i].NodeID] = i
	}
	m, err := authority.EvenSplit{Version: 1, GeneratedAt: now, Partitions: len(c.Nodes), State: authority.PrimaryServing, Epoch: 1,
		Class: "standard", Mode: authority.ModeDerived, Nodes: nodes, Standbys: standbys}.Build()
	if err != nil {
		tb.Fatal(err)
	}
	if err := signer.SignMap(m); err != nil {
		tb.Fatal(err)
	}
	if err := c.Store.PublishMap(ctx, m, nil); err != nil {
		tb.Fatal(err)
	}
	c.Map = m
	ix, err := authority.NewIndex(m)
	if err != nil {
		tb.Fatal(err)
	}
	for k, left := 0, len(c.Nodes); left > 0; k++ {
		repo := fmt.Sprintf("team/app-%d", k)
		r, err := ix.ResolveKey(repo)
		if err != nil {
			tb.Fatal(err)
		}
		if i := owner[r.Partition.Primary.Node]; c.Repos[i] == "" {
			c.Repos[i], left = repo, left-1
		}
	}
}

// WaitHome waits until node i answers as the home of Repos[i].
func (c *Cluster) WaitHome(tb testing.TB, i int) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(c.URL(i) + "/v1/home/" + c.Repos[i])
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("node %d did not become the home of %s: %v", i, c.Repos[i], err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Token issues a token for principal with grants ("team/*:write").
func (c *Cluster) Token(tb testing.TB, principal string, grants ...string) string {
	tb.Helper()
	gs, err := auth.ParseGrants(grants)
	if err != nil {
		tb.Fatal(err)
	}
	secret, _, err := c.Store.CreateToken(context.Background(), principal, gs)
	if err != nil {
		tb.Fatal(err)
	}
	return secret
}

// StartWorker runs a worker (finalize jobs, transfers, sweeps) until tb
// ends or the returned stop is called.
func (c *Cluster) StartWorker(tb testing.TB) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg, _ := nodeConfig(tb, c.DB.URL, "worker-0")
	go func() { done <- app.RunWorker(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				tb.Error(err)
			}
		}
	}
	tb.Cleanup(stop)
	return stop
}
