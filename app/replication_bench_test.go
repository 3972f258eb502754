package app_test

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/config"
)

// Time from publication to a verified copy in the other datacenter
// (issue 28): N small blobs published through eu-1's api as fast as one
// client can, copied into us-1 by one us-1 worker (4 copies at a time)
// that reads them from eu-1 over the internal endpoint. Reported: the
// time until every copy was verified, copies/s, and the p50/p99 of each
// blob's lag, taken from the ledger's own clock (its outcome's
// publication to its us-1 placement's verification).
//
//	go test ./app -run '^$' -bench ReplicationLag -benchtime 1x
func BenchmarkReplicationLag1000x4KiB(b *testing.B) {
	const n = 1000
	dcs := [2]string{"eu-1", "us-1"}
	c := startHomeCluster(b, func(i int, cfg *config.Config) { cfg.Datacenter = dcs[i] })
	wcfg := testConfig(b, c.d.URL)
	wcfg.NodeID, wcfg.Datacenter, wcfg.Backends = "worker-us-1", "us-1", c.cfgs[1].Backends
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.RunWorker(ctx, wcfg, slog.New(slog.DiscardHandler)) }()
	b.Cleanup(func() { cancel(); <-done })
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
