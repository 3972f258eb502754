package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/sweep"
)

func TestDeletionQueueIsAValidRiverQueue(t *testing.T) {
	t.Parallel()
	for _, dc := range []string{"eu-1", strings.Repeat("a", 63)} {
		q := DeletionQueue(dc)
		if len(q) > 64 || strings.ContainsAny(q, " ./") {
			t.Errorf("%q: queue %q", dc, q)
		}
		if _, err := river.NewClient(riverpgxv5.New(nil), &river.Config{Queues: map[string]river.QueueConfig{q: {MaxWorkers: 1}}, Workers: river.NewWorkers()}); err != nil && strings.Contains(err.Error(), "queue name") {
			t.Errorf("%q: River refuses queue %q: %v", dc, q, err)
		}
	}
}

// One byte-deletion job per placement key while one is unfinished, in the
// placement's datacenter queue, however often it is enqueued.
func TestDeleteBytesJobUniqueByKey(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ctx := context.Background()
	rc, err := river.NewClient(riverpgxv5.New(d.Pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	e := Deletion{Client: rc}
	dg := blobplane.Digest("sha256:" + strings.Repeat("ab", 32))
	del := store.Deletion{Key: placement.Key{Digest: dg, Backend: "fs", Datacenter: "eu-1", Location: "sha256/" + dg.Hex()}}
	for range 2 {
		if err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error { return e.EnqueueDeletionsTx(ctx, tx, []store.Deletion{del}) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.EnqueueDeletions(ctx, []store.Deletion{del}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'delete_bytes' AND queue = $1`, DeletionQueue("eu-1")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d delete_bytes jobs, want 1", n)
	}
}

type deleteStoreFunc func(ctx context.Context, k placement.Key, del func(context.Context) error) (store.DeletionResult, int64, error)

func (f deleteStoreFunc) DeleteCollectedBytesAfter(ctx context.Context, k placement.Key, _ time.Duration, del func(context.Context) error) (store.DeletionResult, int64, error) {
	return f(ctx, k, del)
}

type deleterFunc func(ctx context.Context, d blobplane.Digest) error

func (f deleterFunc) Delete(ctx context.Context, d blobplane.Digest) error { return f(ctx, d) }

// A transient backend error fails the attempt (River retries); a job for
// another datacenter is cancelled; a delete completes.
func TestDeleteBytesWorkerRetriesOrCancels(t *testing.T) {
	t.Parallel()
	dg := blobplane.Digest("sha256:" + strings.Repeat("cd", 32))
	for _, tc := range []struct {
		name           string
		dc             string
		backendErr     error
		fails, cancels bool
	}{
		{name: "deleted", dc: "eu-1"},
		{name: "transient", dc: "eu-1", backendErr: blobplane.Errorf(blobplane.CodeUnavailable, "store down"), fails: true},
		{name: "misrouted", dc: "us-1", fails: true, cancels: true},
	} {
		st := deleteStoreFunc(func(ctx context.Context, _ placement.Key, del func(context.Context) error) (store.DeletionResult, int64, error) {
			if err := del(ctx); err != nil {
				return store.DeletionNone, 0, err
			}
			return store.DeletionDeleted, 3, nil
		})
		w := &DeleteBytesWorker{Logger: slog.New(slog.DiscardHandler), Deleter: &sweep.Deleter{Store: st, Datacenter: "eu-1",
			Backends: map[string]sweep.ObjectDeleter{"fs": deleterFunc(func(context.Context, blobplane.Digest) error { return tc.backendErr })}}}
		err := w.Work(context.Background(), &river.Job[DeleteBytesArgs]{JobRow: &rivertype.JobRow{Attempt: 1},
			Args: DeleteBytesArgs{Digest: dg, Backend: "fs", Datacenter: tc.dc, Location: "sha256/" + dg.Hex()}})
		var cancel *rivertype.JobCancelError
		if (err != nil) != tc.fails || errors.As(err, &cancel) != tc.cancels {
			t.Errorf("%s: Work = %v, want fails=%v cancels=%v", tc.name, err, tc.fails, tc.cancels)
		}
	}
}

// The inventory is a periodic job by its kind's name (BLOBPLANE_CRON
// inventory=..., BLOBPLANE_INVENTORY_CRON).
func TestInventoryIsAPeriodicJob(t *testing.T) {
	t.Parallel()
	if !slices.Contains(PeriodicJobNames(), InventoryArgs{}.Kind()) {
		t.Fatalf("periodic jobs %v lack %q", PeriodicJobNames(), InventoryArgs{}.Kind())
	}
	if pj, err := PeriodicJobs(map[string]string{"inventory": "@every 1s"}); err != nil || len(pj) != 1 {
		t.Fatalf("inventory=@every 1s: %d jobs, %v", len(pj), err)
	}
}

// End to end through River: the collect job decides, its delete_bytes job
// (in the datacenter's queue) deletes the bytes from a real filesystem
// backend and finishes the deletion record.
func TestCollectJobDeletesBytesThroughRiver(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ctx := context.Background()
	st := store.New(d.Pool, nil)
	be, err := fs.Open(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	const content = "unreferenced"
	h := sha256.Sum256([]byte(content))
	dg := blobplane.Digest("sha256:" + hex.EncodeToString(h[:]))
	if _, err := be.Write(ctx, backend.WriteRequest{Digest: dg, Size: int64(len(content)), Body: strings.NewReader(content)}); err != nil {
		t.Fatal(err)
	}
	k := placement.Key{Digest: dg, Backend: "fs", Datacenter: "eu-1", Location: "sha256/" + dg.Hex()}
	if _, err := st.StagePlacement(ctx, k, int64(len(content)), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := st.VerifyPlacement(ctx, k, dg, int64(len(content)), 0); err != nil {
		t.Fatal(err)
	}
	// A published digest whose last reference is gone.
	if _, err := d.Pool.Exec(ctx, `INSERT INTO blobs (digest, size_bytes) VALUES ($1, $2)`, string(dg), len(content)); err != nil {
		t.Fatal(err)
	}

	logger := slog.New(slog.DiscardHandler)
	w := river.NewWorkers()
	AddCollectWorkers(w, CollectDeps{Store: st, Logger: logger, Datacenter: "eu-1", Backends: map[string]backend.Backend{"fs": be}})
	rc, err := river.NewClient(riverpgxv5.New(d.Pool), &river.Config{
		Logger: logger, Workers: w, FetchCooldown: 20 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}, DeletionQueue("eu-1"): {MaxWorkers: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rc.Stop(stopCtx)
	}()
	if _, err := rc.Insert(ctx, CollectArgs{}, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var done int
		if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM deletions WHERE digest = $1 AND result = 'deleted'`, string(dg)).Scan(&done); err != nil {
			t.Fatal(err)
		}
		if done == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the byte deletion did not finish")
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	if _, err := be.Stat(ctx, dg); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("L1: the collected bytes remain: %v", err)
	}
}

// Issue 32: a collection's deletion is scheduled after the delete delay
// (counted from its decision), and an obliteration's deletion of the same
// key, never delayed, is a job of its own rather than a duplicate held
// behind the delayed one.
func TestDeleteBytesJobScheduledAfterTheDelay(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ctx := context.Background()
	rc, err := river.NewClient(riverpgxv5.New(d.Pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	dg := blobplane.Digest("sha256:" + strings.Repeat("cd", 32))
	decided := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
	del := store.Deletion{Key: placement.Key{Digest: dg, Backend: "fs", Datacenter: "eu-1", Location: "sha256/" + dg.Hex()}, DecidedAt: decided}
	collect := Deletion{Client: rc, Delay: 24 * time.Hour}
	if err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error { return collect.EnqueueDeletionsTx(ctx, tx, []store.Deletion{del}) }); err != nil {
		t.Fatal(err)
	}
	if err := collect.EnqueueDeletions(ctx, []store.Deletion{del}); err != nil { // the collector's re-enqueue: no double
		t.Fatal(err)
	}
	if err := (Deletion{Client: rc}).EnqueueDeletions(ctx, []store.Deletion{del}); err != nil { // an obliteration's
		t.Fatal(err)
	}
	rows, err := d.Pool.Query(ctx, `SELECT state, scheduled_at, (args->>'delayed')::bool IS TRUE FROM river_job WHERE kind = 'delete_bytes' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type job struct {
		state   string
		at      time.Time
		delayed bool
	}
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (j job, err error) {
		return j, r.Scan(&j.state, &j.at, &j.delayed)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 2 {
		t.Fatalf("%d delete_bytes jobs, want 2 (one delayed, one at once): %+v", len(jobs), jobs)
	}
	if j := jobs[0]; !j.delayed || j.state != string(rivertype.JobStateScheduled) || !j.at.Equal(decided.Add(24*time.Hour)) {
		t.Fatalf("the collection's job: %+v, want scheduled at %v", j, decided.Add(24*time.Hour))
	}
	if j := jobs[1]; j.delayed || j.state != string(rivertype.JobStateAvailable) {
		t.Fatalf("the obliteration's job: %+v, want available now", j)
	}
}
