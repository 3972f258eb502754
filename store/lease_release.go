package store

import (
	"context"
	"math"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// ReleaseLease gives up node's lease on partition at epoch by expiring it
// now (database clock), so a successor need not wait out the TTL. Releasing
// a lease that already moved on, or already expired, changes nothing and is
// not an error: the caller is leaving either way.
func (s *Store) ReleaseLease(ctx context.Context, partition, node string, epoch uint64) error {
	if epoch > math.MaxInt64 {
		return nil
	}
	_, err := s.q.ReleaseLease(ctx, s.pool, dbsqlc.ReleaseLeaseParams{PartitionID: partition, Node: node, Epoch: int64(epoch)})
	return leaseErr("store.ReleaseLease", err)
}

// SetLeaseState records the primary state of node's lease at epoch (R23:
// RESTORING on claim, SERVING once ready) — FENCE with a state payload.
// CodeStaleEpoch when the lease moved on.
func (s *Store) SetLeaseState(ctx context.Context, partition, node string, epoch uint64, state authority.PrimaryState) error {
	_, err := s.FenceLeaseWrite(ctx, partition, node, epoch, LeaseFenceWrite{State: &state})
	return err
}
