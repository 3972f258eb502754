// Package slots holds Batcher, the store's generic batcher of hot-path
// transactions: a few run at once, one each, and the calls that arrive
// while all of them are busy share the next transaction.
package slots

import (
	"slices"
	"sync"
	"sync/atomic"
)

// Batcher lets a hot path's transactions run one each while fewer than
// Slots are in flight, and batches the calls that arrive while they all
// are: when a transaction ends, the caller at the head of the queue takes
// every queued call (up to MaxBatch) into one transaction (the store's
// Finalize and claims: store/finalize_batch.go, store/claim_batch.go;
// docs/performance.md, items 27-28). With one client nothing ever queues;
// under load the calls that would each have paid a transaction's round
// trips, BEGIN and COMMIT share one.
//
// A batch either commits every call in it, each as it would have alone,
// or none: then every caller runs its call alone, in its own goroutine,
// without a slot, so an answer never depends on the batch it shared.
type Batcher[C any] struct {
	Slots    int // transactions in flight before calls queue
	MaxBatch int // calls one batch takes at the most
	// Order sorts the calls of a batch before commit sees them (nil:
	// arrival order): both hot paths send theirs in digest order, so two
	// batches that share digests take their locks in one order.
	Order  func(a, b C) int
	Off    bool        // every call runs alone (benchmarks' baseline)
	Queued func(n int) // test hook: the queue's length after a call joined it

	mu      sync.Mutex
	running int // transactions in flight (alone or batches)
	queue   []*slotWaiter[C]

	batches  atomic.Int64 // batches of two or more committed
	batched  atomic.Int64 // calls those batches committed
	fallback atomic.Int64 // calls whose batch did not commit, run alone
	merged   atomic.Int64 // committed batches whose calls shared one statement per kind (commit counts them: CountMerged)
}

// slotWaiter is a queued call.
type slotWaiter[C any] struct {
	call  C
	lead  chan struct{} // closed: this caller runs batch, which Release took off the queue
	batch []*slotWaiter[C]
	done  chan struct{} // closed: the batch holding this call ended
	alone bool          // the batch did not commit (or held only this call): run alone
}

// Stats are a Batcher's counters since it was made (the store exports
// them as BatchStats, which the api exports as metrics).
type Stats struct {
	Batches  int64 // batches of two or more calls committed
	Batched  int64 // calls they committed
	Fallback int64 // calls whose batch did not commit and that ran alone
	// Merged counts the batches of those whose calls shared one
	// statement per kind (store/finalize_batch.go, store/claim_batch.go).
	Merged int64
}

// Stats reads the counters.
func (sb *Batcher[C]) Stats() Stats {
	return Stats{Batches: sb.batches.Load(), Batched: sb.batched.Load(), Fallback: sb.fallback.Load(), Merged: sb.merged.Load()}
}

// CountMerged counts a committed batch whose calls shared one statement
// per kind: commit calls it.
func (sb *Batcher[C]) CountMerged() { sb.merged.Add(1) }

// Do runs call: alone(call) at once when a slot is free; else queued, in
// the next batch, where commit(calls) runs them all in one transaction
// and reports whether it committed. Do returns true when a batch
// committed call (its answers are in it); false when alone ran it.
// commit runs in the goroutine of the batch's first caller, so it must
// not use one caller's context for the others' sake beyond its values.
func (sb *Batcher[C]) Do(call C, alone func(C), commit func([]C) bool) bool {
	if sb.Off {
		alone(call)
		return false
	}
	sb.mu.Lock()
	if sb.running < sb.Slots {
		sb.running++
		sb.mu.Unlock()
		defer sb.Release() // also if alone panics: the slot is never lost
		alone(call)
		return false
	}
	w := &slotWaiter[C]{call: call, lead: make(chan struct{}), done: make(chan struct{})}
	sb.queue = append(sb.queue, w)
	if sb.Queued != nil {
		sb.Queued(len(sb.queue))
	}
	sb.mu.Unlock()

	// A queued call waits for its batch whatever its caller's context:
	// the head of the queue must take it, and a batch is as short as a
	// transaction alone.
	select {
	case <-w.done:
	case <-w.lead:
		func() {
			defer sb.Release()
			sb.run(w.batch, commit)
		}()
	}
	if w.alone {
		alone(call)
		return false
	}
	return true
}

// run commits batch, or leaves every call in it to run alone (also when
// commit panics); then it wakes their callers.
func (sb *Batcher[C]) run(batch []*slotWaiter[C], commit func([]C) bool) {
	for _, w := range batch {
		w.alone = true
	}
	defer func() {
		for _, w := range batch {
			close(w.done)
		}
	}()
	if len(batch) == 1 { // alone after all, in its caller's own context
		return
	}
	calls := make([]C, len(batch))
	for i, w := range batch {
		calls[i] = w.call
	}
	if sb.Order != nil {
		slices.SortStableFunc(calls, sb.Order)
	}
	if !commit(calls) {
		sb.fallback.Add(int64(len(batch)))
		return
	}
	for _, w := range batch {
		w.alone = false
	}
	sb.batches.Add(1)
	sb.batched.Add(int64(len(batch)))
}

// TakeIfIdle takes a slot when no transaction is in flight and none is
// queued (a chained close's, store/chain.go), and reports whether it did;
// Release gives it back. With batching off it takes none.
func (sb *Batcher[C]) TakeIfIdle() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.Off || sb.running > 0 || len(sb.queue) > 0 {
		return false
	}
	sb.running++
	return true
}

// Release ends a transaction in flight: its slot goes to the caller at
// the head of the queue, with the queue (up to MaxBatch) as its batch, or
// is freed.
func (sb *Batcher[C]) Release() {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if len(sb.queue) == 0 {
		sb.running--
		return
	}
	n := min(len(sb.queue), sb.MaxBatch)
	head := sb.queue[0]
	head.batch = sb.queue[:n:n]
	sb.queue = sb.queue[n:]
	close(head.lead)
}
