package sweep

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/store"
)

// The inventory (docs/sweeps.md, "Inventory"): a recurring pass that lists
// every backend of a datacenter and classifies each object, so that bytes
// written outside the protocol (a crash between byte write and ledger
// write, a lost reply) are still found and deleted (L1). The first
// classification is an unlocked read; an object that looks orphaned is
// re-classified under the blob state row lock and the digest's placement
// lock and deleted while they are held, so a concurrent publication or
// upload of the same content wins (S1, S6).

// InventoryStore is what the inventory needs from Postgres; *store.Store
// implements it.
type InventoryStore interface {
	// ClassifyObjects classifies a page of objects from one unlocked
	// read, in order.
	ClassifyObjects(ctx context.Context, ds []blobplane.Digest, backend, datacenter string) ([]store.ObjectClass, error)
	// DeleteIfOrphan re-classifies under the locks and calls del only for
	// an orphan.
	DeleteIfOrphan(ctx context.Context, d blobplane.Digest, backend, datacenter string, del func(context.Context) error) (store.ObjectClass, error)
}

var _ InventoryStore = (*store.Store)(nil)

// Lister pages through a backend's objects and deletes them; every
// backend.Backend is one.
type Lister interface {
	// List returns one page of objects in digest order.
	List(ctx context.Context, opts backend.ListOptions) (backend.Page, error)
	// Delete removes d's object; a missing object is success.
	Delete(ctx context.Context, d blobplane.Digest) error
}

var _ Lister = (backend.Backend)(nil)

// Inventory classifies every object of one datacenter's backends.
type Inventory struct {
	Store      InventoryStore
	Backends   map[string]Lister // this datacenter's backends by name
	Datacenter string
	PageSize   int          // <= 0 means backend.DefaultListLimit
	Logger     *slog.Logger // nil discards
	Metrics    *CollectMetrics
}

// InventoryReport counts one inventory pass.
type InventoryReport struct {
	DryRun  bool                      `json:"dry_run"`
	Objects int                       `json:"objects"`
	Bytes   int64                     `json:"bytes"`
	Classes map[store.ObjectClass]int `json:"classes"` // as finally classified
	// Orphans and OrphanBytes count the objects found orphaned under the
	// locks (stored sizes); the deleted ones are a subset.
	Orphans            int   `json:"orphans"`
	OrphanBytes        int64 `json:"orphan_bytes"`
	OrphansDeleted     int   `json:"orphans_deleted"`
	OrphanBytesDeleted int64 `json:"orphan_bytes_deleted"`
}

// Run lists every backend and classifies each object; with dryRun it
// deletes nothing (orphans are those of the unlocked read). Safe to run on
// several workers and to re-run: deletes are idempotent and each is
// re-decided under the locks. An error stops the pass after recording
// what it counted so far.
func (inv *Inventory) Run(ctx context.Context, dryRun bool) (InventoryReport, error) {
	rep := InventoryReport{DryRun: dryRun, Classes: map[store.ObjectClass]int{}}
	defer func() { inv.Metrics.inventory(rep) }()
	for name, be := range inv.Backends {
		if err := inv.runBackend(ctx, name, be, dryRun, &rep); err != nil {
			return rep, err
		}
	}
	if rep.Orphans > 0 {
		inv.logger().InfoContext(ctx, "inventory found orphans", "datacenter", inv.Datacenter, "orphans", rep.Orphans,
			"orphan_bytes", rep.OrphanBytes, "deleted", rep.OrphansDeleted, "dry_run", dryRun)
	}
	return rep, nil
}

func (inv *Inventory) runBackend(ctx context.Context, name string, be Lister, dryRun bool, rep *InventoryReport) error {
	var after blobplane.Digest
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		page, err := be.List(ctx, backend.ListOptions{After: after, Limit: inv.PageSize})
		if err != nil {
			return fmt.Errorf("inventory %s/%s: list after %q: %w", inv.Datacenter, name, after, err)
		}
		ds := make([]blobplane.Digest, len(page.Entries))
		for i, e := range page.Entries {
			ds[i] = e.Digest
		}
		classes, err := inv.Store.ClassifyObjects(ctx, ds, name, inv.Datacenter)
		if err != nil {
			return fmt.Errorf("inventory %s/%s: %w", inv.Datacenter, name, err)
		}
		for i, e := range page.Entries {
			class := classes[i]
			if class == store.ClassOrphan && !dryRun {
				d := e.Digest
				class, err = inv.Store.DeleteIfOrphan(ctx, d, name, inv.Datacenter, func(ctx context.Context) error { return be.Delete(ctx, d) })
				if err != nil {
					return fmt.Errorf("inventory %s/%s: delete orphan %s: %w", inv.Datacenter, name, d, err)
				}
				if class == store.ClassOrphan {
					rep.OrphansDeleted++
					rep.OrphanBytesDeleted += e.StoredSize
				}
			}
			rep.Objects++
			rep.Bytes += e.StoredSize
			rep.Classes[class]++
			if class == store.ClassOrphan {
				rep.Orphans++
				rep.OrphanBytes += e.StoredSize
			}
		}
		if page.Next == "" {
			return nil
		}
		after = page.Next
	}
}

func (inv *Inventory) logger() *slog.Logger {
	if inv.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return inv.Logger
}

// Narrow gives a sweep the one capability it needs of a datacenter's
// backends by name (StagedDeleter, ObjectDeleter, Lister): every
// backend.Backend has them all, as the assertions beside each interface
// check at compile time.
func Narrow[T any](bes map[string]backend.Backend) map[string]T {
	out := make(map[string]T, len(bes))
	for name, be := range bes {
		out[name] = any(be).(T)
	}
	return out
}
