package jobs

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/upload"
)

// ReplicationQueue holds replication jobs. No worker polls it yet (the
// transfer worker is a later issue), so jobs wait there as durable
// replication records instead of failing as an unknown kind. Only
// multi-datacenter deployments enqueue any.
const ReplicationQueue = "replication"

// ReplicateArgs asks for a copy of a published blob's verified placement in
// the source datacenter to TargetDatacenter. One job per (operation,
// target); a retry of the operation never enqueues a second set (S4).
type ReplicateArgs struct {
	OperationID      string           `json:"operation_id"`
	Digest           blobplane.Digest `json:"digest"`
	Size             int64            `json:"size"`
	SourceDatacenter string           `json:"source_datacenter"`
	TargetDatacenter string           `json:"target_datacenter"`
}

func (ReplicateArgs) Kind() string { return "replicate" }

// Replication enqueues replication jobs inside finalization's transaction.
type Replication struct {
	// Client may be insert-only (no workers): the API's River client.
	Client *river.Client[pgx.Tx]
}

var _ upload.ReplicationEnqueuer = Replication{}

// EnqueueReplicationTx inserts one ReplicateArgs job per target in tx,
// unique by arguments so that even a duplicated call enqueues one set.
func (r Replication) EnqueueReplicationTx(ctx context.Context, tx pgx.Tx, rep upload.Replication) error {
	params := make([]river.InsertManyParams, 0, len(rep.Targets))
	for _, t := range rep.Targets {
		params = append(params, river.InsertManyParams{
			Args:       ReplicateArgs{OperationID: rep.OperationID, Digest: rep.Digest, Size: rep.Size, SourceDatacenter: rep.SourceDatacenter, TargetDatacenter: t},
			InsertOpts: &river.InsertOpts{Queue: ReplicationQueue, UniqueOpts: river.UniqueOpts{ByArgs: true}},
		})
	}
	if _, err := r.Client.InsertManyTx(ctx, tx, params); err != nil {
		return fmt.Errorf("enqueue replication of %s: %w", rep.Digest, err)
	}
	return nil
}
