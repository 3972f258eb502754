package store

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// Finalize batches (docs/performance.md, item 27). While this Store has
// finalizeSlots publishing transactions in flight, a Finalize does not
// open another: it queues, and when a transaction ends the caller at the
// head of the queue takes every queued Finalize (up to maxFinalizeBatch)
// into one transaction, each with its own statements (queueFinalize)
// pipelined in one round trip, decided one by one as alone (decide), and
// one COMMIT for them all. A batch costs Postgres one BEGIN, one COMMIT
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
// later ones, as one transaction of several statements does. Two batches
// that meet on two digests in opposite orders (the same blobs uploaded
// concurrently through two api processes) can deadlock; Postgres then
// aborts one, whose callers run alone. That costs the deadlock timeout,
// never a wrong answer.

// finalizeSlots is how many publishing transactions one Store runs at a
// time before Finalize calls queue for a batch.
const finalizeSlots = 2

// maxFinalizeBatch bounds one batch (its pipeline and the locks it
// holds until its commit).
const maxFinalizeBatch = 64

// finalizeBatcher is the queue of Finalize calls waiting for a slot.
type finalizeBatcher struct {
	mu      sync.Mutex
	running int // transactions in flight (alone or batches)
	queue   []*finalizeWaiter

	batches  atomic.Int64 // batches of two or more committed
	batched  atomic.Int64 // Finalize calls those batches committed
	fallback atomic.Int64 // Finalize calls whose batch rolled back, run alone
	queued   func(n int)  // test hook: the queue's length after a call joined it
}

// finalizeWaiter is a queued Finalize call.
type finalizeWaiter struct {
	c        *finalizeCall
	lead     chan struct{} // closed: this caller runs batch, which release took off the queue
	batch    []*finalizeWaiter
	done     chan struct{} // closed: the batch holding this call ended
	out      Outcome
	verified bool
	alone    bool // the batch rolled back: run alone
}

// FinalizeBatchStats are the counters of Finalize batching since the
// Store was made (exported as metrics by the api).
type FinalizeBatchStats struct {
	Batches  int64 // batches of two or more Finalize calls committed
	Batched  int64 // Finalize calls they committed
	Fallback int64 // Finalize calls whose batch rolled back and that ran alone
}

// FinalizeBatchStats reads the batching counters.
func (s *Store) FinalizeBatchStats() FinalizeBatchStats {
	fb := &s.fin
	return FinalizeBatchStats{Batches: fb.batches.Load(), Batched: fb.batched.Load(), Fallback: fb.fallback.Load()}
}

// finalizeBatched runs c alone when a slot is free, else queues it for
// the next batch.
func (s *Store) finalizeBatched(ctx context.Context, c *finalizeCall) (Outcome, bool, error) {
	fb := &s.fin
	fb.mu.Lock()
	if fb.running < finalizeSlots {
		fb.running++
		fb.mu.Unlock()
		out, verified, err := s.finalizeAlone(ctx, c)
		fb.release()
		return out, verified, err
	}
	w := &finalizeWaiter{c: c, lead: make(chan struct{}), done: make(chan struct{})}
	fb.queue = append(fb.queue, w)
	if fb.queued != nil {
		fb.queued(len(fb.queue))
	}
	fb.mu.Unlock()

	// A queued call waits for its batch whatever its context: the caller
	// at the head of the queue must take it, and a batch is as short as a
	// transaction alone. ctx still ends its statements when it leads.
	select {
	case <-w.done:
	case <-w.lead:
		s.runFinalizeBatch(context.WithoutCancel(ctx), w.batch)
		fb.release()
	}
	if w.alone {
		return s.finalizeAlone(ctx, c)
	}
	return w.out, w.verified, nil
}

// release ends a transaction in flight: its slot goes to the caller at
// the head of the queue, with the queue (up to maxFinalizeBatch) as its
// batch, or is freed.
func (fb *finalizeBatcher) release() {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if len(fb.queue) == 0 {
		fb.running--
		return
	}
	n := min(len(fb.queue), maxFinalizeBatch)
	head := fb.queue[0]
	head.batch = fb.queue[:n:n]
	fb.queue = fb.queue[n:]
	close(head.lead)
}

// runFinalizeBatch publishes batch in one transaction, or marks every call
// in it to run alone; then it wakes their callers.
func (s *Store) runFinalizeBatch(ctx context.Context, batch []*finalizeWaiter) {
	defer func() {
		for _, w := range batch {
			close(w.done)
		}
	}()
	if len(batch) == 1 {
		// Alone after all: the caller runs it (finalizeAlone) with its own
		// context.
		batch[0].alone = true
		return
	}
	if !s.commitFinalizeBatch(ctx, batch) {
		s.fin.fallback.Add(int64(len(batch)))
		for _, w := range batch {
			w.alone = true
		}
		return
	}
	s.fin.batches.Add(1)
	s.fin.batched.Add(int64(len(batch)))
}

// commitFinalizeBatch runs every call of batch in one transaction and
// reports whether it committed; the outcomes are then in the waiters.
func (s *Store) commitFinalizeBatch(ctx context.Context, batch []*finalizeWaiter) bool {
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	for _, w := range batch {
		if err := s.queueFinalize(ctx, &b, w.c); err != nil {
			return false
		}
	}
	br := s.pool.SendBatch(ctx, &b)
	tx := br.Tx()
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if err := br.Close(); err != nil {
		return false
	}
	for _, w := range batch {
		out, verified, err := s.decide(ctx, tx, w.c)
		if err != nil {
			return false
		}
		w.out, w.verified = out, verified
	}
	for _, w := range batch {
		if before := w.c.req.BeforeCommit; before != nil {
			if err := before(); err != nil {
				return false
			}
		}
	}
	return tx.Commit(ctx) == nil
}
