package app_test

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// ZBP-5 R85: an api whose shutdown phases cannot fit the platform's
// termination budget refuses to boot, naming the settings; one that fits
// boots.
func TestShutdownPhasesMustFitTheBudget(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ctx := context.Background()
	// A published map of 16 partitions, none on the node under test: it
	// may hold its even share, all 16 (it is the only api registered).
	st := store.New(d.Pool, nil)
	if _, err := st.RegisterNode(ctx, store.Node{ID: "other", Datacenter: "local", Role: "api", Endpoint: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	key, err := controller.Keygen(ctx, st, filepath.Join(t.TempDir(), "signing-key.json"), "", time.Now(), controller.DefaultKeyValidity)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := controller.Publish(ctx, st, key.Signer(), controller.PublishOptions{Partitions: 16}); err != nil {
		t.Fatal(err)
	}
	if err := st.MarkNodeDown(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name                   string
		drain, shutdown, limit time.Duration
		deadline               time.Duration
		refused                string
	}{
		{"phases over the budget", 20 * time.Second, 30 * time.Second, 30 * time.Second, 5 * time.Second, "BLOBPLANE_SHUTDOWN_BUDGET"},
		// 16 partitions, 4 at a time, 5 s each: up to 20 s > 10 s.
		{"handoffs over the drain", 10 * time.Second, time.Second, time.Minute, 5 * time.Second, "BLOBPLANE_DRAIN_TIMEOUT"},
		{"fits", 20 * time.Second, 10 * time.Second, time.Minute, 5 * time.Second, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, d.URL)
			cfg.DrainTimeout, cfg.ShutdownTimeout, cfg.ShutdownBudget, cfg.HandoffDeadline = tc.drain, tc.shutdown, tc.limit, tc.deadline
			a, err := app.NewAPI(ctx, cfg, slog.New(slog.DiscardHandler))
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("refused to boot: %v", err)
				}
				a.Close()
				return
			}
			if err == nil {
				a.Close()
				t.Fatal("booted with phases that cannot fit")
			}
			if !strings.Contains(err.Error(), tc.refused) || !strings.Contains(err.Error(), "R85") {
				t.Fatalf("error %q does not name %s and R85", err, tc.refused)
			}
		})
	}
}

// ZBP-5 R130: a partition over its capacity budget sheds at admission with
// a retryable answer, and nothing queues behind it. Held deterministically:
// a connection locks the home's lease row, so the first publication waits
// at its fence holding the partition's only slot; the second is shed (503,
// Retry-After); released, the first completes (201) and the second,
// retried, too.
func TestPartitionOverItsBudgetSheds(t *testing.T) {
	t.Parallel()
	c := startHomeCluster(t, func(i int, cfg *config.Config) { cfg.MaxPartitionWrites = 1 })
	ctx := context.Background()
	repo := c.repos[0]
	part, _ := c.homeOf(t, 0)
	tx, err := c.st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM leases WHERE partition_id = $1 FOR UPDATE`, part); err != nil {
		t.Fatal(err)
	}
	first, second := "held at the fence", "shed at admission"
	type answer struct {
		status int
		body   string
	}
	done := make(chan answer, 1)
	go func() {
		resp, body := c.send(t, "POST", c.nodes[0].URL()+"/v2/"+repo+"/blobs/uploads/?digest="+digestOf(first), first, nil)
		done <- answer{resp.StatusCode, body}
	}()
	// The first publication waits on the row lock: seen from Postgres.
	waitFor(t, func() bool {
		var n int
		_ = c.st.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return n > 0
	})
	resp, body := c.send(t, "POST", c.nodes[0].URL()+"/v2/"+repo+"/blobs/uploads/?digest="+digestOf(second), second, nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "capacity budget") {
		t.Fatalf("over the budget: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if a := <-done; a.status != http.StatusCreated {
		t.Fatalf("the held publication: %d %s", a.status, a.body)
	}
	if resp, body := c.send(t, "POST", c.nodes[0].URL()+"/v2/"+repo+"/blobs/uploads/?digest="+digestOf(second), second, nil); resp.StatusCode != http.StatusCreated {
		t.Fatalf("the shed upload retried: %d %s", resp.StatusCode, body)
	}
	_, metrics := get(t, c.nodes[0].URL()+"/metrics")
	if !strings.Contains(metrics, "blobplane_partition_writes_shed_total 1") {
		t.Fatal("the shed write is not counted")
	}
}
