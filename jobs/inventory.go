package jobs

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/blobplane/blobplane/sweep"
)

// InventoryArgs runs one inventory pass of the worker's datacenter
// (sweep.Inventory): on each backend whose ownership marker vouches for
// this database, classify each object, delete orphans and reclaim residue
// (temp files, staged uploads no intent owns, incomplete multipart
// uploads) past the minimum age, up to the cap. Periodic under the name
// "inventory" (BLOBPLANE_INVENTORY_CRON).
type InventoryArgs struct{}

func (InventoryArgs) Kind() string { return "inventory" }

// InventoryWorker runs InventoryArgs. A pass is safe to repeat and to run
// on several workers: every delete is re-decided under the row locks.
type InventoryWorker struct {
	river.WorkerDefaults[InventoryArgs]
	Inventory *sweep.Inventory
	Logger    *slog.Logger
}

func (w *InventoryWorker) Work(ctx context.Context, job *river.Job[InventoryArgs]) error {
	rep, err := w.Inventory.Run(ctx, false)
	if err != nil {
		return err
	}
	w.Logger.InfoContext(ctx, "inventory pass", "objects", rep.Objects, "bytes", rep.Bytes, "orphans", rep.Orphans,
		"orphan_bytes", rep.OrphanBytes, "orphans_deleted", rep.OrphansDeleted, "residue_deleted", rep.ResidueDeleted,
		"handed_back", rep.HandedBack, "young", rep.Young, "held", rep.Held)
	return nil
}

// Timeout bounds one pass, which lists every object and every piece of
// residue of the datacenter's backends: River's default (a minute) would
// cut a pass over a large backend short every time. River rescues a
// running job only past its own timeout (river#350); a second pass at
// once is safe anyway.
func (w *InventoryWorker) Timeout(*river.Job[InventoryArgs]) time.Duration { return 30 * time.Minute }
