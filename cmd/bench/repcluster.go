package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane/authority"
)

// The replication workloads (issue 28) run on a cluster of their own, as
// scripts/run-datacenters.sh starts one: two datacenters, eu-1 and us-1,
// each an api and a worker process with its own filesystem backend root,
// on a database of their own (so the single-datacenter Blobplane of the
// other workloads keeps its map and its home), one cluster secret, one
// signed partition map over both apis. Blobs are uploaded to a
// repository homed at eu-1's api; us-1's worker copies them (reading
// them from eu-1's api over the signed internal endpoint). The scheduled
// scrub is off: only the workload's own `worker scrub` passes scrub. The
// cluster starts the first time a replication workload runs and stops
// with everything else.
const (
	repSource = "eu-1"
	repTarget = "us-1"
	// repBackend is each datacenter's one backend.
	repBackend = "fs"
	// repBound bounds every wait for copies: a copy not verified within
	// it fails the workload.
	repBound = 5 * time.Minute
	// repPoll is how often the bench asks the ledger whether copies are
	// verified. The figures come from the ledger's own clock, so this
	// only decides when the bench looks, not what it reports.
	repPoll = 25 * time.Millisecond
)

// repCluster is the running two-datacenter cluster.
type repCluster struct {
	bin  string
	env  []string // the tools' (migrate, token, repo, controller)
	dcs  map[string]*repDC
	up   *ociClient    // uploads into a repository homed at eu-1's api
	pool *pgxpool.Pool // the cluster's database: the ledger the workloads poll
	// rawDir is where the raw pipeline writes its copies: beside us-1's
	// backend root, on the same filesystem.
	rawDir string
}

// repDC is one datacenter of the cluster.
type repDC struct {
	name string
	root string   // its filesystem backend's root
	env  []string // what its api, worker and `worker scrub` share
	url  string   // its api

	api, worker *proc
}

// startRepCluster starts the cluster with the binaries in bin, its
// database on the server of serverURL and its data under dir, and checks
// that a blob uploaded in eu-1 is copied into us-1. cl stops everything
// it started, also on an error.
func startRepCluster(ctx context.Context, bin, serverURL, dir string, cl *cleanups) (*repCluster, error) {
	dbURL, drop, err := createDatabase(ctx, serverURL)
	if err != nil {
		return nil, err
	}
	cl.add(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return drop(ctx)
	})
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	logs := []string{"DATABASE_URL=" + dbURL, "BLOBPLANE_LOG_FORMAT=text", "BLOBPLANE_LOG_LEVEL=warn"}
	c := &repCluster{bin: bin, env: append(logs, "BLOBPLANE_DATA_DIR="+filepath.Join(dir, "tools")),
		dcs: map[string]*repDC{}, rawDir: filepath.Join(dir, repTarget, "raw")}
	if err := os.MkdirAll(c.rawDir, 0o755); err != nil {
		return nil, err
	}
	for _, dc := range []string{repSource, repTarget} {
		d := &repDC{name: dc, root: filepath.Join(dir, dc, "blobs")}
		d.env = append(logs[:len(logs):len(logs)],
			"BLOBPLANE_DATACENTER="+dc,
			"BLOBPLANE_DATA_DIR="+filepath.Join(dir, dc, "data"),
			"BLOBPLANE_BACKENDS="+repBackend+"=filesystem:"+d.root,
			"BLOBPLANE_CLUSTER_SECRET="+hex.EncodeToString(secret),
			"BLOBPLANE_SHUTDOWN_TIMEOUT=5s")
		if err := os.MkdirAll(d.root, 0o755); err != nil {
			return nil, err
		}
		c.dcs[dc] = d
	}
	token, err := c.prepare(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.startNodes(ctx, cl); err != nil {
		return nil, err
	}
	if c.pool, err = pgxpool.New(ctx, dbURL); err != nil {
		return nil, err
	}
	cl.add(func() error { c.pool.Close(); return nil })
	repo, err := c.repoHomedAt(ctx, repSource)
	if err != nil {
		return nil, err
	}
	c.up = &ociClient{base: c.dcs[repSource].url, repo: repo, user: bpPrincipal, pass: token, hc: newHTTPClient()}
	cl.add(func() error { c.up.hc.CloseIdleConnections(); return nil })
	return c, nil
}

// prepare migrates the database and issues the bench's write token.
func (c *repCluster) prepare(ctx context.Context) (token string, err error) {
	api := filepath.Join(c.bin, "api")
	if _, err := runTool(ctx, api, []string{"migrate"}, c.env); err != nil {
		return "", err
	}
	out, err := runTool(ctx, api, []string{"token", "create", "--principal", bpPrincipal, "--grant", "bench/*:write"}, c.env)
	if err != nil {
		return "", err
	}
	token = strings.TrimSpace(out)
	if token == "" || strings.ContainsAny(token, " \n") {
		return "", fmt.Errorf("api token create printed %q, want one token", out)
	}
	return token, nil
}

// startNodes starts both apis, publishes one map over them (a signing
// key first), then starts both workers.
func (c *repCluster) startNodes(ctx context.Context, cl *cleanups) error {
	for _, dc := range []string{repSource, repTarget} {
		if err := c.startAPI(ctx, c.dcs[dc], cl); err != nil {
			return err
		}
	}
	controller := filepath.Join(c.bin, "controller")
	if _, err := runTool(ctx, controller, []string{"keygen"}, c.env); err != nil {
		return err
	}
	if _, err := runTool(ctx, controller, []string{"publish"}, c.env); err != nil {
		return err
	}
	for _, dc := range []string{repSource, repTarget} {
		if err := c.startWorker(ctx, c.dcs[dc], cl); err != nil {
			return err
		}
	}
	return nil
}

// startAPI starts d's api on a free port and waits until it is ready
// (registered in the nodes table, so the map covers it).
func (c *repCluster) startAPI(ctx context.Context, d *repDC, cl *cleanups) error {
	p, err := retryPort(func(port int) (*proc, error) {
		listen := "127.0.0.1:" + strconv.Itoa(port)
		p, err := startProc("blobplane api-"+d.name, filepath.Join(c.bin, "api"), nil, append(d.env[:len(d.env):len(d.env)],
			"BLOBPLANE_NODE_ID=api-"+d.name, "BLOBPLANE_LISTEN="+listen, "BLOBPLANE_ADVERTISE_URL=http://"+listen, "BLOBPLANE_RIVERUI=false"))
		if err != nil {
			return nil, err
		}
		if err := p.waitReady(ctx, "http://"+listen+"/readyz", 60*time.Second); err != nil {
			p.stop()
			return nil, err
		}
		d.url = "http://" + listen
		return p, nil
	})
	if err != nil {
		return err
	}
	d.api = p
	cl.add(func() error { p.stop(); return nil })
	return nil
}

// startWorker starts d's worker, the scheduled scrub off, and waits until
// it serves its metrics: its backends are open, it has registered, and
// River is starting.
func (c *repCluster) startWorker(ctx context.Context, d *repDC, cl *cleanups) error {
	p, err := retryPort(func(port int) (*proc, error) {
		metrics := "127.0.0.1:" + strconv.Itoa(port)
		p, err := startProc("blobplane worker-"+d.name, filepath.Join(c.bin, "worker"), nil, append(d.env[:len(d.env):len(d.env)],
			"BLOBPLANE_NODE_ID=worker-"+d.name, "BLOBPLANE_WORKER_METRICS="+metrics, "BLOBPLANE_SCRUB_CRON=off"))
		if err != nil {
			return nil, err
		}
		if err := p.waitReady(ctx, "http://"+metrics+"/metrics", 60*time.Second); err != nil {
			p.stop()
			return nil, err
		}
		return p, nil
	})
	if err != nil {
		return err
	}
	d.worker = p
	cl.add(func() error { p.stop(); return nil })
	return nil
}

// repoHomedAt creates a repository whose home, by the published map, is
// dc's api, and waits until that api serves it.
func (c *repCluster) repoHomedAt(ctx context.Context, dc string) (string, error) {
	ix, err := c.mapIndex(ctx)
	if err != nil {
		return "", err
	}
	for i := range 1000 {
		name := fmt.Sprintf("bench/r%03d", i)
		res, err := ix.ResolveKey(name)
		if err != nil {
			return "", err
		}
		if res.Primary().Node != "api-"+dc {
			continue
		}
		if _, err := runTool(ctx, filepath.Join(c.bin, "api"), []string{"repo", "create", name}, c.env); err != nil {
			return "", err
		}
		if err := waitHTTP(ctx, c.dcs[dc].url+"/v1/home/"+name, 60*time.Second); err != nil {
			return "", fmt.Errorf("api-%s did not become the home of %s: %w", dc, name, err)
		}
		return name, nil
	}
	return "", fmt.Errorf("the published map homes none of 1000 repositories at api-%s", dc)
}

// mapIndex reads the published map from eu-1's api.
func (c *repCluster) mapIndex(ctx context.Context) (*authority.Index, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.dcs[repSource].url+"/v1/map", nil)
	if err != nil {
		return nil, err
	}
	var body strings.Builder
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	if _, _, err := send(hc, req, http.StatusOK, &body); err != nil {
		return nil, err
	}
	m, err := authority.ParseMap([]byte(body.String()))
	if err != nil {
		return nil, err
	}
	return authority.NewIndex(m)
}

// upload sends size bytes from body under digest to eu-1's api, the
// repository's home: in one request (POST .../blobs/uploads/?digest=)
// when one is set, else POST then PUT. The home publishes it at once
// (201), or, when it cannot publish now (its lease lapsed: on this
// machine, a renewal that waited behind publications), answers 202 and
// keeps the upload for a finalize job that publishes it later: kept. The
// figures come from the ledger's times of publication, so a kept upload
// is measured from when it was published; the tables count them.
func (c *repCluster) upload(ctx context.Context, digest string, body io.Reader, size int64, one bool) (kept bool, err error) {
	method, u := http.MethodPost, c.up.base+"/v2/"+c.up.repo+"/blobs/uploads/"
	if one {
		u += "?digest=" + url.QueryEscape(digest)
	} else {
		method = http.MethodPut
		req, err := c.up.request(ctx, http.MethodPost, u, nil, 0)
		if err != nil {
			return false, err
		}
		h, _, err := send(c.up.hc, req, http.StatusAccepted, nil)
		if err != nil {
			return false, err
		}
		if u, err = putURL(c.up.base, h.Get("Location"), digest); err != nil {
			return false, err
		}
	}
	req, err := c.up.request(ctx, method, u, body, size)
	if err != nil {
		return false, err
	}
	resp, err := c.up.hc.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 2<<10))
	_, _ = io.Copy(io.Discard, resp.Body)
	switch {
	case resp.StatusCode == http.StatusCreated:
		return false, nil
	case resp.StatusCode == http.StatusAccepted && strings.HasPrefix(resp.Header.Get("Location"), "/v1/operations/"):
		return true, nil
	}
	return false, c.dcs[repSource].api.failed(fmt.Errorf("%s %s: %s, want 201 (or 202 kept): %s", method, req.URL.Redacted(), resp.Status, strings.TrimSpace(string(msg))))
}

// waitHTTP polls url until it answers 200 or timeout passes.
func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer 200 within %s", url, timeout)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// waitCopied waits until every one of digests has a verified placement in
// us-1.
func (c *repCluster) waitCopied(ctx context.Context, digests []string) error {
	deadline := time.Now().Add(repBound)
	for {
		var n int
		if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM placements WHERE datacenter = $1 AND state = 'verified' AND digest = ANY($2)`,
			repTarget, digests).Scan(&n); err != nil {
			return err
		}
		if n == len(digests) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d copies verified in %s after %s; replicate jobs: %s", n, len(digests), repTarget, repBound, c.jobStates(ctx))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(repPoll):
		}
	}
}

// serverPIDs lists the cluster's processes: both apis and workers and
// the Postgres backends connected to its database (cpuMeter).
func (c *repCluster) serverPIDs(ctx context.Context) ([]int, error) {
	rows, err := c.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		return nil, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	var out []int
	for _, d := range c.dcs {
		out = append(out, d.api.cmd.Process.Pid, d.worker.cmd.Process.Pid)
	}
	for _, pid := range pids {
		if !isLocalProc(int(pid), "postgres") {
			return nil, fmt.Errorf("backend %d of the cluster's database is not a local postgres process (a remote server?)", pid)
		}
		out = append(out, int(pid))
	}
	return out, nil
}

// procName names the cluster's process pid: api-<dc>, worker-<dc>, or
// postgres (a backend of its database).
func (c *repCluster) procName(pid int) string {
	for _, d := range c.dcs {
		switch pid {
		case d.api.cmd.Process.Pid:
			return "api-" + d.name
		case d.worker.cmd.Process.Pid:
			return "worker-" + d.name
		}
	}
	return "postgres"
}

// jobStates summarizes the replicate jobs, for an error message.
func (c *repCluster) jobStates(ctx context.Context) string {
	rows, err := c.pool.Query(ctx, `SELECT state || ' ' || count(*) FROM river_job WHERE kind = 'replicate' GROUP BY state ORDER BY state`)
	if err != nil {
		return err.Error()
	}
	states, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err.Error()
	}
	return strings.Join(states, ", ")
}

// copyTimes are the ledger's times of a set of copies (the database's
// clock, from each blob's publication in eu-1 to its copy's verification
// in us-1), in seconds.
type copyTimes struct {
	FirstToAll float64 // the first publication to the last verification
	LastToAll  float64 // the last publication to the last verification
	Publishing float64 // the first publication to the last
	LagP50     float64 // of each blob's publication to its copy's verification
	LagP99     float64
}

// copyTimes reads the ledger's times of the copies of digests, all
// verified in us-1.
func (c *repCluster) copyTimes(ctx context.Context, digests []string) (copyTimes, error) {
	var t copyTimes
	err := c.pool.QueryRow(ctx, `
		SELECT extract(epoch FROM max(p.verified_at) - min(o.published_at))::float8,
		       extract(epoch FROM max(p.verified_at) - max(o.published_at))::float8,
		       extract(epoch FROM max(o.published_at) - min(o.published_at))::float8,
		       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM p.verified_at - o.published_at)),
		       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM p.verified_at - o.published_at))
		FROM operation_outcomes o
		JOIN placements p ON p.digest = o.digest AND p.datacenter = $1 AND p.state = 'verified'
		WHERE o.digest = ANY($2)`, repTarget, digests).Scan(&t.FirstToAll, &t.LastToAll, &t.Publishing, &t.LagP50, &t.LagP99)
	if err != nil {
		return t, fmt.Errorf("the ledger's copy times: %w", err)
	}
	return t, nil
}

// sourcePath is the file of d's object in eu-1's backend.
func (c *repCluster) sourcePath(digest string) string {
	return filepath.Join(c.dcs[repSource].root, objectPath(digest))
}

// scrubSummary is what `worker scrub` prints (app.ScrubSummary).
type scrubSummary struct {
	Checked    int     `json:"checked"`
	Intact     int     `json:"intact"`
	Mismatched int     `json:"mismatched"`
	Missing    int     `json:"missing"`
	Skipped    int     `json:"skipped"`
	Bytes      int64   `json:"bytes"`
	Seconds    float64 `json:"seconds"`
}

// scrub runs one `worker scrub` pass over dc, unpaced, and fails unless
// every placement it checked was intact.
func (c *repCluster) scrub(ctx context.Context, dc string) (scrubSummary, error) {
	out, err := runTool(ctx, filepath.Join(c.bin, "worker"), []string{"scrub"}, c.dcs[dc].env)
	if err != nil {
		return scrubSummary{}, err
	}
	var s scrubSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		return s, fmt.Errorf("worker scrub printed %q: %w", out, err)
	}
	if s.Checked == 0 || s.Intact != s.Checked || s.Skipped != 0 {
		return s, fmt.Errorf("worker scrub in %s: %+v, want every placement checked and intact", dc, s)
	}
	return s, nil
}

// verifiedSources lists eu-1's verified placements: what a scrub pass
// there checks.
func (c *repCluster) verifiedSources(ctx context.Context) ([]sourceFile, error) {
	rows, err := c.pool.Query(ctx, `SELECT digest, size_bytes FROM placements WHERE datacenter = $1 AND backend = $2 AND state = 'verified' ORDER BY digest`,
		repSource, repBackend)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[sourceFile])
}

// sourceFile is a blob stored in eu-1.
type sourceFile struct {
	Digest string
	Size   int64
}
