package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// loadResult is what one closed-loop run measured.
type loadResult struct {
	Ops       int
	Elapsed   time.Duration
	Latencies []time.Duration // one per op, sorted
	// ServerCPU is the CPU the system's servers used during the run,
	// when HasCPU (cpu.go).
	ServerCPU time.Duration
	HasCPU    bool
}

// OpsPerSec is completed ops over the wall time of the whole run.
func (r loadResult) OpsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// runLoad runs op on clients goroutines for d (a closed loop: each client
// issues its next op when the previous one returned; ops started before
// the end run to completion and count). Op i is the i-th op started across
// all clients. The first error stops every client and is returned; so does
// ctx ending.
func runLoad(ctx context.Context, clients int, d time.Duration, op func(ctx context.Context, i int) error) (loadResult, error) {
	r, _, err := runLoadCounting(ctx, clients, d, op, false)
	return r, err
}

// runLoadCounting is runLoad; with tolerate, an op's error is counted
// (errs) instead of stopping the load, and the failed op's latency is
// left out.
func runLoadCounting(ctx context.Context, clients int, d time.Duration, op func(ctx context.Context, i int) error, tolerate bool) (loadResult, int64, error) {
	if clients < 1 {
		return loadResult{}, 0, fmt.Errorf("runLoad: %d clients", clients)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next, bad atomic.Int64
	lats := make([][]time.Duration, clients)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for c := range clients {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(deadline) {
				i := int(next.Add(1) - 1)
				t0 := time.Now()
				if err := op(ctx, i); err != nil {
					if tolerate {
						bad.Add(1)
						continue
					}
					cancel(err)
					return
				}
				lats[c] = append(lats[c], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	// The op's error, or why the caller's ctx ended.
	if err := context.Cause(ctx); err != nil {
		return loadResult{}, bad.Load(), err
	}
	all := slices.Concat(lats...)
	slices.Sort(all)
	return loadResult{Ops: len(all), Elapsed: elapsed, Latencies: all}, bad.Load(), nil
}
