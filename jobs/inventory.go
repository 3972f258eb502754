package jobs

import (
	"context"
	"log/slog"

	"github.com/riverqueue/river"

	"github.com/blobplane/blobplane/sweep"
)

// InventoryArgs runs one inventory pass of the worker's datacenter
// (sweep.Inventory): list every backend, classify each object, delete
// orphans. Periodic under the name "inventory" (BLOBPLANE_INVENTORY_CRON).
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
		"orphan_bytes", rep.OrphanBytes, "orphans_deleted", rep.OrphansDeleted)
	return nil
}
