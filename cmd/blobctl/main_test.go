package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blobplane/blobplane/client"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/internal/cli"
	"github.com/blobplane/blobplane/internal/testnode"
	"github.com/blobplane/blobplane/partstate"
)

// The tests run blobctl's real command lines in-process against real api
// nodes (internal/testnode: real HTTP, a real Postgres) and, where a
// fault is needed, a reverse proxy in front of them that the test
// controls.

// ctl is one user's blobctl: their config and cache dirs and environment.
type ctl struct {
	t         *testing.T
	configDir string
	cacheDir  string
	vars      map[string]string
}

func newCtl(t *testing.T, vars ...string) *ctl {
	c := &ctl{t: t, configDir: t.TempDir(), cacheDir: t.TempDir(), vars: map[string]string{}}
	for i := 0; i+1 < len(vars); i += 2 {
		c.vars[vars[i]] = vars[i+1]
	}
	return c
}

// run runs blobctl with args and returns its exit code, stdout and stderr.
func (c *ctl) run(args ...string) (int, string, string) {
	return c.runCtx(context.Background(), "", args...)
}

func (c *ctl) runCtx(ctx context.Context, stdin string, args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, env{getenv: func(k string) string { return c.vars[k] }, stdin: strings.NewReader(stdin),
		stdout: &stdout, stderr: &stderr, configDir: c.configDir, cacheDir: c.cacheDir})
	return code, stdout.String(), stderr.String()
}

// ok runs args, fails the test unless blobctl exits 0, and returns stdout.
func (c *ctl) ok(args ...string) string {
	c.t.Helper()
	code, out, errOut := c.run(args...)
	if code != 0 {
		c.t.Fatalf("blobctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// okJSON runs args with --json and decodes stdout into v.
func (c *ctl) okJSON(v any, args ...string) {
	c.t.Helper()
	out := c.ok(append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		c.t.Fatalf("blobctl %s --json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// fails runs args and fails the test unless blobctl exits code; it
// returns stderr.
func (c *ctl) fails(code int, args ...string) string {
	c.t.Helper()
	got, out, errOut := c.run(args...)
	if got != code {
		c.t.Fatalf("blobctl %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), got, code, out, errOut)
	}
	return errOut
}

// randomFile writes n random bytes to a new file and returns its path,
// bytes and digest.
func randomFile(t *testing.T, n int) (string, []byte, string) {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.Read(b)
	p := filepath.Join(t.TempDir(), "blob.bin")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return p, b, "sha256:" + hex.EncodeToString(sum[:])
}

type pushResult struct {
	Repository string `json:"repository"`
	Digest     string `json:"digest"`
	Size       int64  `json:"size"`
	Status     string `json:"status"`
	Resumed    int64  `json:"resumed_bytes"`
	Sent       int64  `json:"sent_bytes"`
	Operation  string `json:"operation"`
	Position   string `json:"position"`
	Outcome    *struct {
		Partition string `json:"partition"`
	} `json:"outcome"`
}

type pullResult struct {
	Size     int64 `json:"size"`
	Resumed  int64 `json:"resumed_bytes"`
	Received int64 `json:"received_bytes"`
}

// A new user's path: login, push (chunked), stat, placements, pull
// (verified), and a second push of the same bytes sends nothing.
func TestPushStatPlacementsPull(t *testing.T) {
	t.Parallel()
	c := testnode.Start(t, 1)
	u := newCtl(t)
	token := c.Token(t, "alice", "team/*:write")
	u.ok("login", "--server", c.URL(0), token)

	path, content, d := randomFile(t, 3<<20+123)
	var res pushResult
	u.okJSON(&res, "push", path, "team/new-repo", "--chunk-size", "1MiB")
	if res.Status != "published" || res.Digest != d || res.Size != int64(len(content)) || res.Sent != int64(len(content)) || res.Resumed != 0 {
		t.Fatalf("push: %+v, want published %s with every byte sent once", res, d)
	}
	if _, err := partstate.ParsePosition(res.Position); err != nil {
		t.Fatalf("push: position %q (ZBP-5 R107): %v", res.Position, err)
	}
	// The token read back: the change is seen; a vanished partition's and
	// a malformed token are refused, saying so.
	u.ok("stat", "team/new-repo@"+d, "--min-position", res.Position)
	if e := u.fails(cli.ExitError, "stat", "team/new-repo@"+d, "--min-position", "p_9999:1:1"); !strings.Contains(e, "410") {
		t.Fatalf("stat at a vanished partition's position: %s", e)
	}
	if e := u.fails(cli.ExitError, "stat", "team/new-repo@"+d, "--min-position", "garbage"); !strings.Contains(e, "400") {
		t.Fatalf("stat at a malformed position: %s", e)
	}
	// The repository was created by the push (issue 31 point 1).
	var info struct {
		Size int64 `json:"size"`
	}
	u.okJSON(&info, "stat", "team/new-repo@"+d)
	if info.Size != int64(len(content)) {
		t.Fatalf("stat: size %d, want %d", info.Size, len(content))
	}
	table := u.ok("placements", "team/new-repo@"+d)
	if !strings.Contains(table, "WHERE") || !strings.Contains(table, "local") || !strings.Contains(table, "verified") {
		t.Fatalf("placements table:\n%s", table)
	}
	out := filepath.Join(t.TempDir(), "copy.bin")
	var pr pullResult
	u.okJSON(&pr, "pull", "team/new-repo@"+d, out)
	if got, _ := os.ReadFile(out); !bytes.Equal(got, content) || pr.Received != int64(len(content)) {
		t.Fatalf("pull: %+v, bytes equal: %t", pr, bytes.Equal(got, content))
	}
	if _, err := os.Stat(out + ".partial"); !os.IsNotExist(err) {
		t.Fatalf("the partial file is left behind: %v", err)
	}
	var again pushResult
	u.okJSON(&again, "push", path, "team/new-repo")
	if again.Status != "exists" || again.Sent != 0 {
		t.Fatalf("second push: %+v, want exists with nothing sent", again)
	}
	// A small file goes in one request.
	small, _, sd := randomFile(t, 1000)
	if line := u.ok("push", small, "team/new-repo", "--progress", "none"); !strings.Contains(line, "published team/new-repo@"+sd) {
		t.Fatalf("push of a small file: %q", line)
	}
}

// login keeps the token in the user's config dir, readable by the user
// only; a refused token is not saved; a saved token goes only to the
// server it was saved for.
func TestLoginStoresTheTokenPrivately(t *testing.T) {
	t.Parallel()
	c := testnode.Start(t, 2)
	u := newCtl(t)
	u.fails(cli.ExitError, "login", "--server", c.URL(0), "bp_not-a-token")
	p := filepath.Join(u.configDir, "blobplane", "blobctl.json")
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("a refused token was saved: %v", err)
	}
	token := c.Token(t, "bob", "team/*:read")
	u.runCtx(context.Background(), token+"\n", "login", "--server", c.URL(0), "--token-stdin")
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("config file mode %v, want 0600", fi.Mode().Perm())
	}
	if di, _ := os.Stat(filepath.Dir(p)); di.Mode().Perm() != 0o700 {
		t.Fatalf("config dir mode %v, want 0700", di.Mode().Perm())
	}
	b, _ := os.ReadFile(p)
	if !strings.Contains(string(b), token) || !strings.Contains(string(b), c.URL(0)) {
		t.Fatalf("config file: %s", b)
	}
	var who struct {
		Principal string   `json:"principal"`
		Grants    []string `json:"grants"`
	}
	u.okJSON(&who, "whoami")
	if who.Principal != "bob" || len(who.Grants) != 1 || who.Grants[0] != "team/*:read" {
		t.Fatalf("whoami: %+v", who)
	}
	// Another server never receives the saved token: anonymous there.
	if e := u.fails(cli.ExitError, "whoami", "--server", c.URL(1)); !strings.Contains(e, "401") {
		t.Fatalf("whoami at another server: %s", e)
	}
	u.ok("logout")
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("logout left the config: %v", err)
	}
}

// faultProxy fronts a node; the test decides what it does to requests.
type faultProxy struct {
	*httptest.Server
	// failPatches aborts every PATCH after the first okPatches.
	failPatches atomic.Bool
	okPatches   atomic.Int64
	patches     atomic.Int64
	patchBytes  atomic.Int64
	// busyOnce answers the next request of method 429 with Retry-After.
	busyOnce atomic.Value // string: method
	busied   atomic.Int64
}

func newFaultProxy(t *testing.T, target string) *faultProxy {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	p := &faultProxy{}
	p.busyOnce.Store("")
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m := p.busyOnce.Load().(string); m == r.Method && p.busyOnce.CompareAndSwap(m, "") {
			p.busied.Add(1)
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		if r.Method == http.MethodPatch {
			n := p.patches.Add(1)
			if p.failPatches.Load() && n > p.okPatches.Load() {
				// The connection dies with part of the chunk read.
				_, _ = io.CopyN(io.Discard, r.Body, 1000)
				panic(http.ErrAbortHandler)
			}
			r.Body = countingBody{r.Body, &p.patchBytes}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// An interrupted push continues where it stopped: the second run sends
// only what the server does not hold.
func TestPushResumesWhereItStopped(t *testing.T) {
	t.Parallel()
	c := testnode.Start(t, 1)
	proxy := newFaultProxy(t, c.URL(0))
	u := newCtl(t, "BLOBPLANE_TOKEN", c.Token(t, "alice", "team/*:write"), "BLOBPLANE_SERVER", proxy.URL)
	path, content, d := randomFile(t, 4<<20)

	proxy.okPatches.Store(2)
	proxy.failPatches.Store(true)
	e := u.fails(cli.ExitError, "push", path, "team/app", "--chunk-size", "1MiB", "--progress", "plain")
	if !strings.Contains(e, "push stopped at 2097152 of 4194304 bytes (run it again to continue)") {
		t.Fatalf("interrupted push: %s", e)
	}
	if !strings.Contains(e, "upload") || !strings.Contains(e, "ETA") {
		t.Fatalf("no plain progress lines: %s", e)
	}
	proxy.failPatches.Store(false)
	proxy.patchBytes.Store(0)
	var res pushResult
	u.okJSON(&res, "push", path, "team/app", "--chunk-size", "1MiB")
	if res.Status != "published" || res.Digest != d || res.Resumed != 2<<20 || res.Sent != 2<<20 {
		t.Fatalf("resumed push: %+v, want published with 2 MiB resumed and 2 MiB sent", res)
	}
	if got := proxy.patchBytes.Load(); got != 2<<20 {
		t.Fatalf("the server received %d bytes in the second push, want %d", got, 2<<20)
	}
	out := filepath.Join(t.TempDir(), "copy.bin")
	u.ok("pull", "team/app@"+d, out)
	if got, _ := os.ReadFile(out); !bytes.Equal(got, content) {
		t.Fatal("the resumed push stored other bytes")
	}
	// The session is forgotten once published.
	if n := countFiles(t, u.cacheDir); n != 0 {
		t.Fatalf("%d upload sessions remembered after publication", n)
	}
}

func countFiles(t *testing.T, dir string) int {
	n := 0
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return nil
	})
	return n
}

// A pull continues from a partial file with a range request; a partial
// file holding wrong bytes is fetched again whole; bytes the server
// cannot vouch for never land in the file.
func TestPullResumesAndVerifies(t *testing.T) {
	t.Parallel()
	c := testnode.Start(t, 1)
	u := newCtl(t, "BLOBPLANE_TOKEN", c.Token(t, "alice", "team/*:write"), "BLOBPLANE_SERVER", c.URL(0))
	path, content, d := randomFile(t, 2<<20+7)
	u.ok("push", path, "team/app")

	out := filepath.Join(t.TempDir(), "copy.bin")
	half := len(content) / 2
	if err := os.WriteFile(out+".partial", content[:half], 0o644); err != nil {
		t.Fatal(err)
	}
	var pr pullResult
	u.okJSON(&pr, "pull", "team/app@"+d, out)
	if pr.Resumed != int64(half) || pr.Received != int64(len(content)-half) {
		t.Fatalf("resumed pull: %+v, want %d resumed and %d received", pr, half, len(content)-half)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, content) {
		t.Fatal("resumed pull: wrong bytes")
	}

	// Wrong kept bytes: the whole is fetched again, and verified.
	bad := bytes.Repeat([]byte{0xAA}, half)
	out2 := filepath.Join(t.TempDir(), "copy.bin")
	if err := os.WriteFile(out2+".partial", bad, 0o644); err != nil {
		t.Fatal(err)
	}
	u.okJSON(&pr, "pull", "team/app@"+d, out2)
	if got, _ := os.ReadFile(out2); !bytes.Equal(got, content) || pr.Resumed != 0 || pr.Received != int64(len(content)-half)+int64(len(content)) {
		t.Fatalf("pull over a corrupt partial file: %+v", pr)
	}

	// The stored copy rots: the server aborts the body, and blobctl
	// writes nothing under the name.
	corruptStoredCopy(t, c.Backends[0], content)
	out3 := filepath.Join(t.TempDir(), "copy.bin")
	u.fails(cli.ExitError, "pull", "team/app@"+d, out3)
	if _, err := os.Stat(out3); !os.IsNotExist(err) {
		t.Fatalf("a body that failed verification was written: %v", err)
	}
}

// corruptStoredCopy flips one byte of content in the backend's object
// holding it.
func corruptStoredCopy(t *testing.T, dir string, content []byte) {
	t.Helper()
	found := false
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || found {
			return nil
		}
		b, err := os.ReadFile(p)
		// The object holds its representation first, then the bytes
		// (identity: random bytes do not compress).
		if err != nil || !bytes.HasSuffix(b, content) {
			return nil
		}
		b[len(b)-len(content)/2] ^= 0xFF
		found = os.WriteFile(p, b, 0o644) == nil
		return nil
	})
	if !found {
		t.Fatal("no stored copy found to corrupt")
	}
}

// A 429 with Retry-After is waited out and the request sent again.
func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	c := testnode.Start(t, 1)
	proxy := newFaultProxy(t, c.URL(0))
	u := newCtl(t, "BLOBPLANE_TOKEN", c.Token(t, "alice", "team/*:write"), "BLOBPLANE_SERVER", proxy.URL)
	path, _, d := randomFile(t, 3<<20)
	proxy.busyOnce.Store(http.MethodPatch)
	code, out, e := u.run("push", path, "team/app", "--chunk-size", "1MiB", "--progress", "none")
	if code != 0 || !strings.Contains(out, "published team/app@"+d) {
		t.Fatalf("push through a 429: exit %d\n%s\n%s", code, out, e)
	}
	if proxy.busied.Load() != 1 || !strings.Contains(e, "429, retrying after 1s (Retry-After)") {
		t.Fatalf("the 429 was not waited out: busied %d, stderr %q", proxy.busied.Load(), e)
	}
	// --retry-for bounds the waiting: past it, the 429 is the answer.
	proxy.busyOnce.Store(http.MethodHead)
	if e := u.fails(cli.ExitError, "stat", "team/app@"+d, "--retry-for", "-1s"); !strings.Contains(e, "429") {
		t.Fatalf("stat with no retry budget: %s", e)
	}
}

// Away from a home that is down, a push is answered 202: blobctl polls
// the operation until the home, back, has published it.
func TestAcceptedPushPollsTheOperation(t *testing.T) {
	t.Parallel()
	c := testnode.Start(t, 2)
	repo := c.Repos[1]
	u := newCtl(t, "BLOBPLANE_TOKEN", c.Token(t, "alice", "team/*:write"), "BLOBPLANE_SERVER", c.URL(0))
	c.Stop(1)

	path, _, d := randomFile(t, 10_000)
	var res pushResult
	u.okJSON(&res, "push", path, repo, "--no-wait")
	if res.Status != "accepted" || !strings.HasPrefix(res.Operation, "/v1/operations/") {
		t.Fatalf("push with the home down: %+v, want accepted with an operation", res)
	}
	// A waiting push, answered 202 before the home is back.
	path2, _, d2 := randomFile(t, 20_000)
	var waited pushResult
	var wg sync.WaitGroup
	wg.Go(func() { u.okJSON(&waited, "push", path2, repo) })
	waitUntil(t, func() bool {
		var n int
		_ = c.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM intents WHERE expected_digest = $1 AND accepted_at IS NOT NULL`, d2).Scan(&n)
		return n == 1
	})
	var op struct {
		State string `json:"state"`
	}
	u.okJSON(&op, "operation", res.Operation)
	if op.State != "pending" {
		t.Fatalf("operation before the home is back: %+v", op)
	}

	c.Restart(t, 1)
	c.StartWorker(t)
	u.okJSON(&op, "operation", res.Operation, "--wait")
	if op.State != "admitted" {
		t.Fatalf("operation after the home is back: %+v", op)
	}
	wg.Wait()
	if waited.Status != "published" || waited.Operation == "" || waited.Outcome == nil || waited.Outcome.Partition == "" {
		t.Fatalf("the waiting push: %+v, want published through its operation", waited)
	}
	u.ok("stat", repo+"@"+d)
	u.ok("stat", repo+"@"+d2)
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// home is routed by the signed map: asked of node 0, it is answered by
// node 1, the home.
func TestHomeFollowsTheSignedMap(t *testing.T) {
	t.Parallel()
	c := testnode.Start(t, 2)
	u := newCtl(t)
	var h struct {
		NodeID     string `json:"node_id"`
		Partition  string `json:"partition"`
		Endpoint   string `json:"endpoint"`
		MapVersion uint64 `json:"map_version"`
	}
	u.okJSON(&h, "home", c.Repos[1], "--server", c.URL(0))
	if h.NodeID != "node-1" || h.Endpoint != c.Nodes[1].Addr() || h.MapVersion != c.Map.Version || h.Partition == "" {
		t.Fatalf("home of %s: %+v", c.Repos[1], h)
	}
}

// Another tenant and an anonymous client get nothing of alice's.
func TestTenantsAndStrangers(t *testing.T) {
	t.Parallel()
	c := testnode.Start(t, 1)
	alice := newCtl(t, "BLOBPLANE_TOKEN", c.Token(t, "alice", "team-a/*:write"), "BLOBPLANE_SERVER", c.URL(0))
	mallory := newCtl(t, "BLOBPLANE_TOKEN", c.Token(t, "mallory", "team-b/*:write"), "BLOBPLANE_SERVER", c.URL(0))
	stranger := newCtl(t, "BLOBPLANE_SERVER", c.URL(0))
	path, _, d := randomFile(t, 5000)
	alice.ok("push", path, "team-a/app")

	for _, who := range []*ctl{mallory, stranger} {
		out := filepath.Join(t.TempDir(), "stolen.bin")
		who.fails(cli.ExitError, "pull", "team-a/app@"+d, out)
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatal("a refused pull wrote a file")
		}
		who.fails(cli.ExitError, "stat", "team-a/app@"+d)
		// The routing query answers as for a digest nobody stored (S8).
		var p struct {
			Known bool  `json:"known"`
			Local []any `json:"local"`
		}
		if who == stranger {
			if e := who.fails(cli.ExitError, "placements", d); !strings.Contains(e, "401") {
				t.Fatalf("anonymous placements: %s", e)
			}
		} else if who.okJSON(&p, "placements", d); p.Known || len(p.Local) != 0 {
			t.Fatalf("placements of alice's digest to another: %+v", p)
		}
		who.fails(cli.ExitError, "push", path, "team-a/app")
		for _, args := range [][]string{{"admin", "tokens", "list"}, {"admin", "repos", "delete", "team-a/app"},
			{"admin", "tokens", "create", "--principal", "x", "--grant", "*:admin"}, {"admin", "plan"}} {
			who.fails(cli.ExitError, args...)
		}
	}
	if e := mallory.fails(cli.ExitError, "admin", "tokens", "create", "--principal", "m2", "--grant", "*:admin"); !strings.Contains(e, "403") {
		t.Fatalf("a writer minting an admin token: %s", e)
	}
	if e := stranger.fails(cli.ExitError, "push", path, "team-a/app"); !strings.Contains(e, "401") {
		t.Fatalf("an anonymous push: %s", e)
	}
	// Mallory pushing the same bytes into her own repository sends them
	// all: possession is proven by bytes, and her push says nothing of
	// alice's copy.
	var res pushResult
	mallory.okJSON(&res, "push", path, "team-b/app")
	if res.Status != "published" || res.Sent != 5000 {
		t.Fatalf("mallory's push: %+v", res)
	}
}

// Bad command lines exit 2 with the usage; --help exits 0.
func TestUsage(t *testing.T) {
	t.Parallel()
	u := newCtl(t)
	for _, args := range [][]string{{}, {"nope"}, {"push", "onlyfile"}, {"pull", "repo-without-digest", "f"},
		{"pull", "team/app@sha256:xyz", "f"}, {"push", "f", "r", "--chunk-size", "12parsecs"}, {"push", "f", "r", "--progress", "loud"},
		{"admin"}, {"admin", "tokens", "frobnicate"}, {"admin", "takeover", "--node", "n"}, {"whoami", "--server", "ftp://x"},
		{"login", "--server", "http://127.0.0.1:1"}} {
		u.fails(cli.ExitConfig, args...)
	}
	for _, args := range [][]string{{"--help"}, {"push", "--help"}, {"admin", "--help"}, {"--version"}} {
		if code, out, _ := u.run(args...); code != 0 || out == "" {
			t.Fatalf("blobctl %v: exit %d, stdout %q", args, code, out)
		}
	}
}

// The admin verbs, by a *:admin principal, over HTTP only: tokens,
// grants, repositories, obliteration, a forced takeover and the plan,
// applied by a running controller service.
func TestAdminVerbs(t *testing.T) {
	t.Parallel()
	c := testnode.Start(t, 2)
	root := newCtl(t, "BLOBPLANE_TOKEN", c.Token(t, "root", "*:admin"), "BLOBPLANE_SERVER", c.URL(0))

	// Tokens: the secret alone on stdout, then it works with exactly its grants.
	secret := strings.TrimSpace(root.ok("admin", "tokens", "create", "--principal", "ci", "--grant", "team/*:write", "--grant", "other/app:read"))
	ci := newCtl(t, "BLOBPLANE_TOKEN", secret, "BLOBPLANE_SERVER", c.URL(0))
	var who struct {
		Principal string   `json:"principal"`
		Grants    []string `json:"grants"`
	}
	ci.okJSON(&who, "whoami")
	if who.Principal != "ci" || strings.Join(who.Grants, ",") != "team/*:write,other/app:read" {
		t.Fatalf("the new token: %+v", who)
	}
	var toks struct {
		Tokens []struct {
			ID, Principal string
		} `json:"tokens"`
	}
	root.okJSON(&toks, "admin", "tokens", "list", "--principal", "ci")
	if len(toks.Tokens) != 1 || strings.Contains(root.ok("admin", "tokens", "list"), secret) {
		t.Fatalf("tokens list: %+v (and never the secret)", toks)
	}
	root.ok("admin", "tokens", "revoke", toks.Tokens[0].ID)
	if e := ci.fails(cli.ExitError, "whoami"); !strings.Contains(e, "401") {
		t.Fatalf("a revoked token: %s", e)
	}

	// Grants.
	root.ok("admin", "grants", "add", "--principal", "dana", "--grant", "dana/*:write")
	if out := root.ok("admin", "grants", "list", "--principal", "dana"); !strings.Contains(out, "dana/*:write") {
		t.Fatalf("grants list: %s", out)
	}
	root.ok("admin", "grants", "remove", "--principal", "dana", "--grant", "dana/*:write")
	if out := root.ok("admin", "grants", "list", "--principal", "dana"); strings.Contains(out, "dana/*:write") {
		t.Fatalf("grants list after remove: %s", out)
	}

	// Repositories: a repository holding a blob is not deleted.
	root.ok("admin", "repos", "create", "team/empty")
	path, _, d := randomFile(t, 4096)
	root.ok("push", path, "team/full")
	if out := root.ok("admin", "repos", "list"); !strings.Contains(out, "team/empty") || !strings.Contains(out, "team/full") {
		t.Fatalf("repos list: %s", out)
	}
	root.ok("admin", "repos", "delete", "team/empty")
	if e := root.fails(cli.ExitError, "admin", "repos", "delete", "team/full"); !strings.Contains(e, "409") {
		t.Fatalf("deleting a repository holding a blob: %s", e)
	}
	root.ok("stat", "team/full@"+d)

	// Quotas (issue 33): set, shown with the ledger's usage, enforced at
	// the home (the push refused with DENIED naming the quota), cleared.
	root.ok("admin", "quotas", "set", "team/full", "--max-bytes", "6KiB")
	var q client.Quota
	root.okJSON(&q, "admin", "quotas", "show", "team/full")
	if q.MaxBytes != 6<<10 || q.UsedBytes != 4096 || q.UsedBlobs != 1 || q.SetBy != "root" {
		t.Fatalf("quotas show: %+v", q)
	}
	if out := root.ok("admin", "quotas", "list"); !strings.Contains(out, "team/full") || !strings.Contains(out, "6144") {
		t.Fatalf("quotas list: %s", out)
	}
	root.fails(cli.ExitConfig, "admin", "quotas", "set", "team/full")
	more, _, _ := randomFile(t, 4096)
	if e := root.fails(cli.ExitError, "push", more, "team/full"); !strings.Contains(e, "quota of 6144 bytes") {
		t.Fatalf("a push over the quota: %s", e)
	}
	root.ok("admin", "quotas", "clear", "team/full")
	root.ok("push", more, "team/full")
	// An upload rate: one blob a minute, the push past it refused with
	// 429 naming the rate (blobctl waits a Retry-After out while
	// --retry-for lasts: here, not the minute's).
	root.ok("admin", "quotas", "set", "team/full", "--max-blobs-per-minute", "1", "--max-bytes-per-minute", "1MiB")
	root.okJSON(&q, "admin", "quotas", "show", "team/full")
	if q.MaxBlobsPerMinute != 1 || q.MaxBytesPerMinute != 1<<20 || q.MaxBytes != 0 {
		t.Fatalf("a rate shown: %+v", q)
	}
	if out := root.ok("admin", "quotas", "list"); !strings.Contains(out, "BLOBS/MIN") || !strings.Contains(out, "1048576") {
		t.Fatalf("quotas list with a rate: %s", out)
	}
	root.fails(cli.ExitConfig, "admin", "quotas", "set", "team/full", "--max-bytes-per-minute", "lots")
	rated1, _, _ := randomFile(t, 1024)
	rated2, _, _ := randomFile(t, 1024)
	root.ok("push", rated1, "team/full")
	if e := root.fails(cli.ExitError, "push", rated2, "team/full", "--retry-for", "1s"); !strings.Contains(e, "upload rate of 1 blobs per minute") {
		t.Fatalf("a push past the rate: %s", e)
	}
	root.ok("admin", "quotas", "clear", "team/full")
	root.ok("push", rated2, "team/full")
	// A tenant's: every repository under team/ together.
	root.ok("admin", "quotas", "set", "team/", "--max-blobs", "1000")
	var tq client.Quota
	root.okJSON(&tq, "admin", "quotas", "show", "team/")
	if tq.Tenant != "team/" || tq.MaxBlobs != 1000 || tq.UsedBlobs != 4 || tq.UsedBytes != 8192+2048 {
		t.Fatalf("a tenant's quota: %+v", tq)
	}
	root.ok("admin", "quotas", "clear", "team/")

	// Obliteration: the blob is gone for its readers.
	var ob struct {
		Obliterated bool `json:"obliterated"`
	}
	if err := json.Unmarshal([]byte(root.ok("admin", "obliterate", d, "--reason", "test: leaked secret")), &ob); err != nil || !ob.Obliterated {
		t.Fatalf("obliterate: %+v %v", ob, err)
	}
	root.ok("admin", "obliterate", "status", d)
	root.fails(cli.ExitError, "stat", "team/full@"+d)

	// A forced takeover records the token's principal as the operator (R28).
	part := c.Map.Partitions[0].ID
	var lease struct {
		Partition string `json:"partition"`
		OwnerNode string `json:"owner_node"`
		TakenBy   string `json:"taken_by"`
		Reason    string `json:"taken_reason"`
	}
	if err := json.Unmarshal([]byte(root.ok("admin", "takeover", "--partition", part, "--node", "node-1", "--reason", "drill")), &lease); err != nil {
		t.Fatal(err)
	}
	if lease.Partition != part || lease.OwnerNode != "node-1" || lease.TakenBy != "root" || lease.Reason != "drill" {
		t.Fatalf("takeover: %+v", lease)
	}

	// The plan, and an apply the running controller takes.
	if out := root.ok("admin", "plan"); !strings.Contains(out, `"map_version": 1`) {
		t.Fatalf("plan: %s", out)
	}
	if e := root.fails(cli.ExitError, "admin", "plan", "apply", "--wait", "0"); !strings.Contains(e, "503") {
		t.Fatalf("apply with no controller running: %s", e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	svc := &controller.Service{Store: c.Store, Signer: c.Signer, Settings: controller.Settings{Tick: 100 * time.Millisecond, HandoffDeadline: time.Second}}
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx, nil) }()
	defer func() { cancel(); <-done }()
	waitUntil(t, func() bool {
		running, err := c.Store.ControllerRunning(context.Background())
		return err == nil && running
	})
	var req struct {
		RequestID int64 `json:"request_id"`
		Taken     bool  `json:"taken"`
	}
	root.okJSON(&req, "admin", "plan", "apply", "--wait", "30s")
	if req.RequestID == 0 || !req.Taken {
		t.Fatalf("apply: %+v", req)
	}
}
