package app_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/app"
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
