//go:build unix

package soak_test

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane/internal/testbin"
)

// Issue 30's process tests: three api nodes in two datacenters, a worker
// per datacenter and the controller service, all separate processes on
// one Postgres of the test's own. A load uploads through api-3 (dc-b)
// into repositories homed on every node while the homes are killed with
// SIGKILL, terminated with SIGTERM and paused with SIGSTOP; no operator
// acts. The lease TTL is the keeper's default, 10 s.
//
// ZBP-5 R15–R20 (epochs fence every write), R74–R79 (handoff, seal,
// publication after ready), R83–R84 (SIGTERM order), R87 (a kill is
// survived), R116 (moves recorded), R135 (unavailability per move).

// moveCluster is the system under test.
type moveCluster struct {
	pg      *pgCluster
	apis    map[string]*proc // by node id
	urls    map[string]string
	dcOf    map[string]string
	workers []*proc
	ctl     *proc
	ctlURL  string
	ctlBin  string
	ctlEnv  []string
	token   string
	db      *pgxpool.Pool
	hc      *http.Client
}

func newMoveCluster(t *testing.T, apiEnv ...string) *moveCluster {
	t.Helper()
	pg := startPostgres(t)
	bins := testbin.Build(t)
	c := &moveCluster{pg: pg, apis: map[string]*proc{}, urls: map[string]string{}, dcOf: map[string]string{}}
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	c.hc = &http.Client{Transport: tr, Timeout: 15 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	dir := t.TempDir()
	secret := make([]byte, 24)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	common := []string{"DATABASE_URL=" + pg.URL(), "BLOBPLANE_LOG_FORMAT=json", "BLOBPLANE_DATA_DIR=" + filepath.Join(dir, "tools")}
	api := filepath.Join(bins, "api")
	if out, err := runTool(api, common, "migrate"); err != nil {
		t.Fatalf("moves: %v\n%s", err, out)
	}
	tok, err := runTool(api, common, "token", "bootstrap", "--principal", "moves")
	if err != nil {
		t.Fatal(err)
	}
	c.token = strings.TrimSpace(tok)
	dcEnv := func(dc string) []string {
		return []string{
			"DATABASE_URL=" + pg.URL(), "BLOBPLANE_DATACENTER=" + dc,
			// Every node of a datacenter sees the same backend.
			"BLOBPLANE_BACKENDS=fs=filesystem:" + filepath.Join(dir, dc, "blobs"),
			"BLOBPLANE_CLUSTER_SECRET=" + hex.EncodeToString(secret),
			"BLOBPLANE_SHUTDOWN_TIMEOUT=5s", "BLOBPLANE_LOG_FORMAT=json", "BLOBPLANE_RIVERUI=false",
		}
	}
	for i, dc := range []string{"dc-a", "dc-a", "dc-b"} {
		node := "api-" + strconv.Itoa(i+1)
		port, err := stablePort()
		if err != nil {
			t.Fatal(err)
		}
		env := append(dcEnv(dc), "BLOBPLANE_NODE_ID="+node, "BLOBPLANE_LISTEN=127.0.0.1:"+strconv.Itoa(port),
			"BLOBPLANE_DATA_DIR="+filepath.Join(dir, node))
		env = append(env, apiEnv...)
		c.apis[node] = newProc(t, node, api, env)
		c.urls[node] = "http://127.0.0.1:" + strconv.Itoa(port)
		c.dcOf[node] = dc
	}
	for _, dc := range []string{"dc-a", "dc-b"} {
		w := newProc(t, "worker-"+dc, filepath.Join(bins, "worker"), append(dcEnv(dc), "BLOBPLANE_NODE_ID=worker-"+dc, "BLOBPLANE_DATA_DIR="+filepath.Join(dir, "w-"+dc)))
		c.workers = append(c.workers, w)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range append(c.procs(), c.ctl) {
				t.Logf("--- %s (last 8 KiB of its log, answered requests left out) ---\n%s", p.name, p.tail(8<<10))
			}
		}
	})
	ctx := context.Background()
	for _, node := range c.nodeIDs() {
		if err := c.startAPI(ctx, node); err != nil {
			t.Fatal(err)
		}
	}
	ctlPort, err := stablePort()
	if err != nil {
		t.Fatal(err)
	}
	ctlEnv := append(common, "BLOBPLANE_SIGNING_KEY_FILE="+filepath.Join(dir, "controller", "signing-key.json"), "BLOBPLANE_PARTITIONS=6",
		"BLOBPLANE_CONTROLLER_LISTEN=127.0.0.1:"+strconv.Itoa(ctlPort),
		// A node paused (connected, not renewing) loses its partitions
		// 1 s after its leases expire, not after the default 30 s.
		"BLOBPLANE_CONTROLLER_LIVE_GRACE=1s")
	ctl := filepath.Join(bins, "controller")
	if _, err := runTool(ctl, ctlEnv, "keygen"); err != nil {
		t.Fatal(err)
	}
	if _, err := runTool(ctl, ctlEnv, "publish"); err != nil {
		t.Fatal(err)
	}
	c.ctlBin, c.ctlEnv = ctl, ctlEnv
	c.ctl = newProc(t, "controller", ctl, ctlEnv)
	c.ctl.args = []string{"run"}
	c.ctlURL = "http://127.0.0.1:" + strconv.Itoa(ctlPort)
	if err := c.ctl.start(); err != nil {
		t.Fatal(err)
	}
	if err := waitHTTP(ctx, c.ctl, c.hc, c.ctlURL+"/healthz", "", phaseBound); err != nil {
		t.Fatal(err)
	}
	for _, w := range c.workers {
		if err := w.start(); err != nil {
			t.Fatal(err)
		}
	}
	if c.db, err = pgxpool.New(ctx, pg.URL()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.db.Close)
	return c
}

// waitNoMoves waits until no move is in flight.
func (c *moveCluster) waitNoMoves(t *testing.T, ctx context.Context) {
	t.Helper()
	deadline := time.Now().Add(phaseBound)
	for {
		var n int
		if err := c.db.QueryRow(ctx, `SELECT count(*) FROM handoffs WHERE state NOT IN ('published', 'aborted')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d moves still in flight after %s", n, phaseBound)
		}
		time.Sleep(100 * time.Millisecond) // the controller's pace
	}
}

func (c *moveCluster) nodeIDs() []string {
	ids := make([]string, 0, len(c.apis))
	for id := range c.apis {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (c *moveCluster) procs() []*proc {
	var out []*proc
	for _, id := range c.nodeIDs() {
		out = append(out, c.apis[id])
	}
	return append(out, c.workers...)
}

func (c *moveCluster) startAPI(ctx context.Context, node string) error {
	if err := c.apis[node].start(); err != nil {
		return err
	}
	return waitHTTP(ctx, c.apis[node], c.hc, c.urls[node]+"/readyz", "", phaseBound)
}

// owners reads every lease: partition → owner node and epoch, and whether
// it is live on the database clock.
type leaseView struct {
	owner string
	epoch int64
	live  bool
}

func (c *moveCluster) owners(ctx context.Context) (map[string]leaseView, error) {
	rows, err := c.db.Query(ctx, `SELECT partition_id, owner_node, epoch, expires_at > now() FROM leases`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]leaseView{}
	for rows.Next() {
		var p string
		var v leaseView
		if err := rows.Scan(&p, &v.owner, &v.epoch, &v.live); err != nil {
			return nil, err
		}
		out[p] = v
	}
	return out, rows.Err()
}

// homes maps each partition to the node the latest map names.
func (c *moveCluster) homes(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	ix, _ := mapIndex(t, ctx, c.hc, c.urls["api-3"], c.token)
	out := map[string]string{}
	for _, p := range ix.Map().Partitions {
		out[p.ID] = p.Primary.Node
	}
	return out
}

// moveLoad uploads through one entry node into repos, retrying each blob
// until it is acknowledged (201, or 202 whose finalization the workers
// publish), and records every answer.
type moveLoad struct {
	c     *moveCluster
	entry string
	repos []string

	mu      sync.Mutex
	answers map[int]int // status → count (0: no answer)
	bad     []string    // answers a client would not retry
	acked   []moveAck
}

type moveAck struct {
	repo, digest string
	body         []byte
	status       int
	sent, at     time.Time // the acknowledged attempt's start and answer
}

func (l *moveLoad) run(ctx context.Context, workers int) (wait func()) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := 0; ctx.Err() == nil; i++ {
				repo := l.repos[(w+i)%len(l.repos)]
				body := make([]byte, 1024+rng.IntN(8<<10))
				for j := range body {
					body[j] = byte(rng.Uint32())
				}
				l.upload(ctx, repo, body)
				// About 20 uploads a second per client: a steady load,
				// not a flood that would fill the principal's bound on
				// open uploads with 202s while a home is down.
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		}()
	}
	return wg.Wait
}

// send sends method path (with body, as the cluster's token) to node and
// returns the status (0: no answer) and the first KiB of the answer.
func (c *moveCluster) send(ctx context.Context, node, method, path string, body []byte) (int, []byte) {
	status, msg, _ := c.sendH(ctx, node, method, path, body)
	return status, msg
}

// sendH is send that also returns the answer's headers (nil when there
// was no answer).
func (c *moveCluster) sendH(ctx context.Context, node, method, path string, body []byte) (int, []byte, http.Header) {
	req, err := http.NewRequestWithContext(ctx, method, c.urls[node]+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, nil
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return resp.StatusCode, msg, resp.Header
}

func (l *moveLoad) upload(ctx context.Context, repo string, body []byte) {
	digest := digestHex(body)
	for ctx.Err() == nil {
		sent := time.Now()
		status, msg := l.c.send(ctx, l.entry, http.MethodPost, "/v2/"+repo+"/blobs/uploads/?digest="+digest, body)
		l.mu.Lock()
		l.answers[status]++
		switch {
		case status == http.StatusCreated || status == http.StatusAccepted:
			l.acked = append(l.acked, moveAck{repo: repo, digest: digest, body: body, status: status, sent: sent, at: time.Now()})
			l.mu.Unlock()
			return
		case status == 0 || status == http.StatusServiceUnavailable || status == http.StatusMisdirectedRequest || status == http.StatusTooManyRequests:
			// retried, as any client would
		default:
			l.bad = append(l.bad, fmt.Sprintf("%d %s", status, bytes.TrimSpace(msg)))
		}
		l.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond): // a client's retry pause
		}
	}
}

// firstCreatedAfter is when each of repos first had an upload sent after
// since answered 201 (none: absent).
func (l *moveLoad) firstCreatedAfter(repos []string, since time.Time) map[string]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]time.Time{}
	for _, a := range l.acked {
		if a.status == http.StatusCreated && a.sent.After(since) && slices.Contains(repos, a.repo) {
			if t, ok := out[a.repo]; !ok || a.at.Before(t) {
				out[a.repo] = a.at
			}
		}
	}
	return out
}

func (l *moveLoad) snapshot() (answers map[int]int, bad []string, acked []moveAck) {
	l.mu.Lock()
	defer l.mu.Unlock()
	answers = map[int]int{}
	for k, v := range l.answers {
		answers[k] = v
	}
	return answers, slices.Clone(l.bad), slices.Clone(l.acked)
}

func TestHomesMoveByThemselves(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	c := newMoveCluster(t)
	ctx := context.Background()
	// Two repositories homed on each api node, by the published map.
	ix, _ := mapIndex(t, ctx, c.hc, c.urls["api-3"], c.token)
	repoHome := map[string]string{}
	perNode := map[string][]string{}
	for i := 0; len(repoHome) < 6; i++ {
		if i > 1000 {
			t.Fatal("the map homes no two repositories on each node")
		}
		name := fmt.Sprintf("moves/r%03d", i)
		res, err := ix.ResolveKey(name)
		if err != nil {
			t.Fatal(err)
		}
		home := res.Primary().Node
		if len(perNode[home]) >= 2 {
			continue
		}
		if _, err := runTool(filepath.Join(filepath.Dir(c.apis["api-1"].bin), "api"), []string{"DATABASE_URL=" + c.pg.URL()}, "repo", "create", name); err != nil {
			t.Fatal(err)
		}
		perNode[home] = append(perNode[home], name)
		repoHome[name] = home
	}
	var repos []string
	for r := range repoHome {
		repos = append(repos, r)
	}
	slices.Sort(repos)
	for _, node := range c.nodeIDs() {
		for _, r := range perNode[node] {
			if err := waitHTTP(ctx, c.apis[node], c.hc, c.urls[node]+"/v1/home/"+r, c.token, phaseBound); err != nil {
				t.Fatal(err)
			}
		}
	}
	loadCtx, stopLoad := context.WithCancel(ctx)
	l := &moveLoad{c: c, entry: "api-3", repos: repos, answers: map[int]int{}}
	wait := l.run(loadCtx, 4)
	defer func() { stopLoad(); wait() }()
	time.Sleep(time.Second) // warm-up: the load runs for a second before the first fault

	t.Run("kill -9 of a home", func(t *testing.T) { killedHomeMoves(t, c, l, perNode["api-1"]) })
	t.Run("SIGTERM of a home under load", func(t *testing.T) { terminatedHomeHandsOff(t, c, l) })
	t.Run("a paused home resumed cannot publish", func(t *testing.T) { pausedHomeIsFenced(t, c, l) })
	t.Run("split under load, then merge", func(t *testing.T) { splitThenMerge(t, c, l, repos) })

	stopLoad()
	wait()
	answers, bad, acked := l.snapshot()
	t.Logf("moves: %d uploads acknowledged; answers %v", len(acked), answers)
	if len(bad) > 0 {
		t.Errorf("answers a client would not retry: %d, e.g. %q", len(bad), bad[:min(3, len(bad))])
	}
	verifyAcked(t, c, acked)
}

// killedHomeMoves: SIGKILL of api-1; its partitions move to a live node of
// its datacenter by themselves, and uploads into its repositories are
// answered 201 again within the lease TTL plus the controller's reaction.
func killedHomeMoves(t *testing.T, c *moveCluster, l *moveLoad, repos []string) {
	ctx := context.Background()
	// The controller's first moves (it balances the nodes as they start)
	// end before the kill: the epochs checked below are the killed
	// node's, not those of a handoff finishing meanwhile (seen in CI: a
	// handoff to api-1 published just before the kill, so its recovery
	// was two epochs past the lease read here).
	c.waitNoMoves(t, ctx)
	before, err := c.owners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := c.apis["api-1"].kill(); err != nil {
		t.Fatal(err)
	}
	deadline := killed.Add(40 * time.Second)
	var first map[string]time.Time
	for time.Now().Before(deadline) {
		if first = l.firstCreatedAfter(repos, killed); len(first) == len(repos) {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling the load's record
	}
	if len(first) != len(repos) {
		t.Fatalf("after SIGKILL of api-1, 201 again for %d of %d of its repositories within 40s", len(first), len(repos))
	}
	for _, r := range repos {
		t.Logf("moves: kill -9 → first 201 into %s: %s (lease TTL 10s)", r, first[r].Sub(killed).Round(time.Millisecond))
	}
	after, err := c.owners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	homes := c.homes(t, ctx)
	for p, was := range before {
		if was.owner != "api-1" {
			continue
		}
		now := after[p]
		// Same datacenter first: api-2 is dc-a's other node.
		if now.owner != "api-2" || now.epoch != was.epoch+1 || homes[p] != "api-2" {
			t.Errorf("partition %s: lease %+v, map names %s; want api-2 at epoch %d (R15, R16)", p, now, homes[p], was.epoch+1)
		}
	}
	logMoves(t, c, "api-1")
	var recovered int
	if err := c.db.QueryRow(ctx, `SELECT count(*) FROM handoffs WHERE kind = 'recover' AND from_node = 'api-1' AND state = 'published'`).Scan(&recovered); err != nil || recovered == 0 {
		t.Errorf("recover moves recorded: %d (%v)", recovered, err)
	}
	if err := c.startAPI(ctx, "api-1"); err != nil {
		t.Fatal(err)
	}
}

// terminatedHomeHandsOff: SIGTERM of api-2 (now home of its partitions and
// api-1's): every partition is handed off live before it stops being
// chosen and closes its listener (R83, R84), the process exits by itself,
// and each move's outage is measured (R135).
func terminatedHomeHandsOff(t *testing.T, c *moveCluster, l *moveLoad) {
	ctx := context.Background()
	p := c.apis["api-2"]
	started := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(40 * time.Second):
		t.Fatal("api-2 did not exit within 40s of SIGTERM")
	}
	took := time.Since(started)
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("api-2 exited %d after SIGTERM", code)
	}
	log := readLog(t, p)
	drained := strings.Index(log, "drain: every partition handed off")
	closing := strings.LastIndex(log, "api shutting down: draining in-flight requests")
	if drained < 0 || closing < drained {
		t.Errorf("R84: the hand-off (at %d) must come before the listener closes (at %d)", drained, closing)
	}
	var n int
	var p50, pmax float64
	if err := c.db.QueryRow(ctx, `SELECT count(*), coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY s), 0), coalesce(max(s), 0)
		FROM (SELECT extract(epoch FROM finished_at - unavailable_since) AS s FROM handoffs
		      WHERE kind = 'handoff' AND from_node = 'api-2' AND state = 'published') x`).Scan(&n, &p50, &pmax); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no handoff recorded off api-2")
	}
	logMoves(t, c, "api-2")
	t.Logf("moves: SIGTERM → exit %s; %d partitions handed off, unavailability per handoff p50 %.0f ms, max %.0f ms (seal → map naming the new home)", took.Round(time.Millisecond), n, p50*1000, pmax*1000)
	owners, err := c.owners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for part, o := range owners {
		if o.owner == "api-2" && o.live {
			t.Errorf("partition %s still leased live to api-2 after it stopped", part)
		}
	}
	if err := c.startAPI(ctx, "api-2"); err != nil {
		t.Fatal(err)
	}
}

// pausedHomeIsFenced: SIGSTOP of the node that holds the most partitions;
// its leases expire, the controller moves them (the node is still
// connected: after the live grace), and after SIGCONT the resumed node
// fences itself: it holds nothing at the old epochs and the map no longer
// names it (R17, R18, R20, R24).
func pausedHomeIsFenced(t *testing.T, c *moveCluster, l *moveLoad) {
	ctx := context.Background()
	before, err := c.owners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, o := range before {
		count[o.owner]++
	}
	victim := "api-1"
	for _, n := range c.nodeIDs() {
		if count[n] > count[victim] {
			victim = n
		}
	}
	p := c.apis[victim]
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	deadline := paused.Add(40 * time.Second)
	for {
		now, err := c.owners(ctx)
		if err != nil {
			t.Fatal(err)
		}
		moved := true
		for part, was := range before {
			if was.owner == victim && (now[part].owner == victim || !now[part].live) {
				moved = false
			}
		}
		if moved {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the partitions of paused %s did not move within 40s: %v", victim, now)
		}
		time.Sleep(100 * time.Millisecond) // polling the lease table
	}
	t.Logf("moves: SIGSTOP of %s → its %d partitions moved after %s", victim, count[victim], time.Since(paused).Round(time.Millisecond))
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The resumed node's keeper finds its self-fence deadline passed on
	// the monotonic clock, or its renewal refused: it holds nothing.
	deadline = time.Now().Add(20 * time.Second)
	for p.logCount("self-fenced") == 0 && p.logCount("lease lost") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s resumed and neither self-fenced nor saw its lease lost", victim)
		}
		time.Sleep(50 * time.Millisecond) // polling its log
	}
	after, err := c.owners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for part, was := range before {
		if was.owner != victim {
			continue
		}
		if o := after[part]; o.owner == victim || o.epoch <= was.epoch {
			t.Errorf("partition %s after the pause: lease %+v", part, o)
		}
	}
	// The map follows the leases once each new home reports ready (R79):
	// a moment after the claims the loop above waited for.
	deadline = time.Now().Add(20 * time.Second)
	for {
		homes, stale := c.homes(t, ctx), ""
		for part, was := range before {
			if was.owner == victim && homes[part] == victim {
				stale = part
			}
		}
		if stale == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition %s: the map still names paused %s 20 s after its lease moved", stale, victim)
		}
		time.Sleep(100 * time.Millisecond) // polling the published map
	}
}

// logMoves prints the published and aborted moves off node.
func logMoves(t *testing.T, c *moveCluster, node string) {
	t.Helper()
	rows, err := c.db.Query(context.Background(), `SELECT partition_id, kind, to_node, state, coalesce(abort_reason, ''),
		coalesce(extract(epoch FROM finished_at - unavailable_since), 0) FROM handoffs WHERE from_node = $1 ORDER BY handoff_id`, node)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var part, kind, to, state, why string
		var s float64
		if err := rows.Scan(&part, &kind, &to, &state, &why, &s); err != nil {
			t.Fatal(err)
		}
		t.Logf("moves:   %s %s %s→%s %s %s (unavailable %.0f ms)", part, kind, node, to, state, why, s*1000)
	}
}

// splitThenMerge: `controller split` of a repository's partition while the
// load runs, then `controller merge` of its children, by the CLI with the
// service running; uploads into the repository are answered 201 after
// each, and the lease table never shows a parent and a child both able
// to serve (R74, R89–R96).
func splitThenMerge(t *testing.T, c *moveCluster, l *moveLoad, repos []string) {
	ctx := context.Background()
	ix, _ := mapIndex(t, ctx, c.hc, c.urls["api-3"], c.token)
	repo := repos[0]
	res, err := ix.ResolveKey(repo)
	if err != nil {
		t.Fatal(err)
	}
	parent := res.Partition.ID
	started := time.Now()
	out, err := runTool(c.ctlBin, c.ctlEnv, "split", "--partition", parent, "--operator", "soak", "--reason", "split under load", "--wait", "30s")
	if err != nil {
		t.Fatalf("controller split: %v\n%s", err, out)
	}
	t.Logf("moves: controller split %s took %s:\n%s", parent, time.Since(started).Round(time.Millisecond), strings.TrimSpace(out))
	children := childrenOf(t, c, parent)
	if len(children) != 2 {
		t.Fatalf("children of %s: %v", parent, children)
	}
	checkNoOverlap(t, c, []string{parent}, children)
	since := time.Now()
	waitCreated(t, l, repo, since)

	started = time.Now()
	out, err = runTool(c.ctlBin, c.ctlEnv, "merge", "--partitions", strings.Join(children, ","), "--operator", "soak", "--reason", "merge under load", "--wait", "30s")
	if err != nil {
		t.Fatalf("controller merge: %v\n%s", err, out)
	}
	t.Logf("moves: controller merge took %s:\n%s", time.Since(started).Round(time.Millisecond), strings.TrimSpace(out))
	merged := childrenOf(t, c, children[0])
	if len(merged) != 1 {
		t.Fatalf("merged child of %v: %v", children, merged)
	}
	checkNoOverlap(t, c, children, merged)
	waitCreated(t, l, repo, time.Now())
	var states []string
	if err := c.db.QueryRow(ctx, `SELECT array_agg(partition_id || '=' || state ORDER BY partition_id) FROM leases WHERE partition_id = ANY($1)`,
		append(append([]string{parent}, children...), merged...)).Scan(&states); err != nil {
		t.Fatal(err)
	}
	t.Logf("moves: leases after the merge: %v", states)
}

// childrenOf reads the children that replaced parent (handoff_children).
func childrenOf(t *testing.T, c *moveCluster, parent string) []string {
	t.Helper()
	var ids []string
	if err := c.db.QueryRow(context.Background(), `SELECT coalesce(array_agg(child_id ORDER BY child_id), '{}') FROM handoff_children
		WHERE parents @> jsonb_build_array(jsonb_build_object('id', $1::text))`, parent).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	return ids
}

// checkNoOverlap: the parents are sealed and every child is held live.
func checkNoOverlap(t *testing.T, c *moveCluster, parents, children []string) {
	t.Helper()
	var open, held int
	if err := c.db.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM leases WHERE partition_id = ANY($1) AND state <> 'SEALED'),
		(SELECT count(*) FROM leases WHERE partition_id = ANY($2) AND state = 'SERVING' AND expires_at > now())`, parents, children).Scan(&open, &held); err != nil {
		t.Fatal(err)
	}
	if open != 0 || held != len(children) {
		t.Errorf("parents %v: %d not sealed; children %v: %d of %d serving", parents, open, children, held, len(children))
	}
}

// waitCreated waits for an upload into repo answered 201 after since.
func waitCreated(t *testing.T, l *moveLoad, repo string, since time.Time) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(l.firstCreatedAfter([]string{repo}, since)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no upload into %s answered 201 within 20s", repo)
		}
		time.Sleep(50 * time.Millisecond) // polling the load's record
	}
}

func readLog(t *testing.T, p *proc) string {
	t.Helper()
	b, err := os.ReadFile(p.logf.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// verifyAcked reads every acknowledged upload back with its exact bytes
// (a 202 once its finalization is published): nothing acknowledged is
// lost. (Nothing is doubled by construction: a reference is keyed by
// repository and digest, and a retried publication finds it.)
func verifyAcked(t *testing.T, c *moveCluster, acked []moveAck) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for _, a := range acked {
		for {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.urls["api-3"]+"/v2/"+a.repo+"/blobs/"+a.digest, nil)
			req.Header.Set("Authorization", "Bearer "+c.token)
			resp, err := c.hc.Do(req)
			var got []byte
			status := 0
			if err == nil {
				status = resp.StatusCode
				got, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if status == http.StatusOK && bytes.Equal(got, a.body) {
				break
			}
			if time.Now().After(deadline) {
				var job string
				_ = c.db.QueryRow(ctx, `SELECT coalesce(string_agg(format('intent %s %s: job %s attempt %s scheduled %s, last error %s', i.operation_id, i.state, j.state, j.attempt, j.scheduled_at, j.errors[array_length(j.errors, 1)]), '; '), 'no intent')
					FROM intents i LEFT JOIN river_job j ON j.kind = 'finalize' AND j.args->>'operation_id' = i.operation_id::text
					WHERE i.repository = $1 AND i.expected_digest = $2`, a.repo, a.digest).Scan(&job)
				t.Fatalf("acknowledged (%d at %s) %s in %s: read back %d (%v), %d bytes; %s", a.status, a.at.Format(time.RFC3339Nano), a.digest, a.repo, status, err, len(got), job)
			}
			time.Sleep(100 * time.Millisecond) // a 202's finalization is published by a worker
		}
	}
}

// TestFailoverTimes measures kill -9 of a home → first 201 into its
// repository at the new home, over BLOBPLANE_FAILOVER_RUNS kills (a
// measurement, not run by default: each costs a lease TTL), beside the
// lease TTL (BLOBPLANE_FAILOVER_TTL, passed to the apis as
// BLOBPLANE_LEASE_TTL; default theirs, 8s).
// `BLOBPLANE_FAILOVER_RUNS=20 go test ./soak -run TestFailoverTimes -v`.
func TestFailoverTimes(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("BLOBPLANE_FAILOVER_RUNS"))
	if runs <= 0 {
		t.Skip("a measurement: set BLOBPLANE_FAILOVER_RUNS")
	}
	ttl := cmp.Or(os.Getenv("BLOBPLANE_FAILOVER_TTL"), "8s")
	c := newMoveCluster(t, "BLOBPLANE_LEASE_TTL="+ttl)
	ctx := context.Background()
	repo := "moves/failover"
	if _, err := runTool(filepath.Join(filepath.Dir(c.apis["api-1"].bin), "api"), []string{"DATABASE_URL=" + c.pg.URL()}, "repo", "create", repo); err != nil {
		t.Fatal(err)
	}
	loadCtx, stop := context.WithCancel(ctx)
	l := &moveLoad{c: c, entry: "api-3", repos: []string{repo}, answers: map[int]int{}}
	wait := l.run(loadCtx, 2)
	defer func() { stop(); wait() }()
	var times []time.Duration
	for i := 0; i < runs; i++ {
		ix, _ := mapIndex(t, ctx, c.hc, c.urls["api-3"], c.token)
		res, err := ix.ResolveKey(repo)
		if err != nil {
			t.Fatal(err)
		}
		home := res.Primary().Node
		if home == "api-3" { // the entry stays up: move the home off it first
			if _, err := runTool(c.ctlBin, c.ctlEnv, "takeover", "--partition", res.Partition.ID, "--node", "api-1", "--operator", "soak", "--reason", "measure"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second) // the map follows the forced lease
			i--
			continue
		}
		waitCreated(t, l, repo, time.Now())
		killed := time.Now()
		if err := c.apis[home].kill(); err != nil {
			t.Fatal(err)
		}
		deadline := killed.Add(40 * time.Second)
		for len(l.firstCreatedAfter([]string{repo}, killed)) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("run %d: no 201 within 40s of killing %s", i, home)
			}
			time.Sleep(20 * time.Millisecond) // polling the load's record
		}
		d := l.firstCreatedAfter([]string{repo}, killed)[repo].Sub(killed)
		times = append(times, d)
		t.Logf("failover: run %d, kill -9 %s → 201 at the new home after %s", i, home, d.Round(time.Millisecond))
		if err := c.startAPI(ctx, home); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(times)
	t.Logf("failover: %d kills: p50 %s, p99 %s, max %s (lease TTL %s, controller failover grace 250ms)", len(times),
		times[len(times)/2].Round(time.Millisecond), times[(len(times)*99)/100].Round(time.Millisecond), times[len(times)-1].Round(time.Millisecond), ttl)
}
