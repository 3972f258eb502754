package store

import (
	"context"
	"time"

	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// Standbys of partition state (issue 33, ZBP-5 R60-R65, R72, R73;
// migration 00042): a node the map names as a partition's standby follows
// its journal read-only (partstate.Standbys) and reports here how far it
// has applied it.

// StandbyReport is a standby's last report of a partition's journal it
// follows (R64).
type StandbyReport struct {
	Partition  string
	Node       string
	Generation int64
	// Epoch is the epoch the standby verified the journal is sequenced
	// under (R72): the one the lease store says the map's primary holds.
	Epoch uint64
	// AppliedLSN is the last LSN its state applied; HeadLSN the last the
	// journal had sequenced when it read it.
	AppliedLSN, HeadLSN uint64
	// ReportedAgo is how long ago it reported; CaughtUpAgo how long ago it
	// last applied everything sequenced (negative: never since it started
	// following this generation). Both by the database's clock.
	ReportedAgo, CaughtUpAgo time.Duration
}

// Lag is the records the standby had not applied when it reported.
func (r StandbyReport) Lag() uint64 { return r.HeadLSN - r.AppliedLSN }

// StandbySyncedWithin is how recently a standby must have reported, and
// been caught up with its journal, to count as synced (ZBP-5 R60): a
// standby reports at every catch-up, once a second.
const StandbySyncedWithin = 5 * time.Second

// Synced reports whether the standby counts as synced for a partition
// whose primary holds epoch: it follows that epoch's journal (R72), has
// reported within StandbySyncedWithin, and was caught up within it. A
// standby that is alive but far behind is a second copy of an old state,
// not a synced one.
func (r StandbyReport) Synced(epoch uint64) bool {
	return r.Epoch == epoch && r.ReportedAgo <= StandbySyncedWithin &&
		r.CaughtUpAgo >= 0 && r.CaughtUpAgo <= StandbySyncedWithin
}

// ReportStandby records r (its Partition, Node, Generation, Epoch,
// AppliedLSN, HeadLSN); caughtUp says it applied everything sequenced.
// Errors: unavailable.
func (s *Store) ReportStandby(ctx context.Context, r StandbyReport, caughtUp bool) error {
	err := s.q.ReportStandby(ctx, s.pool, dbsqlc.ReportStandbyParams{PartitionID: r.Partition, NodeID: r.Node, Generation: r.Generation,
		Epoch: int64(r.Epoch), AppliedLsn: int64(r.AppliedLSN), HeadLsn: int64(max(r.HeadLSN, r.AppliedLSN)), CaughtUp: caughtUp})
	return dbErr("report standby", err)
}

// ForgetStandby deletes node's report of partition: it stopped following
// it. Errors: unavailable.
func (s *Store) ForgetStandby(ctx context.Context, partition, node string) error {
	return dbErr("forget standby", s.q.ForgetStandby(ctx, s.pool, dbsqlc.ForgetStandbyParams{PartitionID: partition, NodeID: node}))
}

// StandbyReports lists every standby's last report, by partition and
// node. Errors: unavailable.
func (s *Store) StandbyReports(ctx context.Context) ([]StandbyReport, error) {
	rows, err := s.q.StandbyReports(ctx, s.pool)
	if err != nil {
		return nil, dbErr("standby reports", err)
	}
	out := make([]StandbyReport, len(rows))
	for i, r := range rows {
		out[i] = StandbyReport{Partition: r.PartitionID, Node: r.NodeID, Generation: r.Generation, Epoch: uint64(r.Epoch),
			AppliedLSN: uint64(r.AppliedLsn), HeadLSN: uint64(r.HeadLsn),
			ReportedAgo: seconds(r.ReportedAgo), CaughtUpAgo: seconds(r.CaughtUpAgo)}
	}
	return out, nil
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
