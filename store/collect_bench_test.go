package store_test

import (
	"context"
	"testing"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// BenchmarkCollectUnreferenced reports digests collected per second: b.N
// unreferenced live digests with one verified placement each, interleaved
// (in scan order) with as many referenced ones the candidate scan must pass
// over, are collected in passes of 1000. Run with -benchtime=1000000x for
// the 1M rows.
func BenchmarkCollectUnreferenced(b *testing.B) {
	ctx := context.Background()
	d := pgtest.New(b)
	s := store.New(d.Pool, nil)
	if err := s.CreateRepository(ctx, upRepo); err != nil {
		b.Fatal(err)
	}
	// Creates the placement ledger.
	if _, err := s.Placements(ctx, "sha256:"+"00"); err != nil {
		b.Fatal(err)
	}
	if _, err := s.CollectUnreferenced(ctx, 1, nil); err != nil {
		b.Fatal(err)
	}
	if _, err := d.Pool.Exec(ctx, `
		WITH g AS (SELECT g, 'sha256:' || encode(sha256(g::text::bytea), 'hex') AS digest FROM generate_series(1, 2 * $1::int) g),
		b AS (INSERT INTO blobs (digest, size_bytes, updated_at) SELECT digest, 1, now() - g * interval '1 ms' FROM g RETURNING digest),
		r AS (INSERT INTO blob_references (repository, digest, operation_id) SELECT $2, digest, gen_random_uuid() FROM g WHERE g % 2 = 0)
		INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch, generation, verified_at)
		SELECT digest, 'fs', $3, 'sha256/' || substr(digest, 8), 'verified', 1, 0, 1, now() FROM g`, b.N, upRepo, upDC); err != nil {
		b.Fatal(err)
	}
	if _, err := d.Pool.Exec(ctx, `ANALYZE`); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	collected := 0
	for collected < b.N {
		got, err := s.CollectUnreferenced(ctx, 1000, nil)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) == 0 {
			b.Fatalf("collected %d of %d", collected, b.N)
		}
		collected += len(got)
	}
	b.ReportMetric(float64(collected)/b.Elapsed().Seconds(), "digests/s")
}
