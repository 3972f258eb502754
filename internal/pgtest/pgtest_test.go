package pgtest_test

import (
	"context"
	"testing"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

func TestNewIsMigratedAndIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := pgtest.New(t), pgtest.New(t)
	if a.Name == b.Name {
		t.Fatal("two tests got the same database")
	}
	ok, err := store.MigrationsCurrent(ctx, a.Pool)
	if err != nil || !ok {
		t.Fatalf("template not migrated: current=%v err=%v", ok, err)
	}
	if _, err := a.Pool.Exec(ctx, "INSERT INTO nodes (node_id, datacenter, role, reads_format, reads_format_started_at) VALUES ('n1', 'dc', 'api', 2, now())"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.Pool.QueryRow(ctx, "SELECT count(*) FROM nodes").Scan(&n); err != nil || n != 0 {
		t.Fatalf("databases are not isolated: n=%d err=%v", n, err)
	}
}

func BenchmarkNew(b *testing.B) {
	for b.Loop() {
		pgtest.New(b)
	}
}
