package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want Summary
	}{
		{nil, Summary{}},
		{[]float64{3}, Summary{3, 3, 3, 1}},
		{[]float64{5, 1, 3}, Summary{1, 3, 5, 3}},
		{[]float64{4, 1, 3, 2}, Summary{1, 2.5, 4, 4}},
	} {
		if got := summarize(tc.in); got != tc.want {
			t.Errorf("summarize(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{50: 50 * time.Millisecond, 99: 99 * time.Millisecond, 100: 100 * time.Millisecond, 0.1: time.Millisecond} {
		if got := percentile(lat, p); got != want {
			t.Errorf("p%g = %s, want %s", p, got, want)
		}
	}
	if got := percentile(lat[:1], 99); got != time.Millisecond {
		t.Errorf("p99 of one = %s", got)
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("p50 of none = %s", got)
	}
}

func TestRatio(t *testing.T) {
	if r, ok := ratio(2, 4); !ok || r != 0.5 {
		t.Errorf("ratio(2, 4) = %g, %v", r, ok)
	}
	for _, pair := range [][2]float64{{0, 1}, {1, 0}, {-1, 1}} {
		if _, ok := ratio(pair[0], pair[1]); ok {
			t.Errorf("ratio(%g, %g) is ok", pair[0], pair[1])
		}
	}
}

func TestParseOptions(t *testing.T) {
	env := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/db", "BLOBPLANE_MINIO_BIN": "/m"}
	getenv := func(k string) string { return env[k] }
	parse := func(args ...string) (options, error) { return parseOptions(args, getenv, io.Discard) }

	o, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	if o.quick || o.duration != 20*time.Second || o.reps != 3 || o.size != 1<<30 || o.intents != 100_000 || !o.dropCaches {
		t.Errorf("full defaults: %+v", o)
	}
	if o, err := parse("--drop-caches=false"); err != nil || o.dropCaches {
		t.Errorf("--drop-caches=false: %v, %v", o.dropCaches, err)
	}
	if o, err := parse("--quick"); err != nil || o.dropCaches {
		t.Errorf("--quick drops caches: %v, %v", o.dropCaches, err)
	}
	if o, err := parse("--quick", "--drop-caches"); err == nil {
		t.Errorf("--drop-caches without a value parsed: %v", o.dropCaches)
	}
	if o, err := parse("--quick", "--drop-caches=true"); err != nil || !o.dropCaches {
		t.Errorf("--quick --drop-caches=true: %v, %v", o.dropCaches, err)
	}
	if !slices.Equal(o.systems, allSystems) || o.databaseURL != env["DATABASE_URL"] || o.minioBin != "/m" || o.registryBin != "" {
		t.Errorf("full defaults: %+v", o)
	}

	if o, err = parse("--minio-bin", "/flag"); err != nil || o.minioBin != "/flag" {
		t.Errorf("--minio-bin over the environment: %q, %v", o.minioBin, err)
	}

	o, err = parse("--quick", "--systems", " Minio,raw ", "--reps", "2", "--size", "16MiB")
	if err != nil {
		t.Fatal(err)
	}
	if !o.quick || o.duration != quickDefaults.duration || o.reps != 2 || o.size != 16<<20 || o.intents != 1000 {
		t.Errorf("quick with overrides: %+v", o)
	}
	if !slices.Equal(o.systems, []string{sysRaw, sysMinio}) {
		t.Errorf("systems %v, want column order [raw minio]", o.systems)
	}
	if !slices.Equal(o.workloads, allWorkloads) || o.batch != 1000 {
		t.Errorf("workloads %v, batch %d: want all, 1000", o.workloads, o.batch)
	}
	if o, err = parse("--workloads", "sweep,large", "--sweep-batch", "50"); err != nil || !slices.Equal(o.workloads, []string{"large", "sweep"}) || o.batch != 50 {
		t.Errorf("--workloads sweep,large --sweep-batch 50: %v %d, %v", o.workloads, o.batch, err)
	}

	if o, err = parse("--blobplane-backend-options", "direct=8388608&sync=file"); err != nil || o.bpOptions != "direct=8388608&sync=file" {
		t.Errorf("--blobplane-backend-options direct=8388608&sync=file: %q, %v", o.bpOptions, err)
	}

	for _, args := range [][]string{
		{"--blobplane-backend-options", "direct=8MiB"},
		{"--blobplane-backend-options", "colour=red"},
		{"--systems", "raw,ceph"},
		{"--systems", ","},
		{"--workloads", "large,nap"},
		{"--sweep-batch", "0"},
		{"--reps", "-1"},
		{"--size", "1TB"},
		{"--drop-caches", "maybe"},
		{"extra"},
	} {
		if _, err := parse(args...); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	delete(env, "DATABASE_URL")
	if _, err := parse(); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("no DATABASE_URL: %v", err)
	}
	if _, err := parse("--systems", "raw,minio"); err != nil {
		t.Errorf("no DATABASE_URL without blobplane: %v", err)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "8MiB": 8 << 20, "1 GiB": 1 << 30, "3KiB": 3 << 10} {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1", "1.5GiB", "GiB", "99999999999GiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q): no error", in)
		}
	}
	for n, want := range map[int64]string{1 << 30: "1 GiB", 8 << 20: "8 MiB", 4096: "4 KiB", 1000: "1000 B"} {
		if got := formatSize(n); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func randomBlock(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func TestPatternReader(t *testing.T) {
	block := randomBlock(t, 64<<10)
	const size = 1<<20 + 123 // not a whole number of blocks
	n, err := io.Copy(io.Discard, newPatternReader(block, size, 7))
	if err != nil || n != size {
		t.Fatalf("read %d bytes, %v; want %d", n, err, size)
	}
	a, b := patternDigest(block, size, 7), patternDigest(block, size, 7)
	if a != b {
		t.Errorf("same seed, digests %s and %s", a, b)
	}
	if c := patternDigest(block, size, 8); c == a {
		t.Errorf("seeds 7 and 8 give the same content")
	}
	// Every block differs from the others (no dedup below the blob).
	all, _ := io.ReadAll(newPatternReader(block, 4*int64(len(block)), 1))
	for i := 1; i < 4; i++ {
		if bytes.Equal(all[:len(block)], all[i*len(block):(i+1)*len(block)]) {
			t.Errorf("block %d equals block 0", i)
		}
	}
	c1, d1 := smallBlob(block, smallSize, seedOf(seedPut1, 0, 1))
	c2, d2 := smallBlob(block, smallSize, seedOf(seedPut1, 0, 2))
	if len(c1) != smallSize || d1 == d2 || bytes.Equal(c1, c2) {
		t.Errorf("small blobs of two seeds: %d bytes, digests %s %s", len(c1), d1, d2)
	}
	if seedOf(seedPut1, 1, 0) == seedOf(seedPut16, 0, 0) || seedOf(seedPut1, 0, 1) == seedOf(seedPut1, 1, 0) {
		t.Error("seeds collide")
	}
}

func TestRunLoad(t *testing.T) {
	var mu sync.Mutex
	seen := map[int]bool{}
	res, err := runLoad(t.Context(), 4, 50*time.Millisecond, func(ctx context.Context, i int) error {
		mu.Lock()
		defer mu.Unlock()
		if seen[i] {
			t.Errorf("op %d twice", i)
		}
		seen[i] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops == 0 || res.Ops != len(seen) || len(res.Latencies) != res.Ops || !slices.IsSorted(res.Latencies) || res.OpsPerSec() <= 0 {
		t.Errorf("ops %d, seen %d, latencies %d (sorted %v), ops/s %g", res.Ops, len(seen), len(res.Latencies), slices.IsSorted(res.Latencies), res.OpsPerSec())
	}

	boom := errors.New("boom")
	_, err = runLoad(t.Context(), 4, time.Minute, func(ctx context.Context, i int) error {
		if i == 10 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("op error: got %v", err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := runLoad(ctx, 2, time.Minute, func(context.Context, int) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: got %v", err)
	}
}

func TestRawPipeline(t *testing.T) {
	dir := t.TempDir()
	srv, err := startRaw(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := &rawClient{base: srv.URL(), hc: newHTTPClient()}
	defer c.hc.CloseIdleConnections()
	ctx := t.Context()
	block := randomBlock(t, 64<<10)
	const size = 300 << 10
	d := patternDigest(block, size, 1)
	if err := c.Put(ctx, d, newPatternReader(block, size, 1), size); err != nil {
		t.Fatal(err)
	}
	if err := c.Head(ctx, d, size); err != nil {
		t.Fatal(err)
	}
	if err := c.Head(ctx, d, size-1); err == nil {
		t.Error("HEAD with the wrong size: no error")
	}
	var buf bytes.Buffer
	if n, err := c.Get(ctx, d, &buf); err != nil || n != size {
		t.Fatalf("GET: %d bytes, %v", n, err)
	}
	want, _ := io.ReadAll(newPatternReader(block, size, 1))
	if !bytes.Equal(buf.Bytes(), want) {
		t.Error("GET answered other bytes")
	}

	// Content that does not match its digest is refused and leaves nothing.
	other := patternDigest(block, size, 2)
	if err := c.Put(ctx, other, newPatternReader(block, size, 1), size); err == nil {
		t.Error("PUT of mismatched content: no error")
	}
	if err := c.Head(ctx, other, size); err == nil {
		t.Error("HEAD of a refused blob: no error")
	}
	if err := c.Put(ctx, "sha256:..%2F..%2Fx", bytes.NewReader(nil), 0); err == nil {
		t.Error("PUT of a bad digest: no error")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("raw dir holds %d entries, want the one blob", len(entries))
	}
}

func TestPutURL(t *testing.T) {
	const d = "sha256:0123"
	for loc, want := range map[string]string{
		"/v2/r/blobs/uploads/abc":                                  "http://h:1/v2/r/blobs/uploads/abc?digest=sha256%3A0123",
		"http://h:1/v2/r/blobs/uploads/abc?_state=xyz":             "http://h:1/v2/r/blobs/uploads/abc?_state=xyz&digest=sha256%3A0123",
		"http://other:2/v2/r/blobs/uploads/abc?_state=x%2By&z=%3D": "http://other:2/v2/r/blobs/uploads/abc?_state=x%2By&digest=sha256%3A0123&z=%3D",
	} {
		got, err := putURL("http://h:1", loc, d)
		if err != nil || got != want {
			t.Errorf("putURL(%q) = %q, %v; want %q", loc, got, err, want)
		}
	}
	if _, err := putURL("http://h:1", "", d); err == nil {
		t.Error("no Location: no error")
	}
}

func TestReport(t *testing.T) {
	tb := &Table{ID: "put4k-1", Title: "4 KiB uploads", Systems: []string{sysRaw, sysBlobplane, sysMinio}}
	for _, v := range []float64{100, 300, 200} {
		tb.add(sysRaw, "uploads/s", true, v)
		tb.add(sysBlobplane, "uploads/s", true, v/2)
		tb.add(sysBlobplane, "p99 ms", false, v/10)
	}
	tb.fail(sysMinio, errors.New("minio PutObject: connection refused\nmore"))
	tb.fail(sysMinio, errors.New("a later error"))
	tb.finish()
	r := tb.Rows[0]
	if got := r.Summary[sysRaw]; got != (Summary{100, 200, 300, 3}) {
		t.Errorf("raw summary %+v", got)
	}
	if r.Ratio[sysRaw] != 0.5 || r.Ratio[sysBlobplane] != 1 {
		t.Errorf("ratios %v", r.Ratio)
	}
	if _, ok := r.Ratio[sysMinio]; ok {
		t.Error("a ratio for a failed column")
	}
	if tb.Rows[1].Ratio != nil {
		t.Error("a ratio on a latency row")
	}
	md := tb.Markdown()
	for _, want := range []string{
		"| | raw | blobplane | minio |",
		"| uploads/s | 200 (100–300) | 100 (50.0–150) | — |",
		"| **blobplane ÷ column**, uploads/s | **0.50** | **1.00** | — |",
		"minio failed: minio PutObject: connection refused more",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "a later error") {
		t.Error("markdown shows a later error, not the first")
	}

	rep := &Report{Started: time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC), Mode: "quick", Systems: tb.Systems, Tables: []*Table{tb}}
	if md := rep.Markdown(); strings.Contains(md, "filesystem backend with") {
		t.Error("the report names backend options none were given")
	}
	rep.Settings.BlobplaneBackendOptions = "direct=8388608"
	if md := rep.Markdown(); !strings.Contains(md, "Blobplane's filesystem backend with `direct=8388608`.") {
		t.Errorf("the report does not name the backend options: %s", md)
	}
	dir := filepath.Join(t.TempDir(), "results")
	paths, err := rep.write(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(paths)
	want := []string{"20261130T080000Z-quick.json", "20261130T080000Z-quick.md", "latest.json", "latest.md"}
	for i := range want {
		want[i] = filepath.Join(dir, want[i])
	}
	if !slices.Equal(paths, want) {
		t.Errorf("wrote %v, want %v", paths, want)
	}

	// An interrupted run never becomes latest.
	rep.Interrupted = true
	rep.Started = rep.Started.Add(time.Minute)
	if paths, err = rep.write(dir); err != nil {
		t.Fatal(err)
	}
	slices.Sort(paths)
	if want := filepath.Join(dir, "20261130T080100Z-quick-interrupted.json"); len(paths) != 2 || paths[0] != want {
		t.Errorf("interrupted run wrote %v, want %s and its .md", paths, want)
	}
}

// PutOne sends the OCI single-request push; a registry that answers it
// with a session (202) gets the body in a PUT, and every later upload
// as POST+PUT without trying again.
func TestPutOneFallsBackToSessions(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		calls = append(calls, fmt.Sprintf("%s digest=%t body=%d", r.Method, r.URL.Query().Has("digest"), len(body)))
		mu.Unlock()
		switch r.Method {
		case http.MethodPost:
			w.Header().Set("Location", "/v2/bench/blobs/uploads/s1")
			w.WriteHeader(http.StatusAccepted)
		case http.MethodPut:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	defer srv.Close()
	c := &ociClient{base: srv.URL, repo: "bench/blobs", hc: srv.Client()}
	content, d := smallBlob(make([]byte, 4<<20), smallSize, 7)
	for range 2 {
		if err := c.PutOne(t.Context(), d, content); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		"POST digest=true body=4096", "PUT digest=true body=4096", // the single request, answered with a session
		"POST digest=false body=0", "PUT digest=true body=4096", // from then on POST+PUT
	}
	if strings.Join(calls, "; ") != strings.Join(want, "; ") {
		t.Fatalf("calls:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
}

// dropPageCache writes the order to drop the page cache where it is
// told, and reports what happened, also when it may not.
func TestDropPageCache(t *testing.T) {
	path := filepath.Join(t.TempDir(), "drop_caches")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := dropPageCache(path, true); got != "dropped before the systems started" {
		t.Fatalf("dropPageCache = %q", got)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "3\n" {
		t.Fatalf("wrote %q, %v; want 3", b, err)
	}
	if got := dropPageCache(filepath.Join(t.TempDir(), "no", "such"), true); !strings.HasPrefix(got, "not dropped (") {
		t.Fatalf("unwritable: %q", got)
	}
	if got := dropPageCache(path, false); got != "not dropped (--drop-caches=false)" {
		t.Fatalf("disabled: %q", got)
	}
}
