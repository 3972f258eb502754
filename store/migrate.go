package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/blobplane/blobplane/db"
)

// RiverMigrationVersion pins River's schema to the version this build was
// tested with; upgrading River is a deliberate change of this constant.
const RiverMigrationVersion = 8

// migrationLockID is the session advisory lock held while goose and River
// migrate, so that concurrent `api migrate` runs apply each step once.
const migrationLockID = 0x626c6f62706c616e // "blobplan"

// MigrationResult says what one Migrate call applied.
type MigrationResult struct {
	Goose []string // goose migration files applied
	River []int    // River migration versions applied
}

// Migrate applies Blobplane's goose migrations and then River's own, both
// under one Postgres session advisory lock held on a dedicated connection.
// It is idempotent: a second run applies nothing.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (*MigrationResult, error) {
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()

	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	defer conn.Close()
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(migrationLockID), lock.WithLockTimeout(1, 600))
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if err := locker.SessionLock(ctx, conn); err != nil {
		return nil, fmt.Errorf("migrate: take migration lock: %w", err)
	}
	defer func() {
		if err := locker.SessionUnlock(context.WithoutCancel(ctx), conn); err != nil {
			logger.Error("release migration lock", "err", err)
		}
	}()

	// The lock is ours for the whole function; the provider itself must not
	// try to take it again on another connection.
	provider, err := gooseProvider(sqlDB)
	if err != nil {
		return nil, err
	}
	applied, err := provider.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: goose: %w", err)
	}
	res := &MigrationResult{}
	for _, r := range applied {
		res.Goose = append(res.Goose, r.Source.Path)
		logger.Info("applied migration", "file", r.Source.Path, "duration", r.Duration)
	}

	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("migrate: river: %w", err)
	}
	rres, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, &rivermigrate.MigrateOpts{TargetVersion: RiverMigrationVersion})
	if err != nil {
		return nil, fmt.Errorf("migrate: river: %w", err)
	}
	for _, v := range rres.Versions {
		res.River = append(res.River, v.Version)
	}
	if _, err := pool.Exec(ctx, riverComments); err != nil {
		return nil, fmt.Errorf("migrate: comment river tables: %w", err)
	}
	return res, nil
}

// MigrationsCurrent reports whether both goose and River are at the versions
// this build expects (for /readyz).
func MigrationsCurrent(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	provider, err := gooseProvider(sqlDB)
	if err != nil {
		return false, err
	}
	pending, err := provider.HasPending(ctx)
	if err != nil || pending {
		return false, err
	}
	var v int
	err = pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM river_migration WHERE line = 'main'`).Scan(&v)
	if err != nil {
		return false, err
	}
	return v >= RiverMigrationVersion, nil
}

func gooseProvider(sqlDB *sql.DB) (*goose.Provider, error) {
	sub, err := fs.Sub(db.Migrations, "migrations")
	if err != nil {
		return nil, err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, sub, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return nil, fmt.Errorf("migrate: goose: %w", err)
	}
	return p, nil
}

// River's tables are River's, but DBAs query this database directly, so they
// get the same COMMENT ON treatment as ours. Re-applied after each migration
// run (COMMENT is idempotent).
const riverComments = `
COMMENT ON TABLE goose_db_version IS 'goose: Blobplane schema migrations applied (db/migrations).';
COMMENT ON TABLE river_migration IS 'River: River schema migrations applied (pinned by store.RiverMigrationVersion).';
COMMENT ON TABLE river_job IS 'River: background jobs (transfers, finalization, sweeps, scrubs). One row per job; see the River UI at /riverui/.';
COMMENT ON TABLE river_leader IS 'River: the elected leader among worker processes (runs periodic jobs and maintenance).';
COMMENT ON TABLE river_notification IS 'River: notification outbox between River clients.';
COMMENT ON TABLE river_queue IS 'River: queues known to workers, with pause state.';
`

// MigrationsCurrent reports whether this store's database is at the schema
// version this build expects.
func (s *Store) MigrationsCurrent(ctx context.Context) (bool, error) {
	return MigrationsCurrent(ctx, s.pool)
}

// SchemaFingerprint identifies everything Migrate applies (goose files, the
// pinned River version, the River comments). Test templates are keyed by it
// so a change to any of them rebuilds the template.
func SchemaFingerprint() string {
	h := sha256.New()
	fs.WalkDir(db.Migrations, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := fs.ReadFile(db.Migrations, path)
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	fmt.Fprintf(h, "river=%d\x00%s", RiverMigrationVersion, riverComments)
	return hex.EncodeToString(h.Sum(nil))[:16]
}
