package slots

import (
	"sync"
	"testing"
)

// slotRig drives a Batcher with one slot: the first call holds it
// (its alone blocks on hold) while the next ones queue.
type slotRig struct {
	sb      *Batcher[int]
	hold    chan struct{} // closed: call 0 leaves its alone
	held    chan struct{} // call 0 is in its alone, holding the slot
	queued  chan int
	mu      sync.Mutex
	alone   []int   // calls run alone, in order
	batches [][]int // the calls of each commit
}

func newSlotRig() *slotRig {
	r := &slotRig{sb: &Batcher[int]{Slots: 1, MaxBatch: 2}, hold: make(chan struct{}), held: make(chan struct{}), queued: make(chan int, 16)}
	r.sb.Queued = func(n int) { r.queued <- n }
	return r
}

func (r *slotRig) runAlone(c int) {
	if c == 0 {
		close(r.held)
		<-r.hold
	}
	r.mu.Lock()
	r.alone = append(r.alone, c)
	r.mu.Unlock()
}

// do runs call c with commit, recovering a panic of commit into panicked.
func (r *slotRig) do(c int, commit func([]int) bool) (batched, panicked bool) {
	defer func() {
		if recover() != nil {
			panicked = true
		}
	}()
	return r.sb.Do(c, r.runAlone, func(calls []int) bool {
		r.mu.Lock()
		r.batches = append(r.batches, append([]int(nil), calls...))
		r.mu.Unlock()
		return commit(calls)
	}), false
}

// The calls queued behind a busy slot go in batches of at most MaxBatch,
// in arrival order, each taken by its head when the slot frees; a batch
// of one runs alone; a free slot runs a call alone at once.
func TestBatcherHandsTheSlotToTheQueue(t *testing.T) {
	r := newSlotRig()
	commit := func([]int) bool { return true }
	var wg sync.WaitGroup
	results := make([]bool, 4)
	wg.Go(func() { results[0], _ = r.do(0, commit) })
	<-r.held
	for i := 1; i <= 3; i++ {
		wg.Go(func() { results[i], _ = r.do(i, commit) })
		if n := <-r.queued; n != i {
			t.Fatalf("queue length %d after call %d", n, i)
		}
	}
	close(r.hold)
	wg.Wait()
	if results[0] || !results[1] || !results[2] || results[3] {
		t.Fatalf("batched: %v; want 1 and 2 in a batch, 0 and 3 alone", results)
	}
	if len(r.batches) != 1 || len(r.batches[0]) != 2 || r.batches[0][0] != 1 || r.batches[0][1] != 2 {
		t.Fatalf("batches %v, want [[1 2]]", r.batches)
	}
	if len(r.alone) != 2 || r.alone[0] != 0 || r.alone[1] != 3 {
		t.Fatalf("alone %v, want [0 3]", r.alone)
	}
	if st := r.sb.Stats(); st != (Stats{Batches: 1, Batched: 2}) {
		t.Fatalf("stats %+v", st)
	}
	if r.sb.running != 0 || len(r.sb.queue) != 0 {
		t.Fatalf("left running %d, queue %d", r.sb.running, len(r.sb.queue))
	}
}

// A batch that does not commit, or whose commit panics, leaves each of
// its calls to run alone, and the slot is free again afterwards.
func TestBatcherFallsBackAndKeepsItsSlot(t *testing.T) {
	for _, tc := range []struct {
		name   string
		commit func([]int) bool
	}{
		{"refused", func([]int) bool { return false }},
		{"panics", func([]int) bool { panic("commit") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newSlotRig()
			var wg sync.WaitGroup
			var panics int
			var mu sync.Mutex
			for i := range 3 {
				wg.Go(func() {
					batched, panicked := r.do(i, tc.commit)
					mu.Lock()
					defer mu.Unlock()
					if panicked {
						panics++
					} else if batched {
						t.Errorf("call %d: batched by a batch that did not commit", i)
					}
				})
				if i == 0 {
					<-r.held
				} else {
					<-r.queued
				}
			}
			close(r.hold)
			wg.Wait()
			wantPanics := 0
			if tc.name == "panics" {
				wantPanics = 1 // the head's, which ran the commit
			}
			if panics != wantPanics {
				t.Fatalf("%d panics, want %d", panics, wantPanics)
			}
			// 0 alone; 1 and 2 alone after their batch, except a head
			// whose commit panicked.
			if want := 3 - wantPanics; len(r.alone) != want {
				t.Fatalf("alone %v, want %d calls", r.alone, want)
			}
			if r.sb.running != 0 || len(r.sb.queue) != 0 {
				t.Fatalf("left running %d, queue %d", r.sb.running, len(r.sb.queue))
			}
			if st := r.sb.Stats(); st.Batches != 0 || (tc.name == "refused" && st.Fallback != 2) {
				t.Fatalf("stats %+v", st)
			}
			// And a new call finds the slot free.
			if batched, _ := r.do(9, tc.commit); batched || r.alone[len(r.alone)-1] != 9 {
				t.Fatalf("after the batch: batched %v, alone %v", batched, r.alone)
			}
		})
	}
}
