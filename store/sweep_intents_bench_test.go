package store_test

import (
	"context"
	"testing"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// BenchmarkReapExpiredIntents reports intents reaped per second: b.N
// expired intents are inserted in one statement, then reaped in batches of
// 1000 (the default BLOBPLANE_SWEEP_BATCH). Run with -benchtime=1000000x
// for the 1M rows.
func BenchmarkReapExpiredIntents(b *testing.B) {
	ctx := context.Background()
	d := pgtest.New(b)
	s := store.New(d.Pool, nil)
	if err := s.CreateRepository(ctx, upRepo); err != nil {
		b.Fatal(err)
	}
	if _, err := d.Pool.Exec(ctx, `
		INSERT INTO intents (repository, principal, ingress_datacenter, backend, staged_location, received_bytes, created_at, expires_at)
		SELECT $1, $2, $3, 'fs', lpad(to_hex(g), 32, '0'), 1, now() - interval '2 hours', now() - interval '1 hour' - g * interval '1 ms'
		FROM generate_series(1, $4::int) g`, upRepo, upPrincipal, upDC, b.N); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	reaped := 0
	for reaped < b.N {
		got, err := s.ReapExpiredIntents(ctx, upDC, 1000, false)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) == 0 {
			b.Fatalf("reaped %d of %d", reaped, b.N)
		}
		reaped += len(got)
	}
	b.ReportMetric(float64(reaped)/b.Elapsed().Seconds(), "intents/s")
}
