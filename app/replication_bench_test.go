package app_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend/fs"
)

// Time from publication to a verified copy in the other datacenter
// (issue 28): N small blobs published through eu-1's api as fast as one
// client can, copied into us-1 by one us-1 worker (16 copies at a time)
// that reads them from eu-1 over the internal endpoint. Reported: the
// time until every copy was verified, copies/s, and the p50/p99 of each
// blob's lag, taken from the ledger's own clock (its outcome's
// publication to its us-1 placement's verification).
//
//	go test ./app -run '^$' -bench ReplicationLag -benchtime 1x
func BenchmarkReplicationLag1000x4KiB(b *testing.B) {
	const n = 1000
	c := startTwoDatacenters(b)
	repo := c.repos[0]
	rounds := 0
	for b.Loop() {
		rounds++
		blobs := randomBlobs(n, 4<<10)
		start := time.Now()
		for _, bl := range blobs {
			if resp, body := c.send(b, "POST", c.nodes[0].URL()+"/v2/"+repo+"/blobs/uploads/?digest="+bl.digest, string(bl.content), nil); resp.StatusCode != http.StatusCreated {
				b.Fatalf("upload: %d %s", resp.StatusCode, body)
			}
		}
		published := time.Since(start)
		deadline := time.Now().Add(5 * time.Minute)
		for c.count(b, `SELECT count(*) FROM placements WHERE datacenter = 'us-1' AND state = 'verified'`) < n*rounds {
			if time.Now().After(deadline) {
				b.Fatal("copies not verified within 5 minutes")
			}
			time.Sleep(20 * time.Millisecond)
		}
		all := time.Since(start)
		var p50, p99 float64
		if err := c.d.Pool.QueryRow(context.Background(), `
			SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), percentile_cont(0.99) WITHIN GROUP (ORDER BY lag)
			FROM (SELECT extract(epoch FROM p.verified_at - o.published_at) AS lag
			      FROM operation_outcomes o JOIN placements p ON p.digest = o.digest AND p.datacenter = 'us-1' AND p.state = 'verified') l`).Scan(&p50, &p99); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(published.Seconds(), "s-to-publish-all")
		b.ReportMetric(all.Seconds(), "s-to-all-verified")
		b.ReportMetric(float64(n)/all.Seconds(), "copies/s")
		b.ReportMetric(p50*1000, "lag-p50-ms")
		b.ReportMetric(p99*1000, "lag-p99-ms")
		b.Logf("%d blobs: published in %s, all verified in us-1 after %s", n, published.Round(time.Millisecond), all.Round(time.Millisecond))
	}
}

// One 256 MiB blob copied from eu-1 into us-1 over the internal endpoint
// (the whole remote path: the us-1 worker's signed GET to eu-1's api,
// which reads its backend; us-1's verifying write; the ledger), beside
// the raw pipeline over the same bytes (read the eu-1 object file, sha256
// while writing a new file under the us-1 root, fsync, rename, fsync the
// directory), in the same run. x-raw is the copy's GB/s ÷ the raw GB/s.
//
//	go test ./app -run '^$' -bench ReplicationCopy256MiB -benchtime 3x
func BenchmarkReplicationCopy256MiB(b *testing.B) {
	const size = 256 << 20
	c := startTwoDatacenters(b)
	euRoot, usRoot := c.cfgs[0].Backends[0].Path, c.cfgs[1].Backends[0].Path
	repo := c.repos[0]
	block := make([]byte, 4<<20)
	rand.Read(block)
	var copyTime, rawTime time.Duration
	i := 0
	for b.Loop() {
		b.StopTimer()
		h := sha256.New()
		if _, err := io.Copy(h, newPatternReader(block, size, i)); err != nil {
			b.Fatal(err)
		}
		d := "sha256:" + hex.EncodeToString(h.Sum(nil))
		req, err := http.NewRequest("POST", c.nodes[0].URL()+"/v2/"+repo+"/blobs/uploads/?digest="+d, newPatternReader(block, size, i))
		if err != nil {
			b.Fatal(err)
		}
		req.ContentLength = size
		req.SetBasicAuth("ci", c.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			b.Fatalf("upload: %d", resp.StatusCode)
		}
		// The copy's time: from the publication to the verification, on
		// the ledger's clock.
		waitFor(b, func() bool {
			return c.count(b, `SELECT count(*) FROM placements WHERE digest = $1 AND datacenter = 'us-1' AND state = 'verified'`, d) == 1
		})
		var secs float64
		if err := c.d.Pool.QueryRow(context.Background(), `
			SELECT extract(epoch FROM p.verified_at - o.published_at) FROM operation_outcomes o
			JOIN placements p ON p.digest = o.digest AND p.datacenter = 'us-1' WHERE o.digest = $1`, d).Scan(&secs); err != nil {
			b.Fatal(err)
		}
		copyTime += time.Duration(secs * float64(time.Second))
		f, err := os.Open(filepath.Join(euRoot, fs.ObjectPath(blobplane.Digest(d))))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.Seek(64, io.SeekStart); err != nil { // the representation header (ADR 0001)
			b.Fatal(err)
		}
		elapsed, got, err := rawPipeline(usRoot, f)
		f.Close()
		if err != nil || got != d {
			b.Fatalf("raw pipeline: %s, %v", got, err)
		}
		rawTime += elapsed
		i++
		b.StartTimer()
	}
	gb := float64(i) * size / 1e9
	b.ReportMetric(gb/copyTime.Seconds(), "copy-GB/s")
	b.ReportMetric(gb/rawTime.Seconds(), "raw-GB/s")
	b.ReportMetric(rawTime.Seconds()/copyTime.Seconds(), "x-raw")
}
