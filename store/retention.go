package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// Pruned counts the finished rows one retention batch deleted (or, in a
// dry run, would have).
type Pruned struct {
	Intents       int64 `json:"intents"`
	Outcomes      int64 `json:"operation_outcomes"`
	Deletions     int64 `json:"deletions"`
	Handoffs      int64 `json:"handoffs"`
	Children      int64 `json:"handoff_children"`
	Plans         int64 `json:"controller_plans"`
	ApplyRequests int64 `json:"controller_apply_requests"`
}

// Add sums o into p.
func (p *Pruned) Add(o Pruned) {
	p.Intents += o.Intents
	p.Outcomes += o.Outcomes
	p.Deletions += o.Deletions
	p.Handoffs += o.Handoffs
	p.Children += o.Children
	p.Plans += o.Plans
	p.ApplyRequests += o.ApplyRequests
}

// Full reports whether any table of the batch reached batch rows: more
// may be left.
func (p Pruned) Full(batch int) bool {
	b := int64(batch)
	return p.Intents >= b || p.Deletions >= b || p.Handoffs >= b || p.Plans >= b || p.ApplyRequests >= b
}

// errDryRun rolls a dry run's batch back.
var errDryRun = errors.New("dry run")

// PruneBatch deletes, in one transaction, at most batch of the oldest
// finished rows of each kind past its retention (issue 31,
// db/queries/retention.sql): uploads published or abandoned (their
// staged bytes gone) with their outcomes past operations; finished byte
// deletions, moves (with a split's or merge's children) and recorded
// plans and apply requests past history. Live rows are never touched;
// rows locked by a concurrent writer are skipped for a later batch. With
// dryRun the batch is rolled back: its counts say what it would delete.
func (s *Store) PruneBatch(ctx context.Context, operations, history time.Duration, batch int, dryRun bool) (Pruned, error) {
	const op = "store.PruneBatch"
	var p Pruned
	n := int32(min(max(batch, 1), 100_000))
	err := s.InTx(ctx, func(tx pgx.Tx) error {
		ops, err := s.q.PruneOperations(ctx, tx, dbsqlc.PruneOperationsParams{OlderThanSeconds: operations.Seconds(), BatchSize: n})
		if err != nil {
			return err
		}
		p.Intents, p.Outcomes = ops.Intents, ops.Outcomes
		if p.Deletions, err = s.q.PruneDeletions(ctx, tx, dbsqlc.PruneDeletionsParams{OlderThanSeconds: history.Seconds(), BatchSize: n}); err != nil {
			return err
		}
		hs, err := s.q.PruneHandoffs(ctx, tx, dbsqlc.PruneHandoffsParams{OlderThanSeconds: history.Seconds(), BatchSize: n})
		if err != nil {
			return err
		}
		p.Handoffs, p.Children = hs.Handoffs, hs.Children
		ps, err := s.q.PrunePlans(ctx, tx, dbsqlc.PrunePlansParams{OlderThanSeconds: history.Seconds(), BatchSize: n})
		if err != nil {
			return err
		}
		p.Plans, p.ApplyRequests = ps.Plans, ps.Requests
		if dryRun {
			return errDryRun
		}
		return nil
	})
	if errors.Is(err, errDryRun) {
		err = nil
	}
	return p, dbErr(op, err)
}
