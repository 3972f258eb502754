package store_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/formats"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/quota"
	"github.com/blobplane/blobplane/store"
)

// olderUpsert is how a release from before format levels registers (the
// UpsertNode of migrations 00001-00042): it knows neither reads_format
// column.
const olderUpsert = `INSERT INTO nodes (node_id, datacenter, role, endpoint, class, capacity, version, started_at, heartbeat_at, state)
VALUES ($1, 'eu-1', 'api', '', 'standard', 1, 'old', now(), now(), 'up')
ON CONFLICT (node_id) DO UPDATE
SET version = EXCLUDED.version, started_at = now(), heartbeat_at = now(), state = 'up', draining_since = NULL`

// atLevel1 sets s's cluster back to level 1, as migration 00043 leaves a
// database nodes had registered in (nothing in the API lowers it).
func atLevel1(t *testing.T, s *store.Store) {
	t.Helper()
	if _, err := s.Pool().Exec(context.Background(), `UPDATE cluster_format SET level = 1`); err != nil {
		t.Fatal(err)
	}
}

func behindIDs(err error) []string {
	var b *store.NodesBehindError
	if !errors.As(err, &b) {
		return nil
	}
	var ids []string
	for _, n := range b.Nodes {
		ids = append(ids, n.ID)
	}
	return ids
}

// ZBP-5 R44: migration 00043 starts a fresh database at level 2 (nothing
// older ever ran against it) and one where nodes had registered at level
// 1 (an upgrade: older binaries may still run, or be rolled back to);
// those nodes read level 1 until they register again.
func TestFormatLevelMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewStore(t)
	if level, err := s.FormatLevel(ctx); err != nil || level != formats.Level2 {
		t.Fatalf("a fresh database: level %d (%v), want 2", level, err)
	}
	for _, c := range []struct {
		node bool
		want int
	}{{false, formats.Level2}, {true, formats.Level1}} {
		if err := store.MigrateToForTest(ctx, s.Pool(), 42); err != nil {
			t.Fatal(err)
		}
		if c.node {
			if _, err := s.Pool().Exec(ctx, `INSERT INTO nodes (node_id, datacenter, role) VALUES ('api-old', 'eu-1', 'api')`); err != nil {
				t.Fatal(err)
			}
		}
		if err := store.MigrateToForTest(ctx, s.Pool(), 43); err != nil {
			t.Fatal(err)
		}
		cf, err := s.ClusterFormat(ctx)
		if err != nil || cf.Level != c.want || cf.RaisedBy != "migration 00043" {
			t.Fatalf("migrated with a node %v: %+v (%v), want level %d", c.node, cf, err, c.want)
		}
		if c.node && (len(cf.Nodes) != 1 || cf.Nodes[0].ReadsFormat != 0 || cf.Nodes[0].Reading() != formats.Level1) {
			t.Fatalf("a node registered before the migration: %+v, want it to read level 1", cf.Nodes)
		}
	}
}

// Below level 2 a quota with an upload rate is refused (its records
// would carry "at"), a quota without one is not; finalize is refused
// while a live node reads level 1 (one that reported nothing, one that
// reported 1, one whose report an older binary's registration left
// behind) and ignores nodes that are down or silent; once they read 2 it
// raises the level, is idempotent, never lowers, and a rate is accepted.
// After it, an older binary cannot register.
func TestFormatLevelGatesRatesAndFinalize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewStore(t)
	atLevel1(t, s)
	if err := s.CreateRepository(ctx, "team/app"); err != nil {
		t.Fatal(err)
	}
	rate := quota.Limit{BlobsPerMinute: 600}
	_, err := s.SetRepositoryQuota(ctx, "team/app", rate, "root")
	if blobplane.ErrorCode(err) != blobplane.CodeConflict || !strings.Contains(err.Error(), "cluster format level 2") ||
		!strings.Contains(err.Error(), "api cluster finalize") {
		t.Fatalf("a rate at level 1: %v, want conflict naming the level and the finalize", err)
	}
	if q, err := s.RepositoryQuota(ctx, "team/app"); err != nil || q.Limit != (quota.Limit{}) {
		t.Fatalf("after the refusal: %+v (%v), want no quota", q, err)
	}
	if q, err := s.SetRepositoryQuota(ctx, "team/app", quota.Limit{Bytes: 1 << 20}, "root"); err != nil || q.Limit.Bytes != 1<<20 {
		t.Fatalf("a quota without a rate at level 1: %+v (%v)", q, err)
	}

	// This build registers reading level 2; older ones report nothing.
	for _, id := range []string{"api-new", "api-flip"} {
		if n, err := s.RegisterNode(ctx, store.Node{ID: id, Datacenter: "eu-1", Role: "api"}); err != nil || n.ReadsFormat != formats.Reads {
			t.Fatalf("register %s: %+v (%v)", id, n, err)
		}
	}
	for _, q := range []string{
		`INSERT INTO nodes (node_id, datacenter, role) VALUES ('api-old', 'eu-1', 'api')`,
		`INSERT INTO nodes (node_id, datacenter, role, reads_format, reads_format_started_at) VALUES ('worker-one', 'eu-1', 'worker', 1, now())`,
		`INSERT INTO nodes (node_id, datacenter, role, state) VALUES ('api-gone', 'eu-1', 'api', 'down')`,
		`INSERT INTO nodes (node_id, datacenter, role, heartbeat_at) VALUES ('api-silent', 'eu-1', 'api', now() - interval '5 minutes')`,
	} {
		if _, err := s.Pool().Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// api-flip is rolled back to an older binary: its registration moves
	// started_at and leaves the report behind.
	if _, err := s.Pool().Exec(ctx, olderUpsert, "api-flip"); err != nil {
		t.Fatal(err)
	}
	before, after, err := s.RaiseFormatLevel(ctx, formats.Level2, "root")
	if blobplane.ErrorCode(err) != blobplane.CodeConflict || before != 1 || after != 1 ||
		!slices.Equal(behindIDs(err), []string{"api-flip", "api-old", "worker-one"}) || !strings.Contains(err.Error(), "api-old (api, reads level 1)") {
		t.Fatalf("finalize with nodes reading level 1: %d -> %d, %v (behind %v)", before, after, err, behindIDs(err))
	}
	if level, _ := s.FormatLevel(ctx); level != formats.Level1 {
		t.Fatalf("after a refused finalize: level %d", level)
	}
	if _, err := s.SetRepositoryQuota(ctx, "team/app", rate, "root"); blobplane.ErrorCode(err) != blobplane.CodeConflict {
		t.Fatalf("a rate after a refused finalize: %v", err)
	}

	// The rollout reaches them: they register again, as this build.
	for _, n := range []store.Node{{ID: "api-flip", Role: "api"}, {ID: "api-old", Role: "api"}, {ID: "worker-one", Role: "worker"}} {
		n.Datacenter = "eu-1"
		if _, err := s.RegisterNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if before, after, err := s.RaiseFormatLevel(ctx, formats.Level2, "root"); err != nil || before != 1 || after != 2 {
		t.Fatalf("finalize: %d -> %d (%v)", before, after, err)
	}
	cf, err := s.ClusterFormat(ctx)
	if err != nil || cf.Level != 2 || cf.RaisedBy != "root" || time.Since(cf.RaisedAt) > time.Minute {
		t.Fatalf("after finalize: %+v (%v)", cf, err)
	}
	for _, c := range []struct{ to, before, after int }{{2, 2, 2}, {1, 2, 2}} {
		if before, after, err := s.RaiseFormatLevel(ctx, c.to, "root"); err != nil || before != c.before || after != c.after {
			t.Fatalf("finalize to %d again: %d -> %d (%v)", c.to, before, after, err)
		}
	}
	for _, to := range []int{0, formats.Reads + 1} {
		if _, _, err := s.RaiseFormatLevel(ctx, to, "root"); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
			t.Fatalf("finalize to %d: %v, want invalid", to, err)
		}
	}
	if q, err := s.SetRepositoryQuota(ctx, "team/app", rate, "root"); err != nil || q.Limit.BlobsPerMinute != 600 {
		t.Fatalf("a rate at level 2: %+v (%v)", q, err)
	}

	// R88: past finalize, an older binary does not register, neither a
	// new row nor a node rolled back.
	for _, id := range []string{"api-old", "api-brand-new"} {
		_, err := s.Pool().Exec(ctx, olderUpsert, id)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "BPF01" || !strings.Contains(pgErr.Message, "reads cluster format level 1") {
			t.Fatalf("an older binary registers %s at level 2: %v", id, err)
		}
	}
	// Heartbeats of nodes that registered are not registrations.
	if err := s.HeartbeatNode(ctx, "api-old"); err != nil {
		t.Fatal(err)
	}
}

// A rate set while a finalize is in flight waits for it (the share lock
// on the level's row against the finalize's update lock) and answers by
// its outcome: accepted when it committed level 2, refused when it
// rolled back.
func TestRateWaitsForAFinalizeInFlight(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "committed", false: "rolled back"}[commit], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := pgtest.New(t)
			s := store.New(d.Pool, nil)
			atLevel1(t, s)
			if err := s.CreateRepository(ctx, "team/app"); err != nil {
				t.Fatal(err)
			}
			// The finalize's transaction, held open.
			tx, err := d.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `SELECT level FROM cluster_format FOR UPDATE`); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `UPDATE cluster_format SET level = 2`); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := s.SetRepositoryQuota(ctx, "team/app", quota.Limit{BytesPerMinute: 1 << 30}, "root")
				done <- err
			}()
			waitForLockWait(t, d.Pool, done)
			if commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			err = <-done
			if commit && err != nil {
				t.Fatalf("a rate behind a finalize that committed: %v", err)
			}
			if !commit && blobplane.ErrorCode(err) != blobplane.CodeConflict {
				t.Fatalf("a rate behind a finalize that rolled back: %v, want conflict", err)
			}
		})
	}
}

// waitForLockWait returns once a backend of pool's database waits on a
// lock (the writer behind the held row), failing if done answers first
// or nothing waits within 10 s.
func waitForLockWait(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, done chan error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("the writer did not wait for the held lock: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no writer waits on the held lock after 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
