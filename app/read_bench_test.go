package app_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/config"
)

// Reads from any datacenter (issue 29), over real HTTP: two api nodes,
// eu-1 and us-1, on one Postgres, each with its own filesystem backend,
// and no worker (so a blob published through eu-1 stays there and every
// read through us-1 streams from eu-1's node over the internal
// endpoint). Each figure is beside its baseline from the same run.
//
//	go test ./app -run '^$' -bench 'Read' -benchtime 3x

// readCluster is the two nodes and their client.
type readCluster struct {
	*homeCluster
	hc *http.Client
}

func startReadCluster(b *testing.B) *readCluster {
	b.Helper()
	dcs := [2]string{"eu-1", "us-1"}
	c := startHomeCluster(b, func(i int, cfg *config.Config) { cfg.Datacenter = dcs[i] })
	tr := &http.Transport{MaxIdleConnsPerHost: 32}
	b.Cleanup(tr.CloseIdleConnections)
	return &readCluster{homeCluster: c, hc: &http.Client{Transport: tr}}
}

// get GETs d of repo from node i into w and returns the time it took.
func (c *readCluster) get(b *testing.B, i int, repo, d string, w io.Writer) time.Duration {
	b.Helper()
	start := time.Now()
	if err := c.fetch(i, repo, d, w); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// fetch GETs d of repo from node i into w (safe from any goroutine).
func (c *readCluster) fetch(i int, repo, d string, w io.Writer) error {
	req, err := http.NewRequest("GET", c.nodes[i].URL()+"/v2/"+repo+"/blobs/"+d, nil)
	if err != nil {
		return err
	}
	req.SetBasicAuth("ci", c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s from node %d: %d, %d bytes, %v", d, i, resp.StatusCode, n, err)
	}
	return nil
}

// BenchmarkRead1GiB: a 1 GiB blob GET whole through eu-1 (local,
// verified as it streams), through us-1 (streamed from eu-1's node, which
// verifies, and verified again at us-1), and a raw sha256 of its stored
// file: local-x-sha256 is the verified read against the hash alone (aim
// ≥ 0.9), remote-x-local the remote stream against the local read (aim
// ≥ 0.8).
func BenchmarkRead1GiB(b *testing.B) {
	const size = 1 << 30
	c := startReadCluster(b)
	repo := c.repos[0]
	block := make([]byte, 4<<20)
	rand.Read(block)
	h := sha256.New()
	if _, err := io.Copy(h, newPatternReader(block, size, 0)); err != nil {
		b.Fatal(err)
	}
	d := "sha256:" + hex.EncodeToString(h.Sum(nil))
	req, err := http.NewRequest("POST", c.nodes[0].URL()+"/v2/"+repo+"/blobs/uploads/?digest="+d, newPatternReader(block, size, 0))
	if err != nil {
		b.Fatal(err)
	}
	req.ContentLength = size
	req.SetBasicAuth("ci", c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		b.Fatalf("upload: %d", resp.StatusCode)
	}
	file := filepath.Join(c.cfgs[0].Backends[0].Path, fs.ObjectPath(blobplane.Digest(d)))
	var local, remote, raw time.Duration
	rounds := 0
	for b.Loop() {
		rounds++
		local += c.get(b, 0, repo, d, io.Discard)
		remote += c.get(b, 1, repo, d, io.Discard)
		start := time.Now()
		f, err := os.Open(file)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.Seek(64, io.SeekStart); err != nil { // the representation header
			b.Fatal(err)
		}
		h := sha256.New()
		if _, err := io.CopyBuffer(h, f, make([]byte, 256<<10)); err != nil {
			b.Fatal(err)
		}
		f.Close()
		raw += time.Since(start)
	}
	gb := float64(rounds) * size / 1e9
	b.ReportMetric(gb/local.Seconds(), "local-GB/s")
	b.ReportMetric(gb/remote.Seconds(), "remote-GB/s")
	b.ReportMetric(gb/raw.Seconds(), "sha256-GB/s")
	b.ReportMetric(raw.Seconds()/local.Seconds(), "local-x-sha256")
	b.ReportMetric(local.Seconds()/remote.Seconds(), "remote-x-local")
}

// BenchmarkRead4KiB16: 4 KiB GETs by 16 clients over 256 blobs, through
// eu-1 (local) and through us-1 (remote), for the same duration each.
func BenchmarkRead4KiB16(b *testing.B) {
	c := startReadCluster(b)
	repo := c.repos[0]
	digests := make([]string, 256)
	for i := range digests {
		content := make([]byte, 4<<10)
		rand.Read(content)
		sum := sha256.Sum256(content)
		digests[i] = "sha256:" + hex.EncodeToString(sum[:])
		if resp, body := c.send(b, "POST", c.nodes[0].URL()+"/v2/"+repo+"/blobs/uploads/?digest="+digests[i], string(content), nil); resp.StatusCode != http.StatusCreated {
			b.Fatalf("upload: %d %s", resp.StatusCode, body)
		}
	}
	const window = 3 * time.Second
	rate := func(node int) float64 {
		var ops atomic.Int64
		var wg sync.WaitGroup
		var once sync.Once
		var failed error
		deadline := time.Now().Add(window)
		for w := range 16 {
			wg.Go(func() {
				for i := w; time.Now().Before(deadline); i += 16 {
					if err := c.fetch(node, repo, digests[i%len(digests)], io.Discard); err != nil {
						once.Do(func() { failed = err })
						return
					}
					ops.Add(1)
				}
			})
		}
		wg.Wait()
		if failed != nil {
			b.Fatal(failed)
		}
		return float64(ops.Load()) / window.Seconds()
	}
	var local, remote float64
	rounds := 0
	for b.Loop() {
		rounds++
		local += rate(0)
		remote += rate(1)
	}
	b.ReportMetric(local/float64(rounds), "local-GET/s")
	b.ReportMetric(remote/float64(rounds), "remote-GET/s")
	b.ReportMetric(remote/local, "remote-x-local")
}
