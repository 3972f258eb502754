package store

import (
	"context"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// The replication reconciler's reads (issue 28, migration 00022): what
// each live blob holds and what its policies require.

// ReplicationNeed is one live blob compared with its replication policy.
type ReplicationNeed struct {
	Digest blobplane.Digest
	Size   int64
	// Verified are the datacenters holding a verified copy.
	Verified []string
	// Required are the datacenters its policies require (the union over
	// the repositories referencing it; fallback, else every registered
	// datacenter, for a repository no policy matches).
	Required []string
	// MinCopies is the most verified copies any of those policies asks
	// for (1 without a policy).
	MinCopies int
}

// ReplicationNeeds lists up to limit live blobs after the digest after,
// in digest order. fallback is the targets of a repository no policy
// matches (BLOBPLANE_REPLICATE_TO; nil: every registered datacenter).
func (s *Store) ReplicationNeeds(ctx context.Context, after blobplane.Digest, limit int, fallback []string) ([]ReplicationNeed, error) {
	if err := s.ensurePlacements(ctx); err != nil {
		return nil, err
	}
	rows, err := s.q.ReplicationNeeds(ctx, s.pool, dbsqlc.ReplicationNeedsParams{Fallback: fallback, AfterDigest: string(after), MaxRows: int32(limit)})
	if err != nil {
		return nil, dbErr("replication needs", err)
	}
	out := make([]ReplicationNeed, len(rows))
	for i, r := range rows {
		out[i] = ReplicationNeed{Digest: blobplane.Digest(r.Digest), Size: r.SizeBytes, Verified: r.Verified, Required: r.Required, MinCopies: int(r.MinCopies)}
	}
	return out, nil
}

// RegisteredDatacenters lists the datacenters of every registered node.
func (s *Store) RegisteredDatacenters(ctx context.Context) ([]string, error) {
	dcs, err := s.q.RegisteredDatacenters(ctx, s.pool)
	return dcs, dbErr("registered datacenters", err)
}

// ReplicationCursor is where the reconciler's next pass starts ("" from
// the first digest).
func (s *Store) ReplicationCursor(ctx context.Context) (blobplane.Digest, error) {
	after, err := s.q.GetReplicationCursor(ctx, s.pool)
	return blobplane.Digest(after), dbErr("replication cursor", err)
}

// SetReplicationCursor saves where the next pass starts.
func (s *Store) SetReplicationCursor(ctx context.Context, after blobplane.Digest) error {
	return dbErr("set replication cursor", s.q.SetReplicationCursor(ctx, s.pool, string(after)))
}
