package app_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// BLOBPLANE_ADVERTISE_URL (issue 28): the api registers the advertised
// address, not its listener's, so the nodes table, the map the controller
// publishes and the leases the node takes all name it; without the
// setting, a listener on every interface advertises the hostname.
func TestAPIAdvertisesConfiguredURL(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	st := store.New(d.Pool, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	defer func() {
		cancel()
		<-done
		<-done
	}()

	cfg := testConfig(t, d.URL)
	cfg.NodeID = "api-eu-1"
	cfg.AdvertiseURL = "http://api-eu-1.example.internal:7000"
	a, err := app.NewAPI(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- a.Serve(ctx) }()
	const want = "api-eu-1.example.internal:7000"
	if a.Advertised() != want {
		t.Fatalf("advertised %q, want %q", a.Advertised(), want)
	}

	// Every interface, no setting: the hostname and the bound port.
	wild := testConfig(t, d.URL)
	wild.NodeID, wild.Listen = "api-wild", "0.0.0.0:0"
	b, err := app.NewAPI(ctx, wild, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- b.Serve(ctx) }()
	host, _ := os.Hostname()
	_, port, _ := net.SplitHostPort(b.Addr())
	if host != "" && b.Advertised() != net.JoinHostPort(host, port) {
		t.Fatalf("listening on %s advertises %q, want the hostname %s with port %s", b.Addr(), b.Advertised(), host, port)
	}

	endpoints := func() map[string]string {
		nodes, err := st.ListNodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, n := range nodes {
			m[n.ID] = n.Endpoint
		}
		return m
	}
	waitFor(t, func() bool { e := endpoints(); return e["api-eu-1"] != "" && e["api-wild"] != "" })
	if e := endpoints(); e["api-eu-1"] != want || e["api-wild"] != b.Advertised() {
		t.Fatalf("nodes table endpoints %v, want api-eu-1=%s api-wild=%s", e, want, b.Advertised())
	}

	// The controller publishes what the nodes registered; the keeper
	// takes its leases under the same address.
	key, err := controller.Keygen(ctx, st, filepath.Join(t.TempDir(), "signing-key.json"), "", time.Now(), controller.DefaultKeyValidity)
	if err != nil {
		t.Fatal(err)
	}
	m, err := controller.Publish(ctx, st, key.Signer(), controller.PublishOptions{Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Partitions {
		if ep := map[string]string{"api-eu-1": want, "api-wild": b.Advertised()}[p.Primary.Node]; p.Primary.Endpoint != ep {
			t.Errorf("map: partition %s primary %s at %q, want %q", p.ID, p.Primary.Node, p.Primary.Endpoint, ep)
		}
	}
	waitFor(t, func() bool {
		leases, err := st.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range leases {
			if l.OwnerNode == "api-eu-1" {
				if l.OwnerEndpoint != want {
					t.Fatalf("lease %s held by api-eu-1 at %q, want %q", l.Partition, l.OwnerEndpoint, want)
				}
				n++
			}
		}
		return n > 0
	})
}
