package upload

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/blobplane/blobplane"
)

// bounds holds one principal to its bounds on open upload
// sessions and staged bytes (issue 26 point 5), from a snapshot of what
// every principal near a bound holds open (store.OpenUsages) read at most
// once per period, plus what this process admitted since. Counting in
// Postgres per upload would walk a pending index's dead entries on every
// session's insert (store/plans_test.go); the snapshot is one aggregate a
// period. Concurrent processes can each admit up to a bound within one
// period: a principal holds at most its bound plus (processes × what one
// period admits) for a moment, never without bound.
type bounds struct {
	usages             func(ctx context.Context, minSessions, minStaged int64) (map[string]OpenUsage, error)
	maxOpen, maxStaged int64 // < 0: no bound
	period             time.Duration

	mu         sync.Mutex
	snap       map[string]OpenUsage // nil until first read
	local      map[string]OpenUsage // admitted by this process since the snapshot's read began
	readAt     time.Time            // monotonic
	refreshing bool
}

// usage is what p holds open, as far as this process knows.
func (b *bounds) usage(ctx context.Context, p string) (OpenUsage, error) {
	b.mu.Lock()
	if (b.snap == nil || time.Since(b.readAt) >= b.period) && !b.refreshing {
		b.refreshing = true
		since := b.local
		b.local = map[string]OpenUsage{}
		b.mu.Unlock()
		snap, err := b.usages(ctx, max(b.maxOpen/2, 1), max(b.maxStaged/2, 1))
		b.mu.Lock()
		b.refreshing = false
		if err != nil {
			for q, u := range since { // what the failed read would have covered
				l := b.local[q]
				b.local[q] = OpenUsage{Sessions: l.Sessions + u.Sessions, StagedBytes: l.StagedBytes + u.StagedBytes}
			}
			if b.snap == nil {
				b.mu.Unlock()
				return OpenUsage{}, err
			}
		} else {
			b.snap, b.readAt = snap, time.Now()
		}
	}
	defer b.mu.Unlock()
	s, l := b.snap[p], b.local[p]
	return OpenUsage{Sessions: s.Sessions + l.Sessions, StagedBytes: s.StagedBytes + l.StagedBytes}, nil
}

// admitSession admits one more open session of p, or refuses it
// (too_many_requests) at p's bound.
func (b *bounds) admitSession(ctx context.Context, p string) error {
	if b.maxOpen < 0 {
		return nil
	}
	u, err := b.usage(ctx, p)
	if err != nil {
		return err
	}
	if u.Sessions >= b.maxOpen {
		return &blobplane.Error{Code: blobplane.CodeTooManyRequests, Retryable: true, Message: fmt.Sprintf(
			"principal %s holds %d open upload sessions, its limit; finish or cancel some first", p, b.maxOpen)}
	}
	b.add(p, OpenUsage{Sessions: 1})
	return nil
}

// release gives back a session admitSession admitted that closed within
// its request (a single-request upload), so a busy principal's uploads
// count while they run, not until the next snapshot.
func (b *bounds) release(p string) {
	if b.maxOpen >= 0 {
		b.add(p, OpenUsage{Sessions: -1})
	}
}

// stagingAllowance is how many more bytes p's chunked sessions may stage,
// or -1 without a bound.
func (b *bounds) stagingAllowance(ctx context.Context, p string) (int64, error) {
	if b.maxStaged < 0 {
		return -1, nil
	}
	u, err := b.usage(ctx, p)
	if err != nil {
		return 0, err
	}
	return max(b.maxStaged-u.StagedBytes, 0), nil
}

// staged records n bytes p staged.
func (b *bounds) staged(p string, n int64) {
	if n > 0 {
		b.add(p, OpenUsage{StagedBytes: n})
	}
}

func (b *bounds) add(p string, u OpenUsage) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.local == nil {
		b.local = map[string]OpenUsage{}
	}
	l := b.local[p]
	b.local[p] = OpenUsage{Sessions: l.Sessions + u.Sessions, StagedBytes: l.StagedBytes + u.StagedBytes}
}

func stagingFull(principal string, bound int64) error {
	return &blobplane.Error{Code: blobplane.CodeTooManyRequests, Retryable: true, Message: fmt.Sprintf(
		"principal %s holds %d bytes in open chunked uploads, its limit; finish or cancel some first", principal, bound)}
}
