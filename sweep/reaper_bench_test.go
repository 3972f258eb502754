package sweep_test

import (
	"context"
	"testing"
)

// BenchmarkReaperPass reports intents reaped per second by whole reaper
// passes (sweep.Reaper.RunOnce with the default batch): the abandonment
// decision, the staged delete on the real filesystem backend (the staged
// uploads are already gone, which the backend must treat as success — the
// same backend calls as a real delete minus the unlink) and the one
// MarkStagedDeleted statement per pass. Run with -benchtime=1000000x for
// the 1M rows.
func BenchmarkReaperPass(b *testing.B) {
	ctx := context.Background()
	g := gcSetupTB(b)
	if _, err := g.pool.Exec(ctx, `
		INSERT INTO intents (repository, principal, ingress_datacenter, backend, staged_location, received_bytes, created_at, expires_at)
		SELECT $1, $2, $3, 'fs', lpad(to_hex(g), 32, '0'), 1, now() - interval '2 hours', now() - interval '1 hour' - g * interval '1 ms'
		FROM generate_series(1, $4::int) g`, gcRepo, gcPrincipal, gcDC, b.N); err != nil {
		b.Fatal(err)
	}
	if _, err := g.pool.Exec(ctx, `ANALYZE intents`); err != nil {
		b.Fatal(err)
	}
	r := g.reaperWith(0)
	b.ResetTimer()
	reaped := 0
	for reaped < b.N {
		rep, err := r.RunOnce(ctx, false)
		if err != nil {
			b.Fatal(err)
		}
		if len(rep.Reaped) == 0 {
			b.Fatalf("reaped %d of %d", reaped, b.N)
		}
		reaped += len(rep.Reaped)
	}
	b.StopTimer()
	b.ReportMetric(float64(reaped)/b.Elapsed().Seconds(), "intents/s")
	var left int
	if err := g.pool.QueryRow(ctx, `SELECT count(*) FROM intents WHERE state <> 'abandoned' OR staged_deleted_at IS NULL`).Scan(&left); err != nil || left != 0 {
		b.Fatalf("%d intents not reaped and marked, %v", left, err)
	}
}
