package store

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
)

// Claim batches (docs/performance.md, item 28). An upload's claim and
// stage (OpenAndStage, ClaimAndStage, ClaimSessionAndStage) are one
// implicit transaction: their statements in one round trip, committed
// by the server at its end, asynchronously. While this Store has
// claimSlots of them in flight, the next claims queue (slots.go) and the
// head of the queue sends all of theirs in one round trip and one
// implicit transaction. Should any statement of it fail, the server
// rolls all of them back and each claim is sent again alone, so its
// answer (its error included) is its own. Each claim's statements stay
// together and in their order, and the claims go in the order of their
// digests, so two batches take the digests' stage locks in one order.

// claimSlots is how many claim transactions one Store runs at a time
// before claims queue for a batch.
const claimSlots = 2

// maxClaimBatch bounds one claim batch.
const maxClaimBatch = 64

// claimCall is one claim: queue puts its statements on a batch (and
// points their answers at its caller's variables, overwritten each time
// it is queued).
type claimCall struct {
	digest blobplane.Digest
	queue  func(b *pgx.Batch)
}

// byClaimDigest orders a claim batch: stage locks in digest order.
func byClaimDigest(a, b *claimCall) int { return strings.Compare(string(a.digest), string(b.digest)) }

// ClaimBatchStats reads the counters of claim batching.
func (s *Store) ClaimBatchStats() BatchStats { return s.claims.stats() }

// sendClaim sends c's statements, alone or in a batch, and returns the
// error of their implicit transaction (nil: committed; else nothing of
// it was recorded).
func (s *Store) sendClaim(ctx context.Context, c *claimCall) error {
	var err error
	alone := func(c *claimCall) {
		var b pgx.Batch
		c.queue(&b)
		err = s.pool.SendBatch(ctx, &b).Close()
	}
	commit := func(calls []*claimCall) bool {
		var b pgx.Batch
		for _, c := range calls {
			c.queue(&b)
		}
		return s.pool.SendBatch(context.WithoutCancel(ctx), &b).Close() == nil
	}
	if s.claims.do(c, alone, commit) {
		return nil
	}
	return err
}
