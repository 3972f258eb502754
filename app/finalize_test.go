package app_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/internal/nodeauth"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/jobs"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// Finalization away from the home (DESIGN flow 2, issue 6): the ingress
// forwards to the home over the internal endpoint, or queues a finalize
// job the worker forwards later.

const testClusterSecret = "test-cluster-secret-0123456789abcdef"

// homeCluster is startCluster's two api nodes sharing one cluster secret,
// each stoppable and restartable on its address.
type homeCluster struct {
	*cluster
	d     *pgtest.DB
	cfgs  [2]*config.Config
	stops [2]func()
	token string
}

// startHomeCluster starts the two nodes, each config passed through opts
// first.
func startHomeCluster(t testing.TB, opts ...func(i int, cfg *config.Config)) *homeCluster {
	t.Helper()
	d := pgtest.New(t)
	c := &homeCluster{cluster: &cluster{st: store.New(d.Pool, nil)}, d: d}
	for i := range c.nodes {
		cfg := testConfig(t, d.URL)
		cfg.NodeID = fmt.Sprintf("node-%d", i)
		cfg.ClusterSecret = testClusterSecret
		cfg.RiverUI = false
		for _, o := range opts {
			o(i, cfg)
		}
		c.cfgs[i] = cfg
		c.start(t, i)
	}
	t.Cleanup(func() {
		for _, stop := range c.stops {
			if stop != nil {
				stop()
			}
		}
	})
	ctx := context.Background()
	c.publishTwoPartitionMap(t)
	for i := range c.nodes {
		c.waitHome(t, i)
		if err := c.st.CreateRepository(ctx, c.repos[i]); err != nil {
			t.Fatal(err)
		}
	}
	gs, err := auth.ParseGrants([]string{"*:write"})
	if err != nil {
		t.Fatal(err)
	}
	if c.token, _, err = c.st.CreateToken(ctx, "ci", gs); err != nil {
		t.Fatal(err)
	}
	return c
}

// start runs node i (again, on its previous address once it has one).
func (c *homeCluster) start(t testing.TB, i int) {
	t.Helper()
	if c.nodes[i] != nil {
		c.cfgs[i].Listen = c.nodes[i].Addr()
	}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.NewAPI(ctx, c.cfgs[i], slog.New(slog.DiscardHandler))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c.nodes[i] = a
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	c.stops[i] = func() { cancel(); <-done }
}

// stop shuts node i down (its lease is released; its address refuses).
func (c *homeCluster) stop(i int) {
	c.stops[i]()
	c.stops[i] = nil
}

// waitHome waits until node i serves its repository as the home.
func (c *homeCluster) waitHome(t testing.TB, i int) {
	t.Helper()
	waitFor(t, func() bool {
		code, _, _ := c.do(t, c.nodes[i], c.repos[i], nil)
		return code == http.StatusOK
	})
}

func (c *homeCluster) send(t testing.TB, method, url, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.SetBasicAuth("ci", c.token)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func (c *homeCluster) count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := c.d.Pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (c *homeCluster) opOf(t testing.TB, repo string) string {
	t.Helper()
	var op string
	if err := c.d.Pool.QueryRow(context.Background(), `SELECT operation_id::text FROM intents WHERE repository = $1`, repo).Scan(&op); err != nil {
		t.Fatal(err)
	}
	return op
}

func digestOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

type operationView struct {
	State   string         `json:"state"`
	Outcome upload.Outcome `json:"outcome"`
}

func (c *homeCluster) operation(t testing.TB, node int, op string) operationView {
	t.Helper()
	resp, body := c.send(t, "GET", c.nodes[node].URL()+"/v1/operations/"+op, "", nil)
	var v operationView
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil {
		t.Fatalf("GET /v1/operations/%s: %d %s", op, resp.StatusCode, body)
	}
	return v
}

// homeOf is the partition and epoch node i serves its repository under.
func (c *homeCluster) homeOf(t testing.TB, i int) (string, uint64) {
	t.Helper()
	code, _, body := c.do(t, c.nodes[i], c.repos[i], nil)
	var h struct {
		Partition string `json:"partition"`
		Epoch     uint64 `json:"epoch"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &h) != nil {
		t.Fatalf("home probe: %d %s", code, body)
	}
	return h.Partition, h.Epoch
}

const (
	refsQuery     = `SELECT count(*) FROM blob_references WHERE repository = $1 AND digest = $2`
	outcomesQuery = `SELECT count(*) FROM operation_outcomes WHERE operation_id = $1::uuid`
	jobsQuery     = `SELECT count(*) FROM river_job WHERE kind = 'finalize' AND args->>'operation_id' = $1`
)

// Flow 2 away from the home: an upload closed at node-0 for node-1's
// repository is published by forwarding, 201 with the headers of a local
// publication, one reference, one outcome under the home's partition and
// epoch, and no finalize job.
func TestFinalizeForwardedToTheHome(t *testing.T) {
	c := startHomeCluster(t)
	repo, content := c.repos[1], "forwarded layer"
	d := digestOf(content)
	resp, body := c.send(t, "POST", c.nodes[0].URL()+"/v2/"+repo+"/blobs/uploads/?digest="+d, content, nil)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Docker-Content-Digest") != d || resp.Header.Get("Location") != "/v2/"+repo+"/blobs/"+d {
		t.Fatalf("upload away from the home: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	op := c.opOf(t, repo)
	if n := c.count(t, refsQuery, repo, d); n != 1 {
		t.Fatalf("%d references, want 1", n)
	}
	if n := c.count(t, outcomesQuery, op); n != 1 {
		t.Fatalf("%d outcomes, want 1", n)
	}
	if n := c.count(t, jobsQuery, op); n != 0 {
		t.Fatalf("%d finalize jobs after a forwarded publication, want 0", n)
	}
	part, epoch := c.homeOf(t, 1)
	v := c.operation(t, 0, op)
	if v.State != string(upload.IntentAdmitted) || v.Outcome.Partition != part || v.Outcome.Epoch != epoch || string(v.Outcome.Digest) != d {
		t.Fatalf("operation %s: %+v, want admitted under %s@%d", op, v, part, epoch)
	}
	if r, _ := c.send(t, "HEAD", c.nodes[0].URL()+"/v2/"+repo+"/blobs/"+d, "", nil); r.StatusCode != http.StatusOK {
		t.Fatalf("HEAD after forwarding: %d", r.StatusCode)
	}

	// A mount away from the home publishes through the same path.
	other := c.repos[0]
	if r, _ := c.send(t, "POST", c.nodes[1].URL()+"/v2/"+other+"/blobs/uploads/?mount="+d+"&from="+repo, "", nil); r.StatusCode != http.StatusCreated {
		t.Fatalf("mount away from the home: %d", r.StatusCode)
	}
	if n := c.count(t, refsQuery, other, d); n != 1 {
		t.Fatalf("%d references after the mount, want 1", n)
	}

	// A DELETE away from the home is done by the home, under its epoch
	// (ZBP-5 R19), through the signed internal endpoint.
	if r, body := c.send(t, "DELETE", c.nodes[0].URL()+"/v2/"+repo+"/blobs/"+d, "", nil); r.StatusCode != http.StatusAccepted {
		t.Fatalf("delete away from the home: %d %s", r.StatusCode, body)
	}
	if n := c.count(t, refsQuery, repo, d); n != 0 {
		t.Fatalf("%d references after the forwarded delete, want 0", n)
	}
	if r, body := c.send(t, "DELETE", c.nodes[0].URL()+"/v2/"+repo+"/blobs/"+d, "", nil); r.StatusCode != http.StatusNotFound {
		t.Fatalf("second delete away from the home: %d %s", r.StatusCode, body)
	}
	if n := c.count(t, refsQuery, other, d); n != 1 {
		t.Fatalf("the other repository's reference: %d, want 1", n)
	}
}

// The home unreachable: the ingress answers 202 with the operation and
// queues one finalize job (a retried close enqueues no second one); the
// worker publishes it once the home is back; any further attempt returns
// the stored outcome without a second publication (S4).
func TestFinalizeQueuedWhileTheHomeIsDown(t *testing.T) {
	c := startHomeCluster(t)
	repo, content := c.repos[1], "queued layer"
	d := digestOf(content)
	c.stop(1)

	start, _ := c.send(t, "POST", c.nodes[0].URL()+"/v2/"+repo+"/blobs/uploads/", "", nil)
	if start.StatusCode != http.StatusAccepted {
		t.Fatalf("open session: %d", start.StatusCode)
	}
	session := c.nodes[0].URL() + start.Header.Get("Location")
	if r, body := c.send(t, "PATCH", session, content, map[string]string{"Content-Range": fmt.Sprintf("0-%d", len(content)-1)}); r.StatusCode != http.StatusAccepted {
		t.Fatalf("patch: %d %s", r.StatusCode, body)
	}
	op := start.Header.Get("Docker-Upload-UUID")
	for attempt := range 2 { // the second is a client retrying the close
		r, body := c.send(t, "PUT", session+"?digest="+d, "", nil)
		if r.StatusCode != http.StatusAccepted || r.Header.Get("Location") != "/v1/operations/"+op {
			t.Fatalf("close %d with the home down: %d %v %s", attempt, r.StatusCode, r.Header, body)
		}
		if n := c.count(t, jobsQuery, op); n != 1 {
			t.Fatalf("close %d: %d finalize jobs, want 1", attempt, n)
		}
	}
	if v := c.operation(t, 0, op); v.State != string(upload.IntentPending) {
		t.Fatalf("operation before the home is back: %+v", v)
	}
	if n := c.count(t, refsQuery, repo, d); n != 0 {
		t.Fatalf("published while the home was down: %d references", n)
	}

	c.start(t, 1)
	c.waitHome(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	wcfg := testConfig(t, c.d.URL)
	wcfg.NodeID = "worker-0"
	wcfg.ClusterSecret = testClusterSecret
	done := make(chan error, 1)
	go func() { done <- app.RunWorker(ctx, wcfg, slog.New(slog.DiscardHandler)) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, func() bool {
		return c.count(t, `SELECT count(*) FROM river_job WHERE kind = 'finalize' AND state = 'completed' AND args->>'operation_id' = $1`, op) == 1
	})
	part, epoch := c.homeOf(t, 1)
	v := c.operation(t, 0, op)
	if v.State != string(upload.IntentAdmitted) || v.Outcome.Partition != part || v.Outcome.Epoch != epoch {
		t.Fatalf("operation after the worker: %+v, want admitted under %s@%d", v, part, epoch)
	}
	if r, _ := c.send(t, "HEAD", c.nodes[0].URL()+"/v2/"+repo+"/blobs/"+d, "", nil); r.StatusCode != http.StatusOK {
		t.Fatalf("HEAD after the worker published: %d", r.StatusCode)
	}

	// S4: another finalization of the operation id (a duplicate job or a
	// lost response retried) returns the stored outcome.
	again := c.internalFinalize(t, 1, signedCall, op, repo)
	if again.StatusCode != http.StatusOK {
		t.Fatalf("finalizing again: %d, want 200 with the stored outcome", again.StatusCode)
	}
	if n := c.count(t, refsQuery, repo, d); n != 1 {
		t.Fatalf("%d references, want 1", n)
	}
	if n := c.count(t, outcomesQuery, op); n != 1 {
		t.Fatalf("%d outcomes, want 1", n)
	}
}

// signedCall as internalFinalize's authz signs the call with the cluster
// secret (issue 26 point 8).
const signedCall = "signed"

// internalFinalize posts to node i's internal endpoint (its internal
// listener when it has one) without routing headers (served at the home,
// MOVED elsewhere), with authz as Authorization, or signed (signedCall).
func (c *homeCluster) internalFinalize(t testing.TB, i int, authz, op, repo string) *http.Response {
	t.Helper()
	return c.internalPost(t, i, authz, "/internal/v1/finalize/"+op, repo)
}

// internalPost is internalFinalize of any internal path that takes the
// repository in its body.
func (c *homeCluster) internalPost(t testing.TB, i int, authz, path, repo string) *http.Response {
	t.Helper()
	base := c.nodes[i].InternalURL()
	if base == "" {
		base = c.nodes[i].URL()
	}
	body := `{"repository":"` + repo + `"}`
	req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
	switch authz {
	case "":
	case signedCall:
		if err := nodeauth.SignRequest(req, []byte(testClusterSecret), []byte(body), time.Now()); err != nil {
			t.Fatal(err)
		}
	default:
		req.Header.Set("Authorization", authz)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// The internal endpoint accepts only requests signed with the cluster
// secret: no credentials, the secret itself as a static Bearer (before
// issue 26 point 8), a user token (Bearer or Basic) are 401, checked
// before anything else (app/nodeauth_test.go replays the signature
// attacks).
func TestInternalFinalizeNeedsTheClusterSecret(t *testing.T) {
	c := startHomeCluster(t)
	op, repo := "00000000-0000-4000-8000-000000000001", c.repos[1]
	basic := func() string {
		req, _ := http.NewRequest("GET", "/", nil)
		req.SetBasicAuth("ci", c.token)
		return req.Header.Get("Authorization")
	}()
	for name, authz := range map[string]string{
		"none":              "",
		"static bearer":     "Bearer " + testClusterSecret,
		"wrong secret":      "Bearer " + strings.Repeat("x", len(testClusterSecret)),
		"user token":        "Bearer " + c.token,
		"user token, basic": basic,
		"secret as basic":   "Basic " + testClusterSecret,
	} {
		if r := c.internalFinalize(t, 1, authz, op, repo); r.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, r.StatusCode)
		}
		// The home's reference deletion (ZBP-5 R19) likewise.
		if r := c.internalPost(t, 1, authz, jobs.InternalReferencePath+digestOf("kept"), repo); r.StatusCode != http.StatusUnauthorized {
			t.Errorf("delete, %s: %d, want 401", name, r.StatusCode)
		}
	}
	if r := c.internalPost(t, 1, signedCall, jobs.InternalReferencePath+digestOf("kept"), repo); r.StatusCode != http.StatusNotFound {
		t.Errorf("delete of an unknown reference at the home: %d, want 404", r.StatusCode)
	}
	if r := c.internalPost(t, 0, signedCall, jobs.InternalReferencePath+digestOf("kept"), repo); r.StatusCode != authority.StatusMoved {
		t.Errorf("delete at the wrong node: %d, want %d", r.StatusCode, authority.StatusMoved)
	}
	// With the secret, at the home: an unknown operation is 404.
	if r := c.internalFinalize(t, 1, signedCall, op, repo); r.StatusCode != http.StatusNotFound {
		t.Errorf("unknown operation at the home: %d, want 404", r.StatusCode)
	}
	// Away from the home the routing contract answers (MOVED).
	if r := c.internalFinalize(t, 0, signedCall, op, repo); r.StatusCode != authority.StatusMoved {
		t.Errorf("at the wrong node: %d, want %d", r.StatusCode, authority.StatusMoved)
	}
}

// The worker's refusals: a retryable one (the grant revoked between close
// and finalization) stores no outcome and the job retries until it clears;
// a terminal one (the intent abandoned) cancels the job, never publishing.
func TestFinalizeWorkerRetriesRefusalsUntilTheyClearAndCancelsTerminalOnes(t *testing.T) {
	c := startHomeCluster(t)
	ctx := context.Background()
	repo := c.repos[1]
	c.stop(1)
	closeAway := func(content string) string {
		t.Helper()
		r, body := c.send(t, "POST", c.nodes[0].URL()+"/v2/"+repo+"/blobs/uploads/?digest="+digestOf(content), content, nil)
		if r.StatusCode != http.StatusAccepted {
			t.Fatalf("close with the home down: %d %s", r.StatusCode, body)
		}
		return strings.TrimPrefix(r.Header.Get("Location"), "/v1/operations/")
	}
	// Grants of the principal, not of the token, so they can be revoked.
	gs, err := auth.ParseGrants([]string{"*:write"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.st.GrantPrincipal(ctx, "builder", gs); err != nil {
		t.Fatal(err)
	}
	if c.token, _, err = c.st.CreateToken(ctx, "builder", nil); err != nil {
		t.Fatal(err)
	}
	revoked, abandoned := closeAway("revoked layer"), closeAway("abandoned layer")
	if _, err := c.st.AbandonIntent(ctx, abandoned); err != nil {
		t.Fatal(err)
	}
	if err := c.st.RevokePrincipalGrants(ctx, "builder", gs); err != nil {
		t.Fatal(err)
	}
	c.start(t, 1)
	c.waitHome(t, 1)

	wctx, cancel := context.WithCancel(ctx)
	wcfg := testConfig(t, c.d.URL)
	wcfg.NodeID = "worker-0"
	wcfg.ClusterSecret = testClusterSecret
	done := make(chan error, 1)
	go func() { done <- app.RunWorker(wctx, wcfg, slog.New(slog.DiscardHandler)) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	defer func() {
		if t.Failed() {
			rows, err := c.d.Pool.Query(ctx, `SELECT args->>'operation_id', state::text, attempt, coalesce(errors::text, '') FROM river_job WHERE kind = 'finalize'`)
			if err != nil {
				t.Log(err)
				return
			}
			defer rows.Close()
			for rows.Next() {
				var op, state, errs string
				var attempt int
				if err := rows.Scan(&op, &state, &attempt, &errs); err != nil {
					t.Log(err)
					return
				}
				t.Logf("finalize job %s: %s after %d attempts: %s", op, state, attempt, errs)
			}
		}
	}()
	failedOnce := `SELECT count(*) FROM river_job WHERE kind = 'finalize' AND args->>'operation_id' = $1 AND state IN ('retryable', 'available', 'running') AND cardinality(errors) >= 1`
	waitFor(t, func() bool { return c.count(t, failedOnce, revoked) == 1 })
	if n := c.count(t, outcomesQuery, revoked); n != 0 {
		t.Fatalf("a refused finalization stored %d outcomes", n)
	}
	if err := c.st.GrantPrincipal(ctx, "builder", gs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return c.count(t, `SELECT count(*) FROM river_job WHERE kind = 'finalize' AND state = 'completed' AND args->>'operation_id' = $1`, revoked) == 1 &&
			c.count(t, `SELECT count(*) FROM river_job WHERE kind = 'finalize' AND state = 'cancelled' AND args->>'operation_id' = $1`, abandoned) == 1
	})
	if n := c.count(t, outcomesQuery, revoked); n != 1 {
		t.Fatalf("%d outcomes once the grant was restored, want 1", n)
	}
	if n := c.count(t, outcomesQuery, abandoned); n != 0 {
		t.Fatalf("an abandoned intent published: %d outcomes", n)
	}
	if n := c.count(t, refsQuery, repo, digestOf("abandoned layer")); n != 0 {
		t.Fatalf("an abandoned intent published: %d references", n)
	}
}

// Issue 26 attack 1 at the home: the forwarded finalization (which the
// finalize job sends too, jobs.HomeFinalizer) of an upload that claimed a
// digest and never sent its bytes is refused, though a verified placement
// of the digest exists (another repository's upload): a claim is no
// possession (S9). The handler test TestAttackPublishBlobNeverUploaded
// replays how such a claim is made over HTTP.
func TestAttackForwardedFinalizeOfAClaimNeverUploaded(t *testing.T) {
	c := startHomeCluster(t)
	ctx := context.Background()
	content := "alice's blob, verified in another repository"
	d := digestOf(content)
	if resp, body := c.send(t, "POST", c.nodes[1].URL()+"/v2/"+c.repos[1]+"/blobs/uploads/?digest="+d, content, nil); resp.StatusCode != http.StatusCreated {
		t.Fatalf("push into %s: %d %s", c.repos[1], resp.StatusCode, body)
	}
	in, err := c.st.CreateIntent(ctx, upload.NewIntent{Repository: c.repos[0], Principal: "ci", ExpectedSize: upload.SizeUnknown,
		IngressDatacenter: c.cfgs[0].Datacenter, Backend: "fs", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.st.RecordIntentContent(ctx, in.OperationID, blobplane.Digest(d), int64(len(content))); err != nil {
		t.Fatal(err)
	}
	if resp := c.internalFinalize(t, 0, signedCall, in.OperationID, c.repos[0]); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("forwarded finalization of a claim never uploaded: %d; want 400", resp.StatusCode)
	}
	if n := c.count(t, "SELECT count(*) FROM blob_references WHERE repository = $1 AND digest = $2", c.repos[0], d); n != 0 {
		t.Fatalf("%s references the digest it never uploaded", c.repos[0])
	}
}
