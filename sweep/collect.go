package sweep

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
)

// The collector of unreferenced content (docs/sweeps.md, "Collector").
//
// A digest is collected only when nothing owns it: ownership is the
// refcount over live references plus the claims of unfinished intents (and
// of a write in progress, a pending placement). A pending placement whose
// writer is gone — no pending intent claims the digest, no replicate job
// into its datacenter is unfinished — owns nothing any more: each pass
// first fails such placements (store.SettleStalePlacements, issue 29), so
// that a crash between writing bytes and verifying them leaks nothing. The decision is made in
// Postgres first, on the blob state row a publication also locks
// (store.CollectUnreferenced), and recorded there: placements revoked with
// reason reclamation, one durable deletion record per placement, the
// byte-deletion jobs enqueued in the same transaction. Bytes are deleted
// only after that commit, by a Deleter in the placement's datacenter,
// under the digest's placement lock and only if nothing owns the digest by
// then, so a concurrent upload of the same content wins.

// CollectStore is what the collector needs from Postgres; *store.Store
// implements it.
type CollectStore interface {
	// SettleStalePlacements fails up to limit pending placements whose
	// writer is gone (no pending intent claims the digest, no replicate
	// job into the datacenter is unfinished), so they stop owning their
	// digest.
	SettleStalePlacements(ctx context.Context, limit int) ([]placement.Placement, error)
	// CollectUnreferenced decides the collection of up to limit unowned
	// digests, enqueueing their byte deletions with enq in the deciding
	// transaction.
	CollectUnreferenced(ctx context.Context, limit int, enq store.DeletionEnqueuer) ([]store.Collected, error)
	// UnfinishedDeletions lists owed deletions, oldest first.
	UnfinishedDeletions(ctx context.Context, limit int) ([]store.Deletion, error)
	// OldestOwedDeletion is the age of the oldest owed deletion by the
	// database clock.
	OldestOwedDeletion(ctx context.Context) (time.Duration, error)
}

var _ CollectStore = (*store.Store)(nil)

// DeletionRequeuer re-enqueues owed deletions outside a decision (after a
// crash lost their jobs, or a job was discarded); jobs.Deletion implements
// it. Jobs are unique per placement key, so re-enqueueing is harmless.
type DeletionRequeuer interface {
	EnqueueDeletions(ctx context.Context, ds []store.Deletion) error
}

// DefaultCollectBatch bounds one collection pass when Collector.Batch is
// unset.
const DefaultCollectBatch = 1000

// Collector decides collections. It is safe to run on several workers at
// once (SKIP LOCKED) and to re-run.
type Collector struct {
	Store    CollectStore
	Enqueuer store.DeletionEnqueuer // required: byte deletions run as jobs
	Requeuer DeletionRequeuer       // nil: owed deletions are only reported
	// Delay is the collection delete delay the Deleters wait out: a
	// deletion is overdue (blobplane_collect_oldest_owed_deletion_seconds)
	// only past it.
	Delay   time.Duration
	Batch   int             // digests per pass; <= 0 means DefaultCollectBatch
	Logger  *slog.Logger    // nil discards
	Metrics *CollectMetrics // nil records nothing
}

// CollectReport is what one collection pass decided.
type CollectReport struct {
	// StalePlacements are the pending placements failed because their
	// writer was gone (an api killed between writing bytes and verifying
	// them): their digests are no longer owned by them.
	StalePlacements []placement.Key   `json:"stale_placements"`
	Collected       []store.Collected `json:"collected"`
	// Deletions is the number of byte deletions enqueued (one per revoked
	// placement).
	Deletions int `json:"deletions"`
	// Owed is the number of unfinished deletions seen after the pass (up
	// to a batch), re-enqueued when a Requeuer is set.
	Owed int `json:"owed"`
	// OldestOwed is the age of the oldest unfinished deletion (0: none).
	OldestOwed time.Duration `json:"oldest_owed"`
}

// RunOnce runs one pass: fail up to Batch stale pending placements (so
// that their digests can be collected in the same pass), decide up to
// Batch collections, then look at owed deletions (re-enqueue them,
// measure the oldest).
func (c *Collector) RunOnce(ctx context.Context) (CollectReport, error) {
	if c.Enqueuer == nil {
		return CollectReport{}, blobplane.Errorf(blobplane.CodeInternal, "collector: no deletion enqueuer configured")
	}
	batch := c.Batch
	if batch <= 0 {
		batch = DefaultCollectBatch
	}
	var rep CollectReport
	stale, err := c.Store.SettleStalePlacements(ctx, batch)
	for _, p := range stale {
		rep.StalePlacements = append(rep.StalePlacements, p.Key)
	}
	c.Metrics.staleFailed(len(stale))
	if len(stale) > 0 {
		c.logger().InfoContext(ctx, "failed pending placements whose writer is gone", "placements", len(stale), "first", stale[0].Key)
	}
	if err != nil {
		return rep, fmt.Errorf("collect: %w", err)
	}
	got, err := c.Store.CollectUnreferenced(ctx, batch, c.Enqueuer)
	rep.Collected = got
	for _, g := range got {
		rep.Deletions += len(g.Deletions)
	}
	c.Metrics.collected(len(got))
	if err != nil {
		return rep, fmt.Errorf("collect: %w", err)
	}
	owed, err := c.Store.UnfinishedDeletions(ctx, batch)
	if err != nil {
		return rep, fmt.Errorf("collect: %w", err)
	}
	rep.Owed = len(owed)
	if len(owed) > 0 {
		if rep.OldestOwed, err = c.Store.OldestOwedDeletion(ctx); err != nil {
			return rep, fmt.Errorf("collect: %w", err)
		}
		if c.Requeuer != nil {
			if err := c.Requeuer.EnqueueDeletions(ctx, owed); err != nil {
				return rep, fmt.Errorf("collect: re-enqueue owed deletions: %w", err)
			}
		}
	}
	c.Metrics.owed(max(rep.OldestOwed-c.Delay, 0))
	if len(got) > 0 {
		c.logger().InfoContext(ctx, "collected unreferenced digests", "digests", len(got), "deletions", rep.Deletions, "owed", rep.Owed)
	}
	return rep, nil
}

func (c *Collector) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

// DeleteStore is what a Deleter needs from Postgres; *store.Store
// implements it.
type DeleteStore interface {
	// DeleteCollectedBytesAfter calls del under the digest's placement
	// lock only if the deletion of k is owed, due after delay, and still
	// justified.
	DeleteCollectedBytesAfter(ctx context.Context, k placement.Key, delay time.Duration, del func(context.Context) error) (store.DeletionResult, int64, error)
}

var _ DeleteStore = (*store.Store)(nil)

// ObjectDeleter deletes content-addressed objects; every backend.Backend
// is one.
type ObjectDeleter interface {
	// Delete removes d's object; a missing object is success.
	Delete(ctx context.Context, d blobplane.Digest) error
}

var _ ObjectDeleter = (backend.Backend)(nil)

// Deleter runs the byte deletions a collection decided, in its datacenter.
type Deleter struct {
	Store      DeleteStore
	Backends   map[string]ObjectDeleter // this datacenter's backends by name
	Datacenter string
	// Delay keeps a collected copy's bytes this long after the decision
	// (BLOBPLANE_COLLECT_DELETE_DELAY): a deletion not yet due returns a
	// *store.NotDueError. Obliterated digests never wait.
	Delay   time.Duration
	Metrics *CollectMetrics // nil records nothing
}

// Delete finishes the owed deletion of k. Idempotent: a finished (or
// never owed) deletion returns store.DeletionNone and touches nothing.
// Errors: invalid (k is in another datacenter or names an unknown backend:
// a wiring bug), and the backend's errors (retryable ones are transient).
func (d *Deleter) Delete(ctx context.Context, k placement.Key) (store.DeletionResult, error) {
	if k.Datacenter != d.Datacenter {
		return store.DeletionNone, blobplane.Errorf(blobplane.CodeInvalid, "delete %s: placement is in datacenter %q, this deleter serves %q", k.Digest, k.Datacenter, d.Datacenter)
	}
	be, ok := d.Backends[k.Backend]
	if !ok {
		return store.DeletionNone, blobplane.Errorf(blobplane.CodeInvalid, "delete %s: backend %q is not configured in %s", k.Digest, k.Backend, d.Datacenter)
	}
	res, size, err := d.Store.DeleteCollectedBytesAfter(ctx, k, d.Delay, func(ctx context.Context) error { return be.Delete(ctx, k.Digest) })
	if err != nil {
		return store.DeletionNone, err
	}
	if res == store.DeletionDeleted {
		d.Metrics.reclaimed(size)
	}
	return res, nil
}
