package app_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

func testConfig(t testing.TB, url string) *config.Config {
	t.Helper()
	spec, err := backend.ParseSpec("fs=filesystem:" + t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &config.Config{
		Backends:    []backend.Spec{spec},
		DatabaseURL: url, Listen: "127.0.0.1:0", Datacenter: "local", NodeID: "test-" + strings.ReplaceAll(t.Name(), "/", "-"),
		DataDir: t.TempDir(), LogFormat: "text", ShutdownTimeout: 10 * time.Second,
		ClusterSecret: testClusterSecret, // shared by every node of a test cluster
		Queues:        map[string]int{"default": 2}, RiverUI: true,
	}
}

func get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The operational surface of a running API, then a graceful shutdown: the
// listener closes and Serve returns.
func TestAPIServesThenShutsDown(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := app.NewAPI(ctx, testConfig(t, d.URL), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()

	waitFor(t, func() bool { c, _ := get(t, a.URL()+"/readyz"); return c == 200 })
	if c, body := get(t, a.URL()+"/healthz"); c != 200 || !strings.Contains(body, `"ok"`) {
		t.Fatalf("healthz %d %s", c, body)
	}
	// The River UI needs admin on every repository (issue 6).
	if c, _ := get(t, a.URL()+"/riverui/"); c != 401 {
		t.Fatalf("riverui without a token: %d, want 401", c)
	}
	admin, _, err := store.New(d.Pool, nil).CreateToken(ctx, "admin", []auth.Grant{{Pattern: auth.AllRepositories, Permission: auth.Admin}})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", a.URL()+"/riverui/", nil)
	req.SetBasicAuth("admin", admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(strings.ToLower(string(b)), "<html") {
		t.Fatalf("riverui with an admin token: %d", resp.StatusCode)
	}
	if c, body := get(t, a.URL()+"/no/such/route"); c != 404 || !strings.Contains(body, `"code": "not_found"`) {
		t.Fatalf("unknown route: %d %s", c, body)
	}
	_, metrics := get(t, a.URL()+"/metrics")
	for _, want := range []string{
		`blobplane_http_requests_total{method="GET",route="/healthz",status="200"} 1`,
		`blobplane_http_requests_total{method="GET",route="unmatched",status="404"} 1`,
		`blobplane_http_request_duration_seconds_bucket{method="GET",route="/readyz"`,
		"go_goroutines", "process_cpu_seconds_total",
		// The caches' series (their counting is store's tests').
		`blobplane_cache_misses_total{cache="auth"}`, `blobplane_cache_listening{cache="auth"}`,
		`blobplane_cache_hits_total{cache="existence"}`, `blobplane_cache_invalidations_total{cache="existence"}`,
		// Batching's (counted by store's tests).
		`blobplane_batches_total{path="finalize"} 0`, `blobplane_batched_calls_total{path="finalize"} 0`, `blobplane_batch_fallbacks_total{path="finalize"} 0`,
		`blobplane_batches_total{path="claim"} 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s\n%s", want, metrics)
		}
	}

	cancel()
	// Shutdown has begun once the listener refuses new connections.
	waitFor(t, func() bool {
		c, err := net.Dial("tcp", a.Addr())
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return after the in-flight request finished")
	}
}

func TestReadyzRefusesUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := app.NewAPI(ctx, testConfig(t, d.URL), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// Roll goose back one step: the schema is now behind this build. (The
	// router is served directly; Serve would need the nodes table.)
	if _, err := d.Pool.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id = (SELECT max(version_id) FROM goose_db_version)`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	waitFor(t, func() bool { c, _ := get(t, a.URL()+"/healthz"); return c == 200 })
	c, body := get(t, a.URL()+"/readyz")
	if c != 503 || !strings.Contains(body, `"code": "unavailable"`) || !strings.Contains(body, "migrate") {
		t.Fatalf("readyz on a stale schema: %d %s", c, body)
	}
	cancel()
	<-done
}

func TestNewAPIRefusesBusyListener(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := testConfig(t, d.URL)
	cfg.Listen = ln.Addr().String()
	_, err = app.NewAPI(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "BLOBPLANE_LISTEN") {
		t.Fatalf("busy listener: %v", err)
	}
}

// The worker runs cron-scheduled periodic jobs (here node_prune every second,
// also on start) and stops cleanly.
func TestWorkerRunsPeriodicJobs(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := d.Pool.Exec(ctx, `INSERT INTO nodes (node_id, datacenter, role, heartbeat_at, reads_format, reads_format_started_at) VALUES ('gone', 'local', 'api', now() - interval '1 hour', 2, now())`); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, d.URL)
	cfg.Cron = map[string]string{"node_prune": "@every 1s"}
	done := make(chan error, 1)
	go func() { done <- app.RunWorker(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	waitFor(t, func() bool {
		var completed int
		d.Pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'node_prune' AND state = 'completed'`).Scan(&completed)
		return completed >= 1
	})
	var state string
	if err := d.Pool.QueryRow(ctx, `SELECT state FROM nodes WHERE node_id = 'gone'`).Scan(&state); err != nil || state != "down" {
		t.Fatalf("stale node after node_prune: %q (%v)", state, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("worker did not stop")
	}
	d.Pool.QueryRow(context.Background(), `SELECT state FROM nodes WHERE node_id = $1`, cfg.NodeID).Scan(&state)
	if state != "down" {
		t.Fatalf("worker node after clean stop: %q, want down", state)
	}
}

func TestWorkerRefusesUnknownCronJob(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, "postgres://unused@127.0.0.1:1/x")
	cfg.Cron = map[string]string{"nonsense": "@every 1s"}
	err := app.RunWorker(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "BLOBPLANE_CRON") || !strings.Contains(err.Error(), "node_prune") {
		t.Fatalf("unknown cron job: %v", err)
	}
}

// waitFor polls cond until it holds or a deadline passes (no bare sleeps).
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met before the deadline")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNewAPIRefusesUnusableBackend(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	file := t.TempDir() + "/not-a-dir"
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, d.URL)
	spec, err := backend.ParseSpec("blobs=filesystem:" + file)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Backends = []backend.Spec{spec}
	_, err = app.NewAPI(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "BLOBPLANE_BACKENDS") || !strings.Contains(err.Error(), "blobs") {
		t.Fatalf("unusable backend: %v", err)
	}
}

// The api and the worker log each backend with the sync mode it resolved
// to, and its direct=<bytes> when set.
func TestBackendsDescribe(t *testing.T) {
	dir := t.TempDir()
	var specs []backend.Spec
	for _, s := range []string{"a=filesystem:" + filepath.Join(dir, "a") + "?sync=file", "b=filesystem:" + filepath.Join(dir, "b"), "c=filesystem:" + filepath.Join(dir, "c") + "?sync=file&direct=67108864"} {
		spec, err := backend.ParseSpec(s)
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, spec)
	}
	bs, err := app.OpenBackends(t.Context(), specs)
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	got := bs.Describe()
	if len(got) != 3 || got[0] != "a=filesystem(sync=file)" || !strings.HasPrefix(got[1], "b=filesystem(sync=") || strings.Contains(got[1], "direct") ||
		got[2] != "c=filesystem(sync=file,direct=67108864)" {
		t.Fatalf("Describe = %q", got)
	}
}
