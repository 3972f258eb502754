package store_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// A fresh database migrated by several processes at once applies each step
// exactly once (the session lock), and a later run applies nothing.
func TestMigrateConcurrentAndIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	// Empty the cloned database so the migration really runs.
	if _, err := d.Pool.Exec(ctx, `DROP SCHEMA public CASCADE; CREATE SCHEMA public;`); err != nil {
		t.Fatal(err)
	}
	results := make([]*store.MigrationResult, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() { results[i], errs[i] = store.Migrate(ctx, d.Pool, slog.New(slog.DiscardHandler)) })
	}
	wg.Wait()
	gooseApplied, riverApplied := 0, 0
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("migrate %d: %v", i, errs[i])
		}
		gooseApplied += len(results[i].Goose)
		riverApplied += len(results[i].River)
	}
	if gooseApplied == 0 || riverApplied != store.RiverMigrationVersion {
		t.Fatalf("applied goose=%d river=%d across runs, want each step once", gooseApplied, riverApplied)
	}
	again, err := store.Migrate(ctx, d.Pool, slog.New(slog.DiscardHandler))
	if err != nil || len(again.Goose) != 0 || len(again.River) != 0 {
		t.Fatalf("second run applied %+v (err %v)", again, err)
	}
	ok, err := store.MigrationsCurrent(ctx, d.Pool)
	if err != nil || !ok {
		t.Fatalf("current=%v err=%v", ok, err)
	}
}

func TestMigrationsCurrentFalseOnEmptyDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	if _, err := d.Pool.Exec(ctx, `DROP SCHEMA public CASCADE; CREATE SCHEMA public;`); err != nil {
		t.Fatal(err)
	}
	if ok, _ := store.MigrationsCurrent(ctx, d.Pool); ok {
		t.Fatal("an empty database reported current")
	}
}

// DBAs query this database directly: every table, view and column of ours
// carries a COMMENT, and every table River owns at least a table comment.
func TestEverythingIsCommented(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	rows, err := d.Pool.Query(ctx, `
		SELECT c.relname || '.' AS object
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'v', 'p')
		  AND obj_description(c.oid, 'pg_class') IS NULL
		UNION ALL
		SELECT c.relname || '.' || a.attname
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'v', 'p')
		  AND c.relname NOT LIKE 'river\_%' AND c.relname <> 'goose_db_version'
		  AND col_description(c.oid, a.attnum) IS NULL
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Fatalf("objects without COMMENT ON: %v", missing)
	}
}
