package sweep

import (
	"context"
	"log/slog"
	"time"

	"github.com/blobplane/blobplane/store"
)

// Pruner deletes one batch of finished rows past their retention
// (store.Store.PruneBatch).
type Pruner interface {
	PruneBatch(ctx context.Context, operations, history time.Duration, batch int, dryRun bool) (store.Pruned, error)
}

// Retention keeps the tables that record what finished from growing
// forever (issue 31): uploads published or abandoned and their outcomes
// past Operations; finished byte deletions, moves and recorded plans past
// History. It runs in the sweep job, after the reaper, in batches of
// Batch rows per table, each its own transaction, at most MaxBatches per
// pass; what is left waits for the next pass. Partition maps and their
// deltas are kept (ZBP-5 R9), obliteration records too (an audit of
// who removed what, never large).
type Retention struct {
	Store               Pruner
	Operations, History time.Duration
	Batch, MaxBatches   int
	Logger              *slog.Logger
}

// RunOnce runs one pass; a dry run counts one batch and rolls it back.
func (r *Retention) RunOnce(ctx context.Context, dryRun bool) (store.Pruned, error) {
	var total store.Pruned
	batches := max(r.MaxBatches, 1)
	if dryRun {
		batches = 1
	}
	for range batches {
		p, err := r.Store.PruneBatch(ctx, r.Operations, r.History, r.Batch, dryRun)
		if err != nil {
			return total, err
		}
		total.Add(p)
		if !p.Full(r.Batch) {
			break
		}
	}
	if total != (store.Pruned{}) && r.Logger != nil && !dryRun {
		r.Logger.InfoContext(ctx, "retention: finished rows pruned", "intents", total.Intents, "operation_outcomes", total.Outcomes,
			"deletions", total.Deletions, "handoffs", total.Handoffs, "controller_plans", total.Plans, "apply_requests", total.ApplyRequests)
	}
	return total, nil
}
