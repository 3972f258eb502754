package sweep_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/backend"
)

// BenchmarkInventoryClassify reports objects classified per second: b.N
// objects on the filesystem backend, half of them referenced (published),
// half orphans written outside the protocol, listed (in pages of the
// default size) and classified by one dry-run pass.
func BenchmarkInventoryClassify(b *testing.B) {
	ctx := context.Background()
	g := gcSetupTB(b)
	for i := range b.N {
		content := fmt.Sprintf("object %d", i)
		d, size := digestOf(content)
		if _, err := g.be.Write(ctx, backend.WriteRequest{Digest: d, Size: size, Body: strings.NewReader(content)}); err != nil {
			b.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := g.pool.Exec(ctx, `WITH b AS (INSERT INTO blobs (digest, size_bytes) VALUES ($1, $2))
				INSERT INTO blob_references (repository, digest, operation_id) VALUES ($3, $1, gen_random_uuid())`, string(d), size, gcRepo); err != nil {
				b.Fatal(err)
			}
		}
	}
	inv := g.inventory()
	inv.PageSize = 0 // the default page, not the tests' tiny one
	b.ResetTimer()
	rep, err := inv.Run(ctx, true)
	if err != nil {
		b.Fatal(err)
	}
	if rep.Objects != b.N {
		b.Fatalf("classified %d of %d", rep.Objects, b.N)
	}
	b.ReportMetric(float64(rep.Objects)/b.Elapsed().Seconds(), "objects/s")
}
