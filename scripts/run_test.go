//go:build unix

// Package scripts_test runs the project's shell scripts for real.
package scripts_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/internal/testbin"
)

// `BLOBPLANE_DATACENTERS=eu-1,us-1 make run` (issue 28): scripts/run.sh
// hands over to run-datacenters.sh, which starts an api and a worker per
// datacenter on one Postgres (here the test's database), ports counting up,
// us-1 on the backend BLOBPLANE_BACKENDS_US_1 names, publishes one map
// over both apis and prints the table; SIGINT to the process group (what
// Ctrl-C sends) stops every process and leaves no listener.
func TestRunDatacenters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two apis and two workers from scripts/run.sh; skipped with -short")
	}
	for _, tool := range []string{"bash", "curl", "awk"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("scripts/run.sh needs %s: %v", tool, err)
		}
	}
	bins := testbin.Build(t)
	d := pgtest.New(t)

	// The scripts beside the binaries they run (bin/ relative to their
	// parent), away from the source tree's bin/ and .data/.
	root := t.TempDir()
	for _, dir := range []string{"scripts", "bin", "data"} {
		if err := os.Mkdir(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{"run.sh", "run-datacenters.sh", "pg.sh"} {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "scripts", s), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []string{"api", "worker", "controller"} {
		if err := os.Symlink(filepath.Join(bins, b), filepath.Join(root, "bin", b)); err != nil {
			t.Fatal(err)
		}
	}
	port := freePorts(t, 2)
	usRoot := filepath.Join(root, "us-1-elsewhere")

	cmd := exec.Command("bash", filepath.Join(root, "scripts", "run.sh"))
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"DATABASE_URL=" + d.URL,
		"BLOBPLANE_DATACENTERS=eu-1, us-1",
		fmt.Sprintf("BLOBPLANE_LISTEN=127.0.0.1:%d", port),
		"BLOBPLANE_DATA_DIR=" + filepath.Join(root, "data"),
		"BLOBPLANE_BACKENDS_US_1=main=filesystem:" + usRoot,
		"BLOBPLANE_SHUTDOWN_TIMEOUT=10s",
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &lines{ready: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = out, out
	// A shell started with SIGINT ignored cannot trap it, and a test
	// binary run in the background inherits it ignored: handled here
	// while the script starts, it starts with the default, as from a
	// terminal.
	sigint := make(chan os.Signal, 1)
	signal.Notify(sigint, os.Interrupt)
	err := cmd.Start()
	signal.Stop(sigint)
	if err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("run.sh output:\n%s", out.String())
		}
	})
	select {
	case <-out.ready:
	case err := <-exited:
		stopped = true
		t.Fatalf("run.sh exited before printing its table: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("run.sh printed no table within 2 minutes")
	}

	eu, us := fmt.Sprintf("http://127.0.0.1:%d", port), fmt.Sprintf("http://127.0.0.1:%d", port+1)
	table := out.String()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`eu-1 +` + regexp.QuoteMeta(eu) + ` +api-eu-1 worker-eu-1 +fs=filesystem:` + regexp.QuoteMeta(filepath.Join(root, "data", "eu-1", "blobs"))),
		regexp.MustCompile(`us-1 +` + regexp.QuoteMeta(us) + ` +api-us-1 worker-us-1 +main=filesystem:` + regexp.QuoteMeta(usRoot)),
		regexp.MustCompile(`admin token +bp_\S+`),
	} {
		if !want.MatchString(table) {
			t.Errorf("the table lacks %s", want)
		}
	}
	token := regexp.MustCompile(`admin token +(bp_\S+)`).FindStringSubmatch(table)
	if token == nil {
		t.Fatal("no admin token in the table")
	}

	for _, api := range []struct{ url, node string }{{eu, "api-eu-1"}, {us, "api-us-1"}} {
		var ready struct {
			NodeID string `json:"node_id"`
		}
		if code := getJSON(t, api.url+"/readyz", &ready); code != 200 || ready.NodeID != api.node {
			t.Errorf("%s/readyz: %d, node %q; want 200 from %s", api.url, code, ready.NodeID, api.node)
		}
		// One map across both datacenters, served by each.
		var m struct {
			Partitions []struct {
				Primary struct{ Node, Endpoint string }
			}
		}
		if code := getJSON(t, api.url+"/v1/map", &m); code != 200 {
			t.Fatalf("%s/v1/map: %d", api.url, code)
		}
		primaries := map[string]int{}
		for _, p := range m.Partitions {
			primaries[p.Primary.Node+"@"+p.Primary.Endpoint]++
		}
		if len(m.Partitions) == 0 || len(primaries) != 2 ||
			primaries["api-eu-1@"+strings.TrimPrefix(eu, "http://")] == 0 || primaries["api-us-1@"+strings.TrimPrefix(us, "http://")] == 0 {
			t.Errorf("%s/v1/map: primaries %v, want both apis at their ports", api.url, primaries)
		}
	}
	ctx := context.Background()
	nodes := func() map[string]string {
		rows, err := d.Pool.Query(ctx, `SELECT node_id, datacenter || ' ' || role || ' ' || state || ' ' || endpoint FROM nodes`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		m := map[string]string{}
		for rows.Next() {
			var id, v string
			if err := rows.Scan(&id, &v); err != nil {
				t.Fatal(err)
			}
			m[id] = strings.TrimSpace(v)
		}
		return m
	}
	want := map[string]string{
		"api-eu-1": "eu-1 api up " + strings.TrimPrefix(eu, "http://"), "worker-eu-1": "eu-1 worker up",
		"api-us-1": "us-1 api up " + strings.TrimPrefix(us, "http://"), "worker-us-1": "us-1 worker up",
	}
	if got := nodes(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("nodes table %v, want %v", got, want)
	}

	// A blob uploaded at us-1 lands on us-1's own backend.
	content := []byte("several datacenters, one command\n")
	sum := sha256.Sum256(content)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if code := do(t, "POST", eu+"/v1/admin/repositories", token[1], "application/json", []byte(`{"name":"team/dc"}`)); code != 201 {
		t.Fatalf("create repository: %d", code)
	}
	if code := do(t, "POST", us+"/v2/team/dc/blobs/uploads/?digest="+digest, token[1], "application/octet-stream", content); code != 201 && code != 202 {
		t.Fatalf("upload at us-1: %d", code)
	}
	found := false
	_ = filepath.WalkDir(usRoot, func(path string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() && strings.Contains(path, hex.EncodeToString(sum[:])) {
			found = true
		}
		return nil
	})
	if !found {
		t.Errorf("the blob uploaded at us-1 is not under its backend %s", usRoot)
	}
	// And eu-1's worker copies it into eu-1 (issue 28): the ledger shows a
	// verified copy there, and eu-1 serves the bytes from its own backend.
	copied := time.Now().Add(60 * time.Second)
	for {
		var n int
		err := d.Pool.QueryRow(context.Background(), `SELECT count(*) FROM placements WHERE digest = $1 AND datacenter = 'eu-1' AND state = 'verified'`, digest).Scan(&n)
		if err == nil && n == 1 {
			break
		}
		if time.Now().After(copied) {
			t.Fatalf("no verified copy in eu-1 of the blob uploaded at us-1 (%v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, body := get(t, eu+"/v2/team/dc/blobs/"+digest, token[1]); code != 200 || !bytes.Equal(body, content) {
		t.Errorf("read in eu-1: %d %q", code, body)
	}

	// Ctrl-C: SIGINT to the script's process group, as a terminal sends
	// it (the script keeps its processes in groups of their own and stops
	// each with one SIGTERM).
	procs := descendants(t, pgid)
	if len(procs) < 4 {
		t.Fatalf("run.sh runs %d processes, want at least an api and a worker per datacenter", len(procs))
	}
	if err := syscall.Kill(-pgid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		stopped = true
	case <-time.After(time.Minute):
		t.Fatal("run.sh did not stop within a minute of SIGINT")
	}
	// Nothing the script started is left (the log prefixers end at their
	// process's exit), no listener, and every node marked itself down:
	// each stopped gracefully.
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range procs {
		for syscall.Kill(p, 0) == nil {
			if time.Now().After(deadline) {
				t.Fatalf("process %d started by run.sh still runs after it exited", p)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, u := range []string{eu, us} {
		if c, err := net.DialTimeout("tcp", strings.TrimPrefix(u, "http://"), time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after Ctrl-C", u)
		}
	}
	for id, v := range nodes() {
		if !strings.Contains(v, " down") {
			t.Errorf("node %s after Ctrl-C: %s, want down", id, v)
		}
	}
	if !strings.Contains(out.String(), "run.sh: stopped") {
		t.Error("run.sh did not report that it stopped")
	}
}

// descendants lists the processes below pid (children, theirs, ...).
func descendants(t *testing.T, pid int) []int {
	t.Helper()
	b, err := exec.Command("ps", "-A", "-o", "pid=", "-o", "ppid=").Output()
	if err != nil {
		t.Fatalf("ps: %v", err)
	}
	children := map[int][]int{}
	for _, line := range strings.Split(string(b), "\n") {
		var p, pp int
		if n, _ := fmt.Sscan(line, &p, &pp); n == 2 {
			children[pp] = append(children[pp], p)
		}
	}
	var out []int
	for queue := children[pid]; len(queue) > 0; queue = queue[1:] {
		out = append(out, queue[0])
		queue = append(queue, children[queue[0]]...)
	}
	return out
}

// lines collects a process's output; ready closes at the table's last line.
type lines struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	ready chan struct{}
	done  bool
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if !l.done && strings.Contains(l.buf.String(), "Ctrl-C stops everything.") {
		l.done = true
		close(l.ready)
	}
	return len(p), nil
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// freePorts finds n consecutive ports free on 127.0.0.1 and returns the
// first.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		first := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		ok := first+n-1 <= 65535
		for p := first; ok && p < first+n; p++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return first
		}
	}
	t.Fatal("no consecutive free ports")
	return 0
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("%s: %v", url, err)
	}
	return resp.StatusCode
}

func do(t *testing.T, method, url, token, contentType string, body []byte) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// get sends an authenticated GET and returns the status and body.
func get(t *testing.T, url, token string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}
