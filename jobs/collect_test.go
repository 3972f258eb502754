package jobs

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/blobplane/blobplane"
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

func (f deleteStoreFunc) DeleteCollectedBytes(ctx context.Context, k placement.Key, del func(context.Context) error) (store.DeletionResult, int64, error) {
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
