//go:build unix

package soak_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	bpminio "github.com/blobplane/blobplane/internal/minio"
	"github.com/blobplane/blobplane/internal/testbin"
)

// The replication tests' topology (issue 28): three datacenters, each an
// api and a worker process; eu-1 and us-1 on filesystem backends, ap-1 on
// a MinIO bucket served by a MinIO process of the test's own (so the test
// can stop it and start it again on the same address and data directory).
const (
	eu1 = "eu-1"
	us1 = "us-1"
	ap1 = "ap-1"
	// apBucket is ap-1's bucket.
	apBucket = "blobs-ap-1"
	// repBound bounds each wait of the replication tests: a condition
	// not met within it fails the test with what was last seen.
	repBound = 60 * time.Second
)

var repDCs = []string{eu1, us1, ap1}

// repCluster is the three-datacenter system under test.
type repCluster struct {
	pg      *pgCluster
	bins    string
	apis    map[string]*proc  // by datacenter
	workers map[string]*proc  // by datacenter
	urls    map[string]string // the api's base URL, dialled directly by the test
	links   map[string]*link  // what the other nodes dial to reach the api (its advertised address)
	metrics map[string]string // the worker's /metrics URL
	roots   map[string]string // the filesystem backend's root (eu-1, us-1)
	nodes   map[string]string // api node id → datacenter

	minio    *proc // ap-1's object store
	minioURL string

	token string
	db    *pgxpool.Pool // the test's own connections (ledger, River jobs)
	hc    *http.Client  // small requests (10 s)
	big   *http.Client  // blob bodies: bounded by the request's context
}

// repOpts varies the cluster of one test.
type repOpts struct {
	// late datacenters are prepared but not started: join starts them.
	late []string
	// workerEnv is added to every worker's environment.
	workerEnv []string
}

// newRepCluster starts Postgres and MinIO, migrates, issues a token,
// starts the three apis, publishes one partition map over them and starts
// the three workers, each serving its metrics.
func newRepCluster(t *testing.T) *repCluster { return newRepClusterWith(t, repOpts{}) }

// newRepClusterWith is newRepCluster with opts: the map covers the apis
// started at first (not the late ones).
func newRepClusterWith(t *testing.T, opts repOpts) *repCluster {
	t.Helper()
	minioBin, err := bpminio.Binary()
	if err != nil {
		if strings.EqualFold(os.Getenv("CI"), "true") {
			t.Fatalf("CI=true and %v; build it with: %s", err, bpminio.BuildCommand)
		}
		t.Skipf("replication soak: %v; build it with: %s", err, bpminio.BuildCommand)
	}
	pg := startPostgres(t)
	c := &repCluster{pg: pg, bins: testbin.Build(t),
		apis: map[string]*proc{}, workers: map[string]*proc{}, urls: map[string]string{}, links: map[string]*link{},
		metrics: map[string]string{}, roots: map[string]string{}, nodes: map[string]string{}}
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	c.hc = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	c.big = &http.Client{Transport: tr}
	t.Cleanup(tr.CloseIdleConnections)
	dir := t.TempDir()
	ctx := context.Background()

	c.startMinIO(t, minioBin, filepath.Join(dir, "minio"))

	secret := make([]byte, 24)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	common := []string{"DATABASE_URL=" + pg.URL(), "BLOBPLANE_LOG_FORMAT=json", "BLOBPLANE_DATA_DIR=" + filepath.Join(dir, "tools")}
	api := filepath.Join(c.bins, "api")
	if out, err := runTool(api, common, "migrate"); err != nil {
		t.Fatalf("replication soak: %v\n%s", err, out)
	}
	tok, err := runTool(api, common, "token", "bootstrap", "--principal", "soak")
	if err != nil {
		t.Fatalf("replication soak: %v", err)
	}
	c.token = strings.TrimSpace(tok)

	for _, dc := range repDCs {
		apiPort, err := stablePort()
		if err != nil {
			t.Fatal(err)
		}
		metricsPort, err := stablePort()
		if err != nil {
			t.Fatal(err)
		}
		var backends string
		if dc == ap1 {
			q := url.Values{}
			q.Set("endpoint", c.minioURL)
			q.Set("region", bpminio.Region)
			q.Set("path_style", "true")
			q.Set("access_key_id", minioUser)
			q.Set("secret_access_key", minioPassword(c.minio))
			backends = "s3main=s3://" + apBucket + "?" + q.Encode()
		} else {
			c.roots[dc] = filepath.Join(dir, dc, "blobs")
			backends = "fs=filesystem:" + c.roots[dc]
		}
		// The other nodes reach this api through a link the test can
		// throttle (a WAN between datacenters); the test itself dials
		// the api directly.
		c.links[dc] = newLink(t, "127.0.0.1:"+strconv.Itoa(apiPort))
		env := []string{
			"DATABASE_URL=" + pg.URL(),
			"BLOBPLANE_DATACENTER=" + dc,
			"BLOBPLANE_DATA_DIR=" + filepath.Join(dir, dc),
			"BLOBPLANE_BACKENDS=" + backends,
			"BLOBPLANE_CLUSTER_SECRET=" + hex.EncodeToString(secret),
			"BLOBPLANE_SHUTDOWN_TIMEOUT=5s",
			"BLOBPLANE_LOG_FORMAT=json",
		}
		apiEnv := append(env[:len(env):len(env)],
			"BLOBPLANE_NODE_ID=api-"+dc,
			"BLOBPLANE_LISTEN=127.0.0.1:"+strconv.Itoa(apiPort),
			"BLOBPLANE_ADVERTISE_URL=http://"+c.links[dc].addr(),
			"BLOBPLANE_RIVERUI=false")
		workerEnv := append(env[:len(env):len(env)],
			// A policy changed later converges within seconds here,
			// not the default minute (TestReplicationPolicyChangeConverges).
			"BLOBPLANE_RECONCILE_CRON=@every 2s",
			"BLOBPLANE_NODE_ID=worker-"+dc,
			"BLOBPLANE_WORKER_METRICS=127.0.0.1:"+strconv.Itoa(metricsPort))
		workerEnv = append(workerEnv, opts.workerEnv...)
		c.apis[dc] = newProc(t, "api-"+dc, api, apiEnv)
		c.workers[dc] = newProc(t, "worker-"+dc, filepath.Join(c.bins, "worker"), workerEnv)
		c.urls[dc] = "http://127.0.0.1:" + strconv.Itoa(apiPort)
		c.metrics[dc] = "http://127.0.0.1:" + strconv.Itoa(metricsPort) + "/metrics"
		c.nodes["api-"+dc] = dc
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs(t)
		}
	})
	first := slices.DeleteFunc(slices.Clone(repDCs), func(dc string) bool { return slices.Contains(opts.late, dc) })
	for _, dc := range first {
		if err := c.apis[dc].start(); err != nil {
			t.Fatalf("replication soak: %v", err)
		}
	}
	for _, dc := range first {
		if err := waitHTTP(ctx, c.apis[dc], c.hc, c.urls[dc]+"/readyz", "", repBound); err != nil {
			t.Fatalf("replication soak: %v", err)
		}
	}
	// The placement controller, as scripts/run-datacenters.sh runs it:
	// a signing key, then one map over the three apis.
	ctl := filepath.Join(c.bins, "controller")
	ctlEnv := append(common, "BLOBPLANE_SIGNING_KEY_FILE="+filepath.Join(dir, "controller", "signing-key.json"), "BLOBPLANE_PARTITIONS=8")
	if _, err := runTool(ctl, ctlEnv, "keygen"); err != nil {
		t.Fatalf("replication soak: %v", err)
	}
	if _, err := runTool(ctl, ctlEnv, "publish"); err != nil {
		t.Fatalf("replication soak: %v", err)
	}
	for _, dc := range first {
		if err := c.workers[dc].start(); err != nil {
			t.Fatalf("replication soak: %v", err)
		}
	}
	for _, dc := range first {
		if err := c.waitWorker(ctx, dc); err != nil {
			t.Fatalf("replication soak: %v", err)
		}
	}
	if c.db, err = pgxpool.New(ctx, pg.URL()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.db.Close)
	return c
}

// join starts a late datacenter's api and worker (repOpts.late) and waits
// until both serve: the datacenter joins the running cluster.
func (c *repCluster) join(t *testing.T, ctx context.Context, dc string) {
	t.Helper()
	if err := c.apis[dc].start(); err != nil {
		t.Fatalf("replication soak: %v", err)
	}
	if err := waitHTTP(ctx, c.apis[dc], c.hc, c.urls[dc]+"/readyz", "", repBound); err != nil {
		t.Fatalf("replication soak: %v", err)
	}
	if err := c.workers[dc].start(); err != nil {
		t.Fatalf("replication soak: %v", err)
	}
	if err := c.waitWorker(ctx, dc); err != nil {
		t.Fatalf("replication soak: %v", err)
	}
}

// waitWorker waits until dc's worker serves its metrics: it has opened
// its backends and registered, and River is starting.
func (c *repCluster) waitWorker(ctx context.Context, dc string) error {
	return waitHTTP(ctx, c.workers[dc], c.hc, c.metrics[dc], "", repBound)
}

const minioUser = "blobplane"

// minioPassword is the root password the MinIO process was started with.
func minioPassword(p *proc) string {
	for _, kv := range p.env {
		if v, ok := strings.CutPrefix(kv, "MINIO_ROOT_PASSWORD="); ok {
			return v
		}
	}
	return ""
}

// startMinIO starts ap-1's MinIO on a stable loopback port with its data
// in dataDir (both kept for restarts) and creates ap-1's bucket.
func (c *repCluster) startMinIO(t *testing.T, bin, dataDir string) {
	t.Helper()
	port, err := stablePort()
	if err != nil {
		t.Fatal(err)
	}
	console, err := stablePort()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	pw := make([]byte, 12)
	if _, err := rand.Read(pw); err != nil {
		t.Fatal(err)
	}
	c.minioURL = "http://127.0.0.1:" + strconv.Itoa(port)
	c.minio = newProc(t, "minio-ap-1", bin, []string{
		"MINIO_ROOT_USER=" + minioUser, "MINIO_ROOT_PASSWORD=" + hex.EncodeToString(pw),
		"MINIO_UPDATE=off", "MINIO_BROWSER=off",
	})
	c.minio.args = []string{"server", "--quiet", "--address", "127.0.0.1:" + strconv.Itoa(port),
		"--console-address", "127.0.0.1:" + strconv.Itoa(console), dataDir}
	if err := c.startMinIOProc(context.Background()); err != nil {
		t.Fatalf("replication soak: %v", err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	cl := s3.New(s3.Options{
		Region: bpminio.Region, BaseEndpoint: aws.String(c.minioURL), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(minioUser, minioPassword(c.minio), ""),
		HTTPClient:  &http.Client{Transport: tr, Timeout: 30 * time.Second},
	})
	if _, err := cl.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(apBucket)}); err != nil {
		t.Fatalf("replication soak: create bucket %s: %v", apBucket, err)
	}
}

// startMinIOProc starts MinIO (again) and waits until its object layer
// serves: the cluster health check answers 200 only then (the liveness
// one answers while S3 calls still fail, internal/minio).
func (c *repCluster) startMinIOProc(ctx context.Context) error {
	if err := c.minio.start(); err != nil {
		return err
	}
	return waitHTTP(ctx, c.minio, c.hc, c.minioURL+"/minio/health/cluster", "", repBound)
}

// repoHomedAt creates a repository whose home (by the published map) is
// dc's api, and waits until that api serves it.
func (c *repCluster) repoHomedAt(t *testing.T, ctx context.Context, dc string) string {
	t.Helper()
	ix, doc := mapIndex(t, ctx, c.hc, c.urls[dc], c.token)
	for i := range 1000 {
		name := fmt.Sprintf("repl/r%03d", i)
		res, err := ix.ResolveKey(name)
		if err != nil {
			t.Fatal(err)
		}
		if c.nodes[res.Primary().Node] != dc {
			continue
		}
		if _, err := runTool(filepath.Join(c.bins, "api"), []string{"DATABASE_URL=" + c.pg.URL()}, "repo", "create", name); err != nil {
			t.Fatalf("replication soak: %v", err)
		}
		if err := waitHTTP(ctx, c.apis[dc], c.hc, c.urls[dc]+"/v1/home/"+name, c.token, repBound); err != nil {
			t.Fatalf("replication soak: %v", err)
		}
		return name
	}
	t.Fatalf("replication soak: the map homes no repository at %s: %s", dc, doc)
	return ""
}

// blob is random content regenerated from its seed whenever it is read,
// so a large blob is never held in memory.
type blob struct {
	seed   [32]byte
	size   int64
	digest string
}

func newBlob(t *testing.T, size int64) blob {
	t.Helper()
	b := blob{size: size}
	if _, err := rand.Read(b.seed[:]); err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, b.body()); err != nil {
		t.Fatal(err)
	}
	b.digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	return b
}

func (b blob) body() io.Reader { return io.LimitReader(mrand.NewChaCha8(b.seed), b.size) }

func (b blob) String() string { return fmt.Sprintf("%s (%d bytes)", b.digest, b.size) }

// upload sends b to dc's api in one request (POST .../blobs/uploads/?digest=)
// and expects it published there: 201. A 503 is retried, as a client
// does, after its Retry-After, up to five times (a copy of the same blob
// into dc in flight answers it).
func (c *repCluster) upload(ctx context.Context, dc, repo string, b blob) error {
	var err error
	for range 5 {
		var retry time.Duration
		if retry, err = c.uploadOnce(ctx, dc, repo, b); retry == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(retry):
		}
	}
	return err
}

// uploadOnce is one attempt of upload; retry is the wait a 503 asked for.
func (c *repCluster) uploadOnce(ctx context.Context, dc, repo string, b blob) (retry time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.urls[dc]+"/v2/"+repo+"/blobs/uploads/?digest="+b.digest, b.body())
	if err != nil {
		return 0, err
	}
	req.ContentLength = b.size
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.big.Do(req)
	if err != nil {
		return 0, fmt.Errorf("upload %s at %s: %w", b, dc, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	err = fmt.Errorf("upload %s at %s: %d %s", b, dc, resp.StatusCode, strings.TrimSpace(string(msg)))
	switch resp.StatusCode {
	case http.StatusCreated:
		return 0, nil
	case http.StatusServiceUnavailable:
		s, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return time.Duration(max(s, 1)) * time.Second, err
	}
	return 0, err
}

// readBack GETs b through dc's api (which serves only its own
// datacenter's verified copies) and checks its length and hash.
func (c *repCluster) readBack(ctx context.Context, dc, repo string, b blob) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.urls[dc]+"/v2/"+repo+"/blobs/"+b.digest, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.big.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s at %s: %w", b, dc, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return fmt.Errorf("GET %s at %s: %d %s", b, dc, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	if err != nil {
		return fmt.Errorf("GET %s at %s: body: %w", b, dc, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); n != b.size || got != b.digest {
		return fmt.Errorf("GET %s at %s: %d bytes hashing to %s", b, dc, n, got)
	}
	return nil
}

// storedCopy reads b from dc's filesystem backend itself (not through
// any api) and returns its content's size and digest.
func (c *repCluster) storedCopy(ctx context.Context, dc string, b blob) (int64, string, error) {
	be, err := fs.Open(c.roots[dc], "")
	if err != nil {
		return 0, "", err
	}
	defer be.Close()
	obj, err := be.Read(ctx, blobplane.Digest(b.digest), backend.ReadOptions{})
	if err != nil {
		return 0, "", err
	}
	defer obj.Body.Close()
	h := sha256.New()
	n, err := io.Copy(h, obj.Body)
	if err != nil {
		return n, "", err
	}
	return n, "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// objectPath is where dc's filesystem backend keeps b's object.
func (c *repCluster) objectPath(dc string, b blob) string {
	return filepath.Join(c.roots[dc], filepath.FromSlash(fs.ObjectPath(blobplane.Digest(b.digest))))
}

// tempFiles lists the temp files of writes in progress (or cut off) in
// the directory of b's object at dc (backend/fs writes there, under
// .tmp-<hex prefix>-..., and links the file at the object's name only
// once the content verified).
func (c *repCluster) tempFiles(dc string, b blob) []string {
	dir := filepath.Dir(c.objectPath(dc, b))
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// tempBytes is the size of the temp files in the directory of b's object
// at dc, together: what cut-off or running writes have written so far.
func (c *repCluster) tempBytes(dc string, b blob) int64 {
	var n int64
	for _, name := range c.tempFiles(dc, b) {
		if st, err := os.Stat(filepath.Join(filepath.Dir(c.objectPath(dc, b)), name)); err == nil {
			n += st.Size()
		}
	}
	return n
}

// ledgerRow is one placement of the ledger, as the test reads it.
type ledgerRow struct {
	backend string
	state   string
	reason  string
	epoch   int64
	size    int64
}

func (r ledgerRow) String() string {
	s := fmt.Sprintf("%s/%s epoch %d", r.backend, r.state, r.epoch)
	if r.reason != "" {
		s += " (" + r.reason + ")"
	}
	return s
}

// placements reads digest's placements by datacenter (each datacenter
// has one backend here, so one row at most).
func (c *repCluster) placements(ctx context.Context, digest string) (map[string]ledgerRow, error) {
	rows, err := c.db.Query(ctx, `SELECT datacenter, backend, state, coalesce(reason, ''), epoch, size_bytes
		FROM placements WHERE digest = $1`, digest)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]ledgerRow{}
	for rows.Next() {
		var dc string
		var r ledgerRow
		if err := rows.Scan(&dc, &r.backend, &r.state, &r.reason, &r.epoch, &r.size); err != nil {
			return nil, err
		}
		out[dc] = r
	}
	return out, rows.Err()
}

// jobRow is the River replicate job of one copy, as the test reads it.
type jobRow struct {
	id          int64
	state       string
	attempt     int
	attemptedBy []string
	errors      []string
	scheduledAt time.Time
}

func (j jobRow) String() string {
	errs := make([]string, len(j.errors))
	for i, e := range j.errors {
		if len(e) > 160 {
			e = e[:160] + "..."
		}
		errs[i] = e
	}
	return fmt.Sprintf("job %d %s, attempt %d, attempted by %v, scheduled %s, errors %q",
		j.id, j.state, j.attempt, j.attemptedBy, j.scheduledAt.Format(time.RFC3339Nano), errs)
}

// replicateJob reads the newest replicate job of digest into target.
func (c *repCluster) replicateJob(ctx context.Context, digest, target string) (jobRow, error) {
	var j jobRow
	err := c.db.QueryRow(ctx, `SELECT id, state::text, attempt, coalesce(attempted_by, '{}'),
		       ARRAY(SELECT e->>'error' FROM unnest(errors) AS e), scheduled_at
		FROM river_job WHERE kind = 'replicate' AND args->>'digest' = $1 AND args->>'target_datacenter' = $2
		ORDER BY id DESC LIMIT 1`, digest, target).Scan(&j.id, &j.state, &j.attempt, &j.attemptedBy, &j.errors, &j.scheduledAt)
	return j, err
}

// scrape reads dc's worker metrics: value by series (name{labels}).
func (c *repCluster) scrape(ctx context.Context, dc string) (map[string]float64, error) {
	return c.scrapeURL(ctx, c.metrics[dc])
}

// scrapeAPI reads dc's api metrics.
func (c *repCluster) scrapeAPI(ctx context.Context, dc string) (map[string]float64, error) {
	return c.scrapeURL(ctx, c.urls[dc]+"/metrics")
}

// scrapeURL reads a Prometheus text endpoint: value by series.
func (c *repCluster) scrapeURL(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for line := range strings.SplitSeq(string(text), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, nil
}

// eventually polls cond every 20 ms until it reports done and fails the
// test when it has not within bound, with cond's last description of
// what it saw. Never a sleep that lets something happen: a deadline on a
// condition.
func eventually(t *testing.T, ctx context.Context, bound time.Duration, what string, cond func() (done bool, saw string)) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(bound)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		done, saw := cond()
		if done {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("replication soak: %s: not within %s; last seen: %s", what, bound, saw)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("replication soak: %s: %v; last seen: %s", what, ctx.Err(), saw)
		case <-tick.C:
		}
	}
}

// dumpLogs logs the end of every process's output.
func (c *repCluster) dumpLogs(t *testing.T) {
	for _, dc := range repDCs {
		for _, p := range []*proc{c.apis[dc], c.workers[dc]} {
			t.Logf("--- %s (last 6 KiB of its log) ---\n%s", p.name, p.tail(6<<10))
		}
	}
	t.Logf("--- %s (last 4 KiB of its log) ---\n%s", c.minio.name, c.minio.tail(4<<10))
}

// link is a TCP forwarder in front of an api: what the other datacenters'
// nodes dial (the api advertises its address), standing for the network
// between datacenters. Its bandwidth from the api to the peer can be
// limited (setRate), so that a large transfer takes long enough on any
// machine to be cut off mid-stream.
type link struct {
	ln     net.Listener
	target string
	rate   atomic.Int64 // bytes per second from the api to the peer; 0: unlimited

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func newLink(t *testing.T, target string) *link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &link{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.accept()
	t.Cleanup(l.close)
	return l
}

func (l *link) addr() string { return l.ln.Addr().String() }

// setRate limits the bandwidth of every connection, those open included,
// to bytesPerSecond from the api to its peer (0: unlimited).
func (l *link) setRate(bytesPerSecond int64) { l.rate.Store(bytesPerSecond) }

func (l *link) accept() {
	defer l.wg.Done()
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			return
		}
		if !l.track(conn) {
			return
		}
		l.wg.Add(1)
		go l.serve(conn)
	}
}

// track registers conn to be closed by close; false (conn closed) once
// the link is closed.
func (l *link) track(conn net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		conn.Close()
		return false
	}
	l.conns[conn] = struct{}{}
	return true
}

func (l *link) untrack(conn net.Conn) {
	l.mu.Lock()
	delete(l.conns, conn)
	l.mu.Unlock()
	conn.Close()
}

func (l *link) serve(peer net.Conn) {
	defer l.wg.Done()
	defer l.untrack(peer)
	api, err := net.Dial("tcp", l.target)
	if err != nil || !l.track(api) {
		return
	}
	defer l.untrack(api)
	var up sync.WaitGroup
	up.Go(func() {
		if _, err := io.Copy(api, peer); err == nil {
			_ = api.(*net.TCPConn).CloseWrite()
		} else {
			api.Close()
		}
	})
	if err := l.pump(peer, api); err == nil {
		_ = peer.(*net.TCPConn).CloseWrite()
	} else {
		peer.Close()
		api.Close()
	}
	up.Wait()
}

// pump copies the api's bytes to the peer at the link's rate.
func (l *link) pump(dst, src net.Conn) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if r := l.rate.Load(); r > 0 {
				// The link's bandwidth: these n bytes take n/r seconds
				// on the wire (a rate, not a wait for an event).
				time.Sleep(time.Duration(int64(n) * int64(time.Second) / r))
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// close stops accepting, closes every connection and waits for the
// link's goroutines.
func (l *link) close() {
	l.mu.Lock()
	l.closed = true
	conns := make([]net.Conn, 0, len(l.conns))
	for conn := range l.conns {
		conns = append(conns, conn)
	}
	l.mu.Unlock()
	l.ln.Close()
	for _, conn := range conns {
		conn.Close()
	}
	l.wg.Wait()
}

// setPolicy sets the replication policy of prefix (the admin API).
func (c *repCluster) setPolicy(t *testing.T, ctx context.Context, prefix, body string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.urls[eu1]+"/v1/admin/replication-policies/"+prefix, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("replication soak: PUT policy of %s: %d %s", prefix, resp.StatusCode, b)
	}
}
