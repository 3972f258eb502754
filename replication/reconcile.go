package replication

import (
	"context"
	"log/slog"
	"slices"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/store"
)

// ReconcileLedger is what the reconciler needs of the ledger
// (store.Store).
type ReconcileLedger interface {
	ReplicationNeeds(ctx context.Context, after blobplane.Digest, limit int, fallback []string) ([]store.ReplicationNeed, error)
	RegisteredDatacenters(ctx context.Context) ([]string, error)
	ReplicationCursor(ctx context.Context) (blobplane.Digest, error)
	SetReplicationCursor(ctx context.Context, after blobplane.Digest) error
}

// Copy is one copy the reconciler asks for.
type Copy struct {
	Digest blobplane.Digest
	Size   int64
	Source string // a datacenter holding a verified copy
	Target string
}

// CopyEnqueuer enqueues copies (replicate jobs, unique per digest and
// target among unfinished ones: asking again for a copy in flight adds
// nothing).
type CopyEnqueuer interface {
	EnqueueCopies(ctx context.Context, copies []Copy) error
}

// Reconciler compares live blobs with their replication policy, a
// bounded batch per pass from a cursor kept in Postgres, and enqueues
// every missing copy: a policy set after publication, a datacenter
// added to one, a copy failed or revoked since. Nothing is dropped: a
// copy still missing is asked for again on the next pass over it.
type Reconciler struct {
	Ledger ReconcileLedger
	Copies CopyEnqueuer
	// Fallback is the targets of a repository no policy matches
	// (BLOBPLANE_REPLICATE_TO; nil: every registered datacenter).
	Fallback []string
	Logger   *slog.Logger
}

// ReconcileReport is what one pass did.
type ReconcileReport struct {
	Blobs, Enqueued, Unsourced int
	Wrapped                    bool
}

// Run compares up to limit blobs after the cursor and moves it.
func (r *Reconciler) Run(ctx context.Context, limit int) (ReconcileReport, error) {
	var rep ReconcileReport
	after, err := r.Ledger.ReplicationCursor(ctx)
	if err != nil {
		return rep, err
	}
	needs, err := r.Ledger.ReplicationNeeds(ctx, after, limit, r.Fallback)
	if err != nil {
		return rep, err
	}
	registered, err := r.Ledger.RegisteredDatacenters(ctx)
	if err != nil {
		return rep, err
	}
	var copies []Copy
	for _, n := range needs {
		targets := Missing(n, registered)
		if len(targets) == 0 {
			continue
		}
		if len(n.Verified) == 0 {
			rep.Unsourced++ // no verified copy anywhere: nothing to copy from (the scrub's and the read path's to report)
			continue
		}
		for _, t := range targets {
			copies = append(copies, Copy{Digest: n.Digest, Size: n.Size, Source: n.Verified[0], Target: t})
		}
	}
	if len(copies) > 0 {
		if err := r.Copies.EnqueueCopies(ctx, copies); err != nil {
			return rep, err
		}
	}
	rep.Blobs, rep.Enqueued = len(needs), len(copies)
	next := blobplane.Digest("")
	if len(needs) == limit {
		next = needs[len(needs)-1].Digest
	} else {
		rep.Wrapped = true
	}
	return rep, r.Ledger.SetReplicationCursor(ctx, next)
}

// Missing is the datacenters n should be copied to: every required
// datacenter without a verified copy, then, while the verified copies
// and those fall short of n.MinCopies, further registered datacenters
// without one, in order.
func Missing(n store.ReplicationNeed, registered []string) []string {
	var out []string
	for _, dc := range n.Required {
		if !slices.Contains(n.Verified, dc) && !slices.Contains(out, dc) {
			out = append(out, dc)
		}
	}
	for _, dc := range registered {
		if len(n.Verified)+len(out) >= n.MinCopies {
			break
		}
		if !slices.Contains(n.Verified, dc) && !slices.Contains(out, dc) {
			out = append(out, dc)
		}
	}
	return out
}
