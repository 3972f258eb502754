package app_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/internal/testnode"
	"github.com/blobplane/blobplane/store"
)

// benchAPI is one real api node for benchmarks (internal/testnode: a
// pgtest database, a filesystem backend, and a published signed
// one-partition map naming it, so it is the home of every repository and
// finalizes synchronously, 201).
type benchAPI struct {
	api    *app.API
	Repo   string
	token  string
	Dir    string // beside the backend directory: raw baselines write here (same disk)
	client *http.Client
	store  *store.Store
}

// startBenchAPI starts the api, waits until it holds the one partition,
// and creates Repo with a write token. Everything stops at tb's cleanup.
func startBenchAPI(tb testing.TB) *benchAPI {
	tb.Helper()
	c := testnode.Start(tb, 1)
	b := &benchAPI{api: c.Nodes[0], Repo: "bench/blobs", Dir: filepath.Dir(c.Backends[0]), store: c.Store, client: &http.Client{Transport: &http.Transport{
		MaxIdleConns: 64, MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute,
	}}}
	tb.Cleanup(b.client.CloseIdleConnections)
	if err := c.Store.CreateRepository(context.Background(), b.Repo); err != nil {
		tb.Fatal(err)
	}
	b.token = c.Token(tb, "bench", "bench/*:write")
	return b
}

// do sends one request with Basic auth, drains the answer and fails
// unless the status is want.
func (b *benchAPI) do(method, url string, body io.Reader, size int64, want int) (http.Header, error) {
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.ContentLength = size
	}
	req.SetBasicAuth("bench", b.token)
	resp, err := b.client.Do(req)
	if err != nil {
		return nil, err
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		return nil, fmt.Errorf("%s %s: %d, want %d: %s", method, url, resp.StatusCode, want, strings.TrimSpace(string(msg)))
	}
	return resp.Header, nil
}

// upload is the two-request OCI upload: POST opens a session, PUT
// ?digest= sends the whole body and closes it (201 at the home).
func (b *benchAPI) upload(body io.Reader, size int64, d string) error {
	h, err := b.do(http.MethodPost, b.api.URL()+"/v2/"+b.Repo+"/blobs/uploads/", nil, 0, http.StatusAccepted)
	if err != nil {
		return err
	}
	loc := h.Get("Location")
	if !strings.HasPrefix(loc, "/v2/") {
		return fmt.Errorf("POST answered Location %q", loc)
	}
	h, err = b.do(http.MethodPut, b.api.URL()+loc+"?digest="+d, body, size, http.StatusCreated)
	if err != nil {
		return err
	}
	if got := h.Get("Docker-Content-Digest"); got != d {
		return fmt.Errorf("PUT answered digest %q, want %s", got, d)
	}
	return nil
}

// smallBlob is one random blob and its digest.
type smallBlob struct {
	content []byte
	digest  string
}

func randomBlobs(n, size int) []smallBlob {
	out := make([]smallBlob, n)
	for i := range out {
		c := make([]byte, size)
		rand.Read(c)
		sum := sha256.Sum256(c)
		out[i] = smallBlob{c, "sha256:" + hex.EncodeToString(sum[:])}
	}
	return out
}

// runClients runs n ops on clients goroutines (each op claims the next
// index) and returns the wall time and every op's latency, sorted.
// The first error stops the benchmark.
func runClients(b *testing.B, clients, n int, op func(i int) error) (time.Duration, []time.Duration) {
	b.Helper()
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || failed.Load() != nil {
					return
				}
				t0 := time.Now()
				if err := op(i); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	slices.Sort(lat)
	return elapsed, lat
}

// percentile of sorted latencies, in milliseconds (nearest rank).
func percentileMS(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p/100*float64(len(sorted))+0.5) - 1
	i = max(0, min(i, len(sorted)-1))
	return float64(sorted[i]) / float64(time.Millisecond)
}

// reportLatency reports ops/s (under unit) and p50/p99 in ms.
func reportLatency(b *testing.B, unit string, elapsed time.Duration, lat []time.Duration) {
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), unit)
	b.ReportMetric(percentileMS(lat, 50), "p50-ms")
	b.ReportMetric(percentileMS(lat, 99), "p99-ms")
}
