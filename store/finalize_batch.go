package store

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Finalize batches (docs/performance.md, item 27). While this Store has
// finalizeSlots publishing transactions in flight, a Finalize does not
// open another: it queues (slots.go), and when a transaction ends the
// caller at the head of the queue takes every queued Finalize (up to
// maxFinalizeBatch) into one transaction: each call's own statements
// (queueFinalize) pipelined in one round trip, each decided on its own
// answers as alone (decide), one COMMIT for them all. A batch costs Postgres one BEGIN, one COMMIT
// and two round trips instead of one each per upload, and the uploads of
// a batch share one WAL flush. One alone (no other in flight) runs at
// once, as it always did.
//
// A batch commits only when every Finalize in it would have committed
// alone: a refusal, an error, a failed BeforeCommit or COMMIT of any rolls
// the whole batch back, and every one of its callers then runs Finalize
// alone, in its own goroutine, with its own transaction, which decides
// exactly as before (the refusal is returned to its caller, the others
// publish; BeforeCommit is once-only, so no bytes are waited for twice).
// The semantics of Finalize are therefore unchanged: the same checks on
// the same locked rows, the same writes, one transaction per publication
// from each client's point of view — a batch is several of them committed
// together, which no reader can tell from in sequence. A COMMIT whose
// outcome is unknown (the connection lost) is safe too: each caller's
// retry alone finds its intent admitted and returns the stored outcome
// (S4).
//
// Locks: a batch takes each Finalize's locks in its order (intent, then
// placement, blob, lease share), holding earlier ones while it takes
// later ones, as one transaction of several statements does, and its
// calls go in the order of their digests, so two batches (of two api
// processes) that share digests lock their rows in the same order.
// Should a deadlock still happen (with another kind of transaction),
// Postgres aborts one side; a batch's callers then run alone. That costs
// the deadlock timeout, never a wrong answer.

// finalizeSlots is how many publishing transactions one Store runs at a
// time before Finalize calls queue for a batch: two keep both of the
// reference machine's cores busy (BenchmarkUploadLedger: one slot makes
// larger batches but leaves Postgres idle between them, four smaller
// ones).
const finalizeSlots = 2

// maxFinalizeBatch bounds one batch (its pipeline and the locks it
// holds until its commit).
const maxFinalizeBatch = 64

// FinalizeBatchStats reads the counters of Finalize batching.
func (s *Store) FinalizeBatchStats() BatchStats { return s.fin.stats() }

// finalizeBatched runs c alone when a slot is free, else in the next
// batch; a batch that does not commit leaves each of its calls to run
// alone.
func (s *Store) finalizeBatched(ctx context.Context, c *finalizeCall) (out Outcome, verified bool, err error) {
	alone := func(c *finalizeCall) { out, verified, err = s.finalizeAlone(ctx, c) }
	commit := func(calls []*finalizeCall) bool { return s.commitFinalizeBatch(context.WithoutCancel(ctx), calls) }
	if s.fin.do(c, alone, commit) {
		return c.out, c.verified, nil
	}
	return out, verified, err
}

// byFinalizeDigest orders a Finalize batch: placement and blob rows' locks
// in digest order.
func byFinalizeDigest(a, b *finalizeCall) int {
	return strings.Compare(string(a.req.Digest), string(b.req.Digest))
}

// commitFinalizeBatch runs every call of batch in one transaction and
// reports whether it committed; the outcomes are then in the calls.
func (s *Store) commitFinalizeBatch(ctx context.Context, batch []*finalizeCall) bool {
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	for _, c := range batch {
		if err := s.queueFinalize(ctx, &b, c); err != nil {
			return false
		}
	}
	br := s.pool.SendBatch(ctx, &b)
	tx := br.Tx()
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if err := br.Close(); err != nil {
		return false
	}
	for _, c := range batch {
		out, verified, err := s.decide(ctx, tx, c)
		if err != nil {
			return false
		}
		c.out, c.verified = out, verified
	}
	for _, c := range batch {
		if before := c.req.BeforeCommit; before != nil {
			if err := before(); err != nil {
				return false
			}
		}
	}
	return tx.Commit(ctx) == nil
}
