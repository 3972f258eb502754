package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
)

// Ledger shape for the benchmarks (issue 4): 1M placements over 250k
// digests, 4 per digest across 4 datacenters and 2 backends; 70% verified,
// 10% each pending, failed, revoked.
const (
	benchPlacements = 1_000_000
	benchDigests    = 250_000
)

// benchDigest is the digest of placement group n, the same value the SQL
// load computes: sha256 of n's decimal text.
func benchDigest(n int) blobplane.Digest { return digestOf(fmt.Sprint(n)) }

const benchLoad = `
INSERT INTO placements (digest, backend, datacenter, location, state, reason, revoke_reason, size_bytes, epoch, generation, verified_at)
SELECT 'sha256:' || encode(sha256(((i - 1) / 4)::text::bytea), 'hex'),
       CASE WHEN i % 2 = 0 THEN 's3' ELSE 'filesystem' END,
       (ARRAY['eu-1', 'us-1', 'ap-1', 'eu-2'])[1 + i % 4],
       'blobs/' || i,
       st,
       CASE WHEN st = 'failed' THEN 'source_unavailable' END,
       CASE WHEN st = 'revoked' THEN 'reclamation' END,
       1024, 1, 1,
       CASE WHEN st = 'verified' THEN now() END
FROM (SELECT i, CASE WHEN i % 10 < 7 THEN 'verified' WHEN i % 10 = 7 THEN 'pending'
                     WHEN i % 10 = 8 THEN 'failed' ELSE 'revoked' END AS st
      FROM generate_series(1, $1::int) AS i) AS g`

// BenchmarkPlacements measures the routing query (1 and 16 concurrent
// clients, ops/s and p50/p99 latency) and transitions (ops/s) on a ledger of
// 1M placements over 250k digests, bulk-loaded once per run. Run with
//
//	go test -run XXX -bench Placements -benchtime 3s ./store/
//
// pgtest databases run with synchronous_commit=off, which flatters the
// transition figures compared with a durable production setting.
func BenchmarkPlacements(b *testing.B) {
	ctx := context.Background()
	db := pgtest.New(b)
	s := store.New(db.Pool, nil)
	// The first write creates the ledger (optional persistence domain).
	if _, err := s.StagePlacement(ctx, placement.Key{Digest: digestOf("bench warmup"), Backend: "filesystem", Datacenter: "eu-1", Location: "w"}, 1, 1); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if _, err := db.Pool.Exec(ctx, benchLoad, benchPlacements); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `ANALYZE placements`); err != nil {
		b.Fatal(err)
	}
	var rows, digests int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT digest) FROM placements`).Scan(&rows, &digests); err != nil {
		b.Fatal(err)
	}
	b.Logf("ledger: %d placements over %d digests, loaded in %s", rows, digests, time.Since(start).Round(time.Millisecond))
	ledger := func(b *testing.B) {
		b.ReportMetric(float64(rows), "ledger-rows")
		b.ReportMetric(float64(digests), "ledger-digests")
	}

	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("routing/clients=%d", clients), func(b *testing.B) {
			run(b, clients, func(rng *rand.Rand, _ int64) error {
				r, err := s.PlacementRouting(ctx, benchDigest(rng.IntN(benchDigests)), "eu-1")
				if err == nil && !r.Known {
					err = fmt.Errorf("digest missing from the loaded ledger")
				}
				return err
			})
			ledger(b)
		})
	}
	// One op = stage a new location of a fresh digest, then verify it: two
	// accepted transitions, each a short fenced transaction.
	var seq atomic.Int64
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("transition/stage+verify/clients=%d", clients), func(b *testing.B) {
			opsPerSec := run(b, clients, func(_ *rand.Rand, _ int64) error {
				k := placement.Key{Digest: digestOf(fmt.Sprintf("bench-transition-%d", seq.Add(1))), Backend: "s3", Datacenter: "eu-1", Location: "t"}
				if _, err := s.StagePlacement(ctx, k, 1024, 1); err != nil {
					return err
				}
				_, err := s.VerifyPlacement(ctx, k, k.Digest, 1024, 1)
				return err
			})
			b.ReportMetric(2*opsPerSec, "transitions/s")
			ledger(b)
		})
	}
}

// run drives op b.N times from clients goroutines and reports ops/s and the
// p50/p99 latency of one op; it returns ops/s.
func run(b *testing.B, clients int, op func(rng *rand.Rand, i int64) error) float64 {
	lat := make([][]time.Duration, clients)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), uint64(b.N)))
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				t0 := time.Now()
				if err := op(rng, i); err != nil {
					b.Error(err)
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return 0
	}
	slices.Sort(all)
	pct := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) }
	ops := float64(len(all)) / elapsed.Seconds()
	b.ReportMetric(ops, "ops/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	return ops
}
