//go:build unix

package soak_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/internal/testbin"
	"github.com/blobplane/blobplane/jobs"
)

// No goroutine of the soak (process waiters, clients, transports) may
// outlive it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The soak's shape. Bounds are failure bounds (a phase that does not
// reach its count within one fails the soak with what it saw), not the
// expected durations: a run takes from under a minute to three on two
// cores (docs/uploads.md, "Acknowledged means kept").
const (
	clients = 4
	// An upload session idles this long before the reaper may abandon
	// it, and the reaper runs every second: the soak keeps a home down
	// until uploads answered 202 meanwhile have expired and been swept
	// past (script.reapPast), so one that were not kept (accepted) would
	// be abandoned.
	uploadTTL  = "3s"
	phaseBound = 60 * time.Second
	// A 202's finalize job publishes within seconds of its home's
	// return, or, when its attempt was lost with a worker that did not
	// come back or with a completion Postgres never recorded, once River
	// rescues it (jobs.RescueStuckJobsAfter, checked every 30 s) and its
	// next retry is due.
	settleBound = jobs.RescueStuckJobsAfter + 90*time.Second
)

// TestAcknowledgedMeansKept is the crash soak of issue 27: two
// datacenters, dc-a and dc-b, each an api and a worker process with its
// own filesystem backend, on one private Postgres. Clients upload
// concurrently into repositories homed at either (single-request POST
// ?digest=, POST+PUT, POST+PATCH+PUT; small and larger bodies; some
// content twice) through either datacenter, while the soak
//
//   - kills an api with SIGKILL and restarts it with the same node id
//     (uploads into its repositories that arrive at the other datacenter
//     meanwhile are answered 202 and queued; the restarted api takes its
//     leases back at once, docs/authority.md "Taking a lease back"),
//   - kills the workers with SIGKILL (the finalize jobs of those 202s wait
//     for them) and restarts them,
//   - crash-restarts Postgres (immediate shutdown, crash recovery), alone
//     and together with an api kill.
//
// Every upload answered 201 or 202 is recorded. At the end, once every
// 202's operation has published, each acknowledged upload must read back
// from its datacenter with exactly its bytes, and exist (HEAD) in the
// other. Uploads answered with an error or cut by a kill prove nothing
// and are not checked.
func TestAcknowledgedMeansKept(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: starts Postgres, two apis and two workers and crashes them (one to three minutes); skipped with -short")
	}
	start := time.Now()
	c := newCluster(t)
	repos := c.chooseRepos(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.waitHomes(t, ctx, repos, phaseBound)

	l := newLoad(c.token, c.urls, c.dcs, slices.Concat(repos["dc-a"], repos["dc-b"]))
	loadCtx, stopLoad := context.WithCancel(ctx)
	waitClients := l.run(loadCtx, clients)
	x := &script{t: t, c: c, l: l, ctx: ctx, repos: repos, t0: time.Now()}
	x.run()
	stopLoad()
	waitClients()
	x.logf("load stopped")

	all := l.snapshot()
	if took, ok := c.settle(t, ctx, all, settleBound); ok {
		x.logf("every upload answered 202 published, %s after the load stopped", took.Round(time.Millisecond))
	}
	c.logFinalizeJobs(t, ctx)
	c.verify(t, ctx, all)
	c.checkIntents(t, ctx)
	summarize(t, all, c, time.Since(start))
}

// cluster is the system under test: its Postgres, its processes, and what
// the soak needs to talk to them.
type cluster struct {
	pg      *pgCluster // nil on a database the soak did not start (the HA formation)
	dbURL   string     // DATABASE_URL of every process
	bins    string
	dcs     []string
	apis    map[string]*proc // by datacenter
	workers map[string]*proc
	urls    map[string]string
	nodes   map[string]string   // api node id → datacenter
	env     map[string][]string // by datacenter: its processes' environment, less the node id
	token   string
	db      *pgxpool.Pool // the soak's own connections, for leases and the final checks
	hc      *http.Client
}

// newCluster starts Postgres, migrates, issues a token, starts both apis,
// publishes a map over them and starts both workers.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	pg := startPostgres(t)
	return newClusterOn(t, pg, pg.URL())
}

// newClusterOn is newCluster on the database at url (pg, when the soak
// started it); extra is added to every process's environment (a later
// value of a variable wins).
func newClusterOn(t *testing.T, pg *pgCluster, url string, extra ...string) *cluster {
	t.Helper()
	c := &cluster{pg: pg, dbURL: url, bins: testbin.Build(t), dcs: []string{"dc-a", "dc-b"},
		apis: map[string]*proc{}, workers: map[string]*proc{}, urls: map[string]string{}, nodes: map[string]string{}, env: map[string][]string{}}
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	c.hc = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	dir := t.TempDir()
	secret := make([]byte, 24)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	common := []string{"DATABASE_URL=" + url, "BLOBPLANE_LOG_FORMAT=json", "BLOBPLANE_DATA_DIR=" + filepath.Join(dir, "tools")}
	api := filepath.Join(c.bins, "api")
	if out, err := runTool(api, common, "migrate"); err != nil {
		t.Fatalf("soak: %v\n%s", err, out)
	}
	tok, err := runTool(api, common, "token", "bootstrap", "--principal", "soak")
	if err != nil {
		t.Fatalf("soak: %v", err)
	}
	c.token = strings.TrimSpace(tok)

	for _, dc := range c.dcs {
		port, err := stablePort()
		if err != nil {
			t.Fatal(err)
		}
		suffix := strings.TrimPrefix(dc, "dc-")
		env := []string{
			"DATABASE_URL=" + url,
			"BLOBPLANE_DATACENTER=" + dc,
			"BLOBPLANE_DATA_DIR=" + filepath.Join(dir, dc),
			"BLOBPLANE_BACKENDS=fs=filesystem:" + filepath.Join(dir, dc, "blobs"),
			"BLOBPLANE_CLUSTER_SECRET=" + hex.EncodeToString(secret),
			"BLOBPLANE_UPLOAD_TTL=" + uploadTTL,
			"BLOBPLANE_SHUTDOWN_TIMEOUT=5s",
			"BLOBPLANE_LOG_FORMAT=json",
			// api: the same address at every restart, as the map says.
			"BLOBPLANE_LISTEN=127.0.0.1:" + strconv.Itoa(port),
			"BLOBPLANE_RIVERUI=false",
			// worker: the sweeps run often, so that anything answered
			// 202 but not kept would be reaped and its bytes collected
			// before the soak ends.
			"BLOBPLANE_SWEEP_CRON=@every 1s",
			"BLOBPLANE_COLLECT_CRON=@every 3s",
			"BLOBPLANE_INVENTORY_CRON=@every 10s",
			// Collected bytes go at once, so that bytes collected
			// wrongly would be missed within the soak.
			"BLOBPLANE_COLLECT_DELETE_DELAY=0",
		}
		env = append(env, extra...)
		c.env[dc] = env
		node := "api-" + suffix
		c.apis[dc] = newProc(t, node, api, append(env, "BLOBPLANE_NODE_ID="+node))
		c.workers[dc] = newProc(t, "worker-"+suffix, filepath.Join(c.bins, "worker"), append(env, "BLOBPLANE_NODE_ID=worker-"+suffix))
		c.urls[dc] = "http://127.0.0.1:" + strconv.Itoa(port)
		c.nodes[node] = dc
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs(t)
		}
	})
	ctx := context.Background()
	for _, dc := range c.dcs {
		if err := c.startAPI(ctx, dc); err != nil {
			t.Fatalf("soak: %v", err)
		}
	}
	// The placement controller: a signing key, then a map over the two
	// api nodes (partitions round-robin between them).
	ctl := filepath.Join(c.bins, "controller")
	ctlEnv := append(common, "BLOBPLANE_SIGNING_KEY_FILE="+filepath.Join(dir, "controller", "signing-key.json"), "BLOBPLANE_PARTITIONS=8")
	if _, err := runTool(ctl, ctlEnv, "keygen"); err != nil {
		t.Fatalf("soak: %v", err)
	}
	if _, err := runTool(ctl, ctlEnv, "publish"); err != nil {
		t.Fatalf("soak: %v", err)
	}
	for _, dc := range c.dcs {
		if err := c.workers[dc].start(); err != nil {
			t.Fatalf("soak: %v", err)
		}
	}
	if c.db, err = pgxpool.New(ctx, url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.db.Close)
	return c
}

// crashes counts the soak's crashes of Postgres (none on a database it
// did not start).
func (c *cluster) crashes() int {
	if c.pg == nil {
		return 0
	}
	return c.pg.crashes
}

// startAPI starts dc's api and waits until it is ready.
func (c *cluster) startAPI(ctx context.Context, dc string) error {
	p := c.apis[dc]
	if err := p.start(); err != nil {
		return err
	}
	return waitHTTP(ctx, p, c.hc, c.urls[dc]+"/readyz", "", phaseBound)
}

// chooseRepos creates n repositories homed at each datacenter's api (by
// the published map) and returns them by datacenter.
func (c *cluster) chooseRepos(t *testing.T, n int) map[string][]string {
	t.Helper()
	ix, doc := mapIndex(t, context.Background(), c.hc, c.urls["dc-a"], c.token)
	repos := map[string][]string{}
	for i := 0; len(repos["dc-a"]) < n || len(repos["dc-b"]) < n; i++ {
		if i > 1000 {
			t.Fatalf("soak: the map homes no %d repositories at each api: %s", n, doc)
		}
		name := fmt.Sprintf("soak/r%03d", i)
		res, err := ix.ResolveKey(name)
		if err != nil {
			t.Fatal(err)
		}
		dc := c.nodes[res.Primary().Node]
		if dc == "" || len(repos[dc]) >= n {
			continue
		}
		if _, err := runTool(filepath.Join(c.bins, "api"), []string{"DATABASE_URL=" + c.dbURL}, "repo", "create", name); err != nil {
			t.Fatalf("soak: %v", err)
		}
		repos[dc] = append(repos[dc], name)
	}
	return repos
}

// waitHomes waits until each repository's home serves it (its lease held
// and SERVING): GET /v1/home/<repo> at the home answers 200.
func (c *cluster) waitHomes(t *testing.T, ctx context.Context, repos map[string][]string, within time.Duration) {
	t.Helper()
	if err := c.homesServe(ctx, repos, within); err != nil {
		t.Fatalf("soak: %v", err)
	}
}

func (c *cluster) homesServe(ctx context.Context, repos map[string][]string, within time.Duration) error {
	for dc, names := range repos {
		for _, name := range names {
			if err := waitHTTP(ctx, c.apis[dc], c.hc, c.urls[dc]+"/v1/home/"+name, c.token, within); err != nil {
				return err
			}
		}
	}
	return nil
}

// leaseRow is what the soak reads of a lease.
type leaseRow struct {
	epoch     int64
	expiresAt time.Time
	renewedAt time.Time
}

// leasesOf reads node's lease records by partition.
func (c *cluster) leasesOf(ctx context.Context, node string) (map[string]leaseRow, error) {
	rows, err := c.db.Query(ctx, `SELECT partition_id, epoch, expires_at, renewed_at FROM leases WHERE owner_node = $1`, node)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]leaseRow{}
	for rows.Next() {
		var p string
		var r leaseRow
		if err := rows.Scan(&p, &r.epoch, &r.expiresAt, &r.renewedAt); err != nil {
			return nil, err
		}
		out[p] = r
	}
	return out, rows.Err()
}

// operation is GET /v1/operations/<id>: the operation's state, raw.
func (c *cluster) operation(ctx context.Context, u *upload) (state string, raw string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.urls[u.dc]+"/v1/operations/"+u.op, nil)
	if err != nil {
		return "", "", err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	if err != nil {
		return "", "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", string(b), fmt.Errorf("GET /v1/operations/%s: %d %s", u.op, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	var v struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return "", string(b), err
	}
	return v.State, string(b), nil
}

// settle waits until the operation of every upload answered 202 has
// published (its state is admitted), polling, within the bound; one
// abandoned is lost at once (a terminal state: nothing will publish it).
// On failure it lists each lost or still pending with its operation's
// state and its finalize job's.
func (c *cluster) settle(t *testing.T, ctx context.Context, all []*upload, within time.Duration) (time.Duration, bool) {
	t.Helper()
	start := time.Now()
	var pending, lost []*upload
	for _, u := range all {
		if u.status == http.StatusAccepted {
			pending = append(pending, u)
		}
	}
	last := map[*upload]string{}
	report := func(what string, us []*upload) {
		var b strings.Builder
		fmt.Fprintf(&b, "soak: %d upload(s) answered 202 %s:\n", len(us), what)
		for _, u := range us {
			fmt.Fprintf(&b, "  %s answered at %s\n    operation: %s\n    finalize job: %s\n", u, u.at.Format(time.RFC3339Nano), last[u], c.finalizeJob(ctx, u.op))
		}
		t.Error(b.String())
	}
	for len(pending) > 0 {
		var still []*upload
		for _, u := range pending {
			state, raw, err := c.operation(ctx, u)
			if err != nil {
				raw = err.Error()
			}
			last[u] = raw
			switch {
			case err == nil && state == "admitted":
			case err == nil && state == "abandoned":
				lost = append(lost, u)
			default:
				still = append(still, u)
			}
		}
		pending = still
		if len(pending) == 0 || time.Since(start) > within || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	if len(lost) > 0 {
		report("were abandoned: lost", lost)
	}
	if len(pending) > 0 {
		report(fmt.Sprintf("did not publish within %s", within), pending)
	}
	return time.Since(start), len(lost) == 0 && len(pending) == 0
}

// finalizeJob describes the River finalize job of operation op.
func (c *cluster) finalizeJob(ctx context.Context, op string) string {
	var state string
	var attempt, maxAttempts int
	var scheduled time.Time
	var attemptedBy []string
	var lastErr *string
	err := c.db.QueryRow(ctx, `SELECT state::text, attempt, max_attempts, scheduled_at, coalesce(attempted_by, '{}'),
		       errors[array_upper(errors, 1)]->>'error'
		FROM river_job WHERE kind = 'finalize' AND args->>'operation_id' = $1 ORDER BY id DESC LIMIT 1`, op).
		Scan(&state, &attempt, &maxAttempts, &scheduled, &attemptedBy, &lastErr)
	if err != nil {
		return "none found (" + err.Error() + ")"
	}
	e := "-"
	if lastErr != nil {
		e = *lastErr
	}
	return fmt.Sprintf("%s, attempt %d/%d, scheduled %s, attempted by %v, last error: %s", state, attempt, maxAttempts, scheduled.Format(time.RFC3339Nano), attemptedBy, e)
}

// logFinalizeJobs logs how the finalize jobs of the 202s went: how many
// attempts they took, the errors of their failed attempts, the slowest.
func (c *cluster) logFinalizeJobs(t *testing.T, ctx context.Context) {
	rows, err := c.db.Query(ctx, `SELECT state::text || ' after ' || attempt || ' attempt(s)', count(*),
		       max(coalesce(finalized_at, now()) - created_at)::text
		FROM river_job WHERE kind = 'finalize' GROUP BY 1 ORDER BY 1`)
	if err != nil {
		t.Logf("soak: finalize jobs: %v", err)
		return
	}
	defer rows.Close()
	var parts []string
	for rows.Next() {
		var what, slowest string
		var n int
		if err := rows.Scan(&what, &n, &slowest); err != nil {
			t.Logf("soak: finalize jobs: %v", err)
			return
		}
		parts = append(parts, fmt.Sprintf("%d %s (slowest %s)", n, what, slowest))
	}
	t.Logf("soak: finalize jobs: %s", strings.Join(parts, "; "))
	erows, err := c.db.Query(ctx, `SELECT left(regexp_replace(e->>'error', '[0-9a-f-]{8,}|[0-9]+', 'N', 'g'), 200) AS kind, count(*)
		FROM river_job, unnest(errors) AS e WHERE kind = 'finalize' GROUP BY 1 ORDER BY 2 DESC LIMIT 6`)
	if err != nil {
		return
	}
	defer erows.Close()
	for erows.Next() {
		var kind string
		var n int
		if erows.Scan(&kind, &n) == nil {
			t.Logf("soak: finalize attempts failed %d times: %s", n, kind)
		}
	}
}

// verify reads every acknowledged upload back from the datacenter that
// took it (its bytes are there; replication is not run) and checks its
// length and hash, and that the other datacenter knows it (HEAD,
// answered from Postgres).
func (c *cluster) verify(t *testing.T, ctx context.Context, all []*upload) {
	t.Helper()
	var acked []*upload
	for _, u := range all {
		if u.acknowledged() {
			acked = append(acked, u)
		}
	}
	var mu sync.Mutex
	var bad []string
	work := make(chan *upload)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for u := range work {
				if msg := c.check(ctx, u); msg != "" {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%s answered %d: %s", u, u.status, msg))
					mu.Unlock()
				}
			}
		})
	}
	for _, u := range acked {
		work <- u
	}
	close(work)
	wg.Wait()
	if len(bad) > 0 {
		slices.Sort(bad)
		if len(bad) > 50 {
			bad = append(bad[:50], fmt.Sprintf("... and %d more", len(bad)-50))
		}
		t.Errorf("soak: %d of %d acknowledged uploads are not readable with their exact bytes:\n  %s", len(bad), len(acked), strings.Join(bad, "\n  "))
	}
}

func (c *cluster) check(ctx context.Context, u *upload) string {
	if msg := c.read(ctx, u.dc, u.repo, u.digest, int64(u.size)); msg != "" {
		return msg + " at " + u.dc
	}
	for _, dc := range c.dcs {
		if dc == u.dc {
			continue
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodHead, c.urls[dc]+"/v2/"+u.repo+"/blobs/"+u.digest, nil)
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := c.hc.Do(req)
		if err != nil {
			return "HEAD at " + dc + ": " + err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(u.size) {
			return fmt.Sprintf("HEAD at %s: %d, Content-Length %d", dc, resp.StatusCode, resp.ContentLength)
		}
	}
	return ""
}

// read GETs repo@digest at dc and checks its bytes.
func (c *cluster) read(ctx context.Context, dc, repo, digest string, size int64) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.urls[dc]+"/v2/"+repo+"/blobs/"+digest, nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return "GET: " + err.Error()
	}
	defer resp.Body.Close()
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	switch got := "sha256:" + hex.EncodeToString(h.Sum(nil)); {
	case resp.StatusCode != http.StatusOK:
		return fmt.Sprintf("GET: %d", resp.StatusCode)
	case err != nil:
		return "GET body: " + err.Error()
	case n != size || got != digest:
		return fmt.Sprintf("GET: %d bytes hashing to %s", n, got)
	}
	return ""
}

// checkIntents: once settled, no accepted intent is anything but
// published — none abandoned (the reaper never takes an accepted upload),
// none still pending.
func (c *cluster) checkIntents(t *testing.T, ctx context.Context) {
	t.Helper()
	rows, err := c.db.Query(ctx, `SELECT operation_id::text, repository, state, accepted_at FROM intents
		WHERE accepted_at IS NOT NULL AND coalesce(state, '') <> 'admitted' ORDER BY accepted_at LIMIT 50`)
	if err != nil {
		t.Errorf("soak: read accepted intents: %v", err)
		return
	}
	defer rows.Close()
	var bad []string
	for rows.Next() {
		var op, repo, state string
		var at time.Time
		if err := rows.Scan(&op, &repo, &state, &at); err != nil {
			t.Error(err)
			return
		}
		bad = append(bad, fmt.Sprintf("%s in %s: %s (accepted %s)", op, repo, state, at.Format(time.RFC3339Nano)))
	}
	if len(bad) > 0 {
		t.Errorf("soak: accepted intents that did not publish:\n  %s", strings.Join(bad, "\n  "))
	}
}

// dumpLogs logs the end of every process's output.
func (c *cluster) dumpLogs(t *testing.T) {
	for _, dc := range c.dcs {
		for _, p := range []*proc{c.apis[dc], c.workers[dc]} {
			t.Logf("--- %s (last 6 KiB of its log) ---\n%s", p.name, p.tail(6<<10))
		}
	}
}

var (
	hexRun = regexp.MustCompile(`[0-9a-f]{8,}(-[0-9a-f]{4,})*`)
	number = regexp.MustCompile(`[0-9]+`)
)

// errorKind is an upload's error without what differs per request (ids,
// digests, ports, sizes), so that equal causes count together.
func errorKind(err string) string {
	k := number.ReplaceAllString(hexRun.ReplaceAllString(strings.Join(strings.Fields(err), " "), "<id>"), "N")
	if len(k) > 240 {
		k = k[:240] + "..."
	}
	return k
}

// summarize logs what the soak did and saw.
func summarize(t *testing.T, all []*upload, c *cluster, took time.Duration) {
	byStatus := map[string]int{}
	byMode := map[mode][2]int{} // acknowledged, attempted
	var acked, accepted, dups, bytes int
	for _, u := range all {
		key := strconv.Itoa(u.status)
		if u.status == 0 {
			key = "no answer"
		}
		byStatus[key]++
		m := byMode[u.mode]
		m[1]++
		if u.acknowledged() {
			m[0]++
			acked++
			bytes += u.size
			if u.status == http.StatusAccepted {
				accepted++
			}
			if u.dup {
				dups++
			}
		}
		byMode[u.mode] = m
	}
	errs := map[string]int{}
	for _, u := range all {
		if !u.acknowledged() && u.err != "" {
			errs[errorKind(u.err)]++
		}
	}
	kinds := make([]string, 0, len(errs))
	for k := range errs {
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(a, b string) int { return errs[b] - errs[a] })
	for i, k := range kinds {
		if i == 8 {
			break
		}
		t.Logf("soak: not acknowledged, %d times: %s", errs[k], k)
	}
	var restarts []string
	for _, dc := range c.dcs {
		for _, p := range []*proc{c.apis[dc], c.workers[dc]} {
			restarts = append(restarts, fmt.Sprintf("%s %d SIGKILL/%d starts", p.name, p.sigkills, p.starts))
		}
		// jobs.TakeBackRunning at a worker's start, when its killed
		// predecessor left attempts running.
		if n := c.workers[dc].logCount("took back the jobs a previous worker"); n > 0 {
			restarts = append(restarts, fmt.Sprintf("%s took back running jobs at %d of its starts", c.workers[dc].name, n))
		}
	}
	checked := "all read back"
	if t.Failed() {
		checked = "NOT all read back (see above)"
	}
	t.Logf("soak: %d uploads attempted, %d acknowledged (%d answered 201, %d answered 202; %d of them repeated content; %.1f MiB), %s; answers %v; by mode (acknowledged/attempted) %v; %s; postgres crash-restarts %d; %s in all",
		len(all), acked, acked-accepted, accepted, dups, float64(bytes)/(1<<20), checked, byStatus, byMode, strings.Join(restarts, ", "), c.crashes(), took.Round(time.Second))
}

// mapIndex reads the published partition map from the api at base and
// returns its index (which node homes a key) and the document.
func mapIndex(t *testing.T, ctx context.Context, hc *http.Client, base, token string) (*authority.Index, []byte) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/map", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("soak: GET /v1/map: %d %v %s", resp.StatusCode, err, doc)
	}
	m, err := authority.ParseMap(doc)
	if err != nil {
		t.Fatal(err)
	}
	ix, err := authority.NewIndex(m)
	if err != nil {
		t.Fatal(err)
	}
	return ix, doc
}
