// Package pgtest hands each test an isolated, fully migrated Postgres
// database in well under a second: migrations run once into a template
// database (shared by every test process, rebuilt when the migrations
// change), and each test gets a CREATE DATABASE ... TEMPLATE clone that is
// dropped when the test ends. Safe for parallel tests and parallel packages.
//
// The server comes from DATABASE_URL; when it is unset, pgtest runs
// scripts/pg.sh (the same script `make test` uses) to start the project-local
// cluster, so a bare `go test ./...` works too.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane/store"
)

var (
	once     sync.Once
	baseURL  string
	template string
	setupErr error
)

// DB is one test's database.
type DB struct {
	Name string // database name
	URL  string // connection URL for this database
	Pool *pgxpool.Pool
}

// New returns a fresh migrated database for t, dropped at cleanup.
func New(t testing.TB) *DB {
	t.Helper()
	once.Do(func() { setupErr = setup() })
	if setupErr != nil {
		t.Fatalf("pgtest: %v", setupErr)
	}
	ctx := context.Background()
	name := "bp_t_" + randomHex(8)

	admin, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, template)); err != nil {
		t.Fatalf("pgtest: clone template: %v", err)
	}
	u := withDatabase(baseURL, name)
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	// Tests do not need commits to survive a crash of the server; skipping
	// the WAL flush wait makes them several times faster.
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		c, err := pgx.Connect(context.Background(), baseURL)
		if err != nil {
			t.Errorf("pgtest: drop %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop %s: %v", name, err)
		}
	})
	return &DB{Name: name, URL: u, Pool: pool}
}

// NewStore returns a store.Store over a fresh database.
func NewStore(t testing.TB) *store.Store {
	t.Helper()
	return store.New(New(t).Pool, slog.New(slog.DiscardHandler))
}

// BaseURL returns the server URL tests run against (for tests that start
// binaries and must pass DATABASE_URL on).
func BaseURL(t testing.TB) string {
	t.Helper()
	once.Do(func() { setupErr = setup() })
	if setupErr != nil {
		t.Fatalf("pgtest: %v", setupErr)
	}
	return baseURL
}

func setup() error {
	baseURL = os.Getenv("DATABASE_URL")
	if baseURL == "" {
		u, err := startLocal()
		if err != nil {
			return err
		}
		baseURL = u
	}
	template = "bp_tmpl_" + store.SchemaFingerprint()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		return fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	defer admin.Close(ctx)
	// Serialize template builds across test processes (parallel packages).
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(hashtext('blobplane-pgtest-template'))"); err != nil {
		return err
	}
	defer admin.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtext('blobplane-pgtest-template'))")

	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", template).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	build := template + "_build"
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+build+" WITH (FORCE)"); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+build); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, withDatabase(baseURL, build))
	if err != nil {
		return err
	}
	_, err = store.Migrate(ctx, pool, slog.New(slog.DiscardHandler))
	pool.Close()
	if err != nil {
		return fmt.Errorf("migrate template: %w", err)
	}
	// Old templates from earlier migration sets are dead weight, once no
	// test process can still be cloning them: a template is dropped an
	// hour after it was built (its comment), so test runs of two checkouts
	// with different migrations (two branches, two engineers on one
	// server) do not drop each other's template mid-run.
	rows, err := admin.Query(ctx, `SELECT datname FROM pg_database
		WHERE datname LIKE 'bp\_tmpl\_%' AND datname <> $1
		  AND coalesce(substring(shobj_description(oid, 'pg_database') FROM '^built ([0-9]+)$')::bigint, 0) < extract(epoch FROM now()) - 3600`, build)
	if err != nil {
		return err
	}
	stale, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, s := range stale {
		admin.Exec(ctx, "ALTER DATABASE "+s+" IS_TEMPLATE false")
		admin.Exec(ctx, "DROP DATABASE IF EXISTS "+s+" WITH (FORCE)")
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+build+" RENAME TO "+template); err != nil {
		return err
	}
	var built int64 // the database's clock, as the stale check reads it
	if err := admin.QueryRow(ctx, "SELECT floor(extract(epoch FROM now()))::bigint").Scan(&built); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("COMMENT ON DATABASE %s IS 'built %d'", template, built)); err != nil {
		return err
	}
	_, err = admin.Exec(ctx, "ALTER DATABASE "+template+" IS_TEMPLATE true")
	return err
}

// startLocal runs scripts/pg.sh env from the module root and returns the URL.
func startLocal() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", fmt.Errorf("DATABASE_URL is unset and %v; run `make test`", err)
	}
	cmd := exec.Command("bash", filepath.Join(root, "scripts", "pg.sh"), "env")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("DATABASE_URL is unset and scripts/pg.sh failed: %v", err)
	}
	line := strings.TrimSpace(string(out))
	v, ok := strings.CutPrefix(line, "export DATABASE_URL=")
	if !ok {
		return "", fmt.Errorf("scripts/pg.sh printed %q", line)
	}
	return strings.ReplaceAll(v, `\?`, "?"), nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "scripts", "pg.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("cannot find scripts/pg.sh above the working directory")
		}
		dir = parent
	}
}

func withDatabase(base, name string) string {
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" {
		// keyword/value form
		return base + " dbname=" + name
	}
	u.Path = "/" + name
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// WaitForLockWaiters polls until n backends of pool's database wait on a
// heavyweight lock, or fails the test at a deadline: how a deterministic
// race test knows its contenders are queued before it releases the lock it
// holds.
func WaitForLockWaiters(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	waitForBackends(t, pool, n, "waiting on a lock", "wait_event_type = 'Lock'")
}

// WaitForIdleInTransaction polls until a backend of pool's database is
// idle in a transaction whose last statement's text contains fragment:
// that transaction ran its statements (and holds what they locked) and
// waits for its client. It fails the test after 15 s.
func WaitForIdleInTransaction(t testing.TB, pool *pgxpool.Pool, fragment string) {
	t.Helper()
	waitForBackends(t, pool, 1, fmt.Sprintf("idle in a transaction after %q", fragment),
		"state = 'idle in transaction' AND strpos(query, $1) > 0", fragment)
}

// waitForBackends polls pg_stat_activity until at least n backends of
// pool's database match where (a condition on its columns, args its
// parameters), or fails the test after 15 s saying how many were what.
func waitForBackends(t testing.TB, pool *pgxpool.Pool, n int, what, where string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var got int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND `+where, args...).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends %s, want %d", got, what, n)
		}
		time.Sleep(5 * time.Millisecond) // poll interval, not a wait for the race
	}
}
