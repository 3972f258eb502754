package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Blobplane as the bench runs it: the real binaries as subprocesses, the
// way scripts/run.sh starts them, on a fresh database and a fresh data dir,
// filesystem backend, auth on.
const (
	bpRepo       = "bench/blobs"
	bpPrincipal  = "bench"
	bpDatacenter = "local"
	bpBackend    = "fs"
)

// blobplane is a running api plus what the Blobplane-only workloads need.
type blobplane struct {
	*ociClient
	bin  string // directory holding api, worker, controller
	env  []string
	api  *proc
	pool *pgxpool.Pool // the bench database, for the sweep's fixtures
}

var _ target = (*blobplane)(nil)

// serverPIDs lists the processes serving Blobplane: the api and the
// Postgres backends connected to the bench database (cpuMeter). A server
// that is not on this machine cannot be measured: an error.
func (b *blobplane) serverPIDs(ctx context.Context) ([]int, error) {
	rows, err := b.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		return nil, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	out := []int{b.api.cmd.Process.Pid}
	for _, pid := range pids {
		if !isLocalProc(int(pid), "postgres") {
			return nil, fmt.Errorf("backend %d of the bench database is not a local postgres process (a remote server?)", pid)
		}
		out = append(out, int(pid))
	}
	return out, nil
}

// buildBlobplane compiles api, worker and controller into dir.
func buildBlobplane(ctx context.Context, dir string) error {
	_, err := runTool(ctx, "go", []string{"build", "-o", dir + string(filepath.Separator),
		"github.com/blobplane/blobplane/cmd/api",
		"github.com/blobplane/blobplane/cmd/worker",
		"github.com/blobplane/blobplane/cmd/controller"}, nil)
	if err != nil {
		return fmt.Errorf("build the Blobplane binaries (run the bench from inside the module): %w", err)
	}
	return nil
}

// createDatabase creates a new database on the server of serverURL and
// returns its URL and a function that drops it.
func createDatabase(ctx context.Context, serverURL string) (string, func(context.Context) error, error) {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	defer conn.Close(ctx)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "blobplane_bench_" + hex.EncodeToString(b)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, fmt.Errorf("create the bench database: %w", err)
	}
	drop := func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, serverURL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		return err
	}
	u, err := withDatabase(serverURL, name)
	if err != nil {
		_ = drop(ctx)
		return "", nil, err
	}
	return u, drop, nil
}

// withDatabase is base (a postgres:// URL) naming database name instead.
func withDatabase(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("DATABASE_URL must be a postgres:// URL")
	}
	u.Path = "/" + name
	return u.String(), nil
}

// startBlobplane runs the set-up of scripts/run.sh against dbURL with data
// under dir — migrate, a repository, a write token, the api, a signing key
// and a published map — and waits until the api is the home of bpRepo, so
// uploads publish synchronously (201). cleanup (set even on error) stops
// what was started.
func startBlobplane(ctx context.Context, bin, dbURL, dir, backendOptions string, cleanup *cleanups) (*blobplane, error) {
	blobs := filepath.Join(dir, "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return nil, err
	}
	spec := bpBackend + "=filesystem:" + blobs
	if backendOptions != "" {
		spec += "?" + backendOptions
	}
	b := &blobplane{bin: bin, env: []string{
		"DATABASE_URL=" + dbURL,
		"BLOBPLANE_DATA_DIR=" + filepath.Join(dir, "data"),
		"BLOBPLANE_BACKENDS=" + spec,
		"BLOBPLANE_DATACENTER=" + bpDatacenter,
		"BLOBPLANE_NODE_ID=bench-node",
		"BLOBPLANE_REPLICATE_TO=none",
		"BLOBPLANE_RIVERUI=false",
		"BLOBPLANE_LOG_FORMAT=text",
		"BLOBPLANE_LOG_LEVEL=warn",
	}}
	api := filepath.Join(bin, "api")
	if _, err := runTool(ctx, api, []string{"migrate"}, b.env); err != nil {
		return nil, err
	}
	if _, err := runTool(ctx, api, []string{"repo", "create", bpRepo}, b.env); err != nil {
		return nil, err
	}
	out, err := runTool(ctx, api, []string{"token", "create", "--principal", bpPrincipal, "--grant", "bench/*:write"}, b.env)
	if err != nil {
		return nil, err
	}
	token := strings.TrimSpace(out)
	if token == "" || strings.ContainsAny(token, " \n") {
		return nil, fmt.Errorf("api token create printed %q, want one token", out)
	}

	type started struct {
		p    *proc
		base string
	}
	s, err := retryPort(func(port int) (started, error) {
		listen := "127.0.0.1:" + strconv.Itoa(port)
		p, err := startProc("blobplane api", api, nil, append(b.env, "BLOBPLANE_LISTEN="+listen))
		if err != nil {
			return started{}, err
		}
		if err := p.waitReady(ctx, "http://"+listen+"/readyz", 60*time.Second); err != nil {
			p.stop()
			return started{}, err
		}
		return started{p, "http://" + listen}, nil
	})
	if err != nil {
		return nil, err
	}
	b.api = s.p
	cleanup.add(func() error { s.p.stop(); return nil })
	b.ociClient = &ociClient{base: s.base, repo: bpRepo, user: bpPrincipal, pass: token, hc: newHTTPClient()}
	cleanup.add(func() error { b.hc.CloseIdleConnections(); return nil })

	controller := filepath.Join(bin, "controller")
	if _, err := runTool(ctx, controller, []string{"keygen"}, b.env); err != nil {
		return nil, err
	}
	if _, err := runTool(ctx, controller, []string{"publish"}, b.env); err != nil {
		return nil, err
	}
	// The api adopts the map and acquires its partitions.
	if err := b.api.waitReady(ctx, s.base+"/v1/home/"+bpRepo, 60*time.Second); err != nil {
		return nil, fmt.Errorf("the api did not become the home of %s: %w", bpRepo, err)
	}
	if b.pool, err = pgxpool.New(ctx, dbURL); err != nil {
		return nil, err
	}
	cleanup.add(func() error { b.pool.Close(); return nil })
	return b, nil
}

// Route is one routing query: GET /v1/blobs/<digest>/placements for a
// reader in the bench's datacenter. The digest must be served (a verified
// placement).
func (b *blobplane) Route(ctx context.Context, digest string) error {
	req, err := b.request(ctx, http.MethodGet, b.base+"/v1/blobs/"+digest+"/placements?datacenter="+bpDatacenter, nil, 0)
	if err != nil {
		return err
	}
	var body strings.Builder
	if _, _, err := send(b.hc, req, http.StatusOK, &body); err != nil {
		return err
	}
	var ans struct {
		Serveable bool `json:"serveable"`
	}
	if err := json.Unmarshal([]byte(body.String()), &ans); err != nil {
		return fmt.Errorf("placements of %s: %w", digest, err)
	}
	if !ans.Serveable {
		return fmt.Errorf("placements of %s: not serveable: %s", digest, body.String())
	}
	return nil
}

// sweepResult is one timed sweep over n abandoned intents.
type sweepResult struct {
	Intents int
	Passes  int
	Elapsed time.Duration // all passes, each a `worker sweep --only reaper` process
}

// Sweep inserts n expired pending intents (abandoned uploads, each with a
// staged location the filesystem backend does not hold) and times `worker
// sweep --only reaper` passes with BLOBPLANE_SWEEP_BATCH=batch until every
// one is reaped and its staged upload deleted. Only the reaper: a full
// pass also inventories every stored object, whatever the earlier
// workloads left, which this workload is not about. A pass that reaps
// nothing, or a failed delete, is an error.
func (b *blobplane) Sweep(ctx context.Context, n, batch, rep int) (sweepResult, error) {
	if _, err := b.pool.Exec(ctx, `
		INSERT INTO intents (repository, principal, ingress_datacenter, backend, staged_location, received_bytes, created_at, expires_at)
		SELECT $1, $2, $3, $4, lpad(to_hex($5::bigint * 100000000 + g), 32, '0'), 4096, now() - interval '2 hours', now() - interval '1 hour' - g * interval '1 ms'
		FROM generate_series(1, $6::int) g`, bpRepo, bpPrincipal, bpDatacenter, bpBackend, rep, n); err != nil {
		return sweepResult{}, fmt.Errorf("insert %d expired intents: %w", n, err)
	}
	env := append(b.env, "BLOBPLANE_SWEEP_BATCH="+strconv.Itoa(batch))
	res := sweepResult{}
	start := time.Now()
	for res.Intents < n {
		out, err := runTool(ctx, filepath.Join(b.bin, "worker"), []string{"sweep", "--only", "reaper"}, env)
		if err != nil {
			return sweepResult{}, err
		}
		res.Passes++
		var all struct {
			Reaper struct {
				Reaped  []json.RawMessage `json:"reaped"`
				Deleted []json.RawMessage `json:"deleted"`
				Failed  int               `json:"failed"`
			} `json:"reaper"`
		}
		if err := json.Unmarshal([]byte(out), &all); err != nil {
			return sweepResult{}, fmt.Errorf("worker sweep printed no report: %w", err)
		}
		rpt := all.Reaper
		if len(rpt.Reaped) == 0 || len(rpt.Deleted) < len(rpt.Reaped) || rpt.Failed != 0 {
			return sweepResult{}, fmt.Errorf("worker sweep pass %d (after %d of %d intents): reaped %d, deleted %d, failed %d",
				res.Passes, res.Intents, n, len(rpt.Reaped), len(rpt.Deleted), rpt.Failed)
		}
		res.Intents += len(rpt.Reaped)
	}
	res.Elapsed = time.Since(start)
	var left int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM intents WHERE state = 'pending' AND expires_at < now()`).Scan(&left); err != nil {
		return sweepResult{}, err
	}
	if left != 0 || res.Intents != n {
		return sweepResult{}, fmt.Errorf("the sweep reaped %d of %d intents; %d expired intents are still pending", res.Intents, n, left)
	}
	return res, nil
}
