package upload

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
)

// The per-principal bounds between two snapshots: what this process
// admits counts at once, single-request sessions stop counting when they
// end, a failed read keeps the last snapshot and what was admitted, and
// a read sees only what it returns (issue 26 point 5).
func TestPrincipalBoundsBetweenSnapshots(t *testing.T) {
	ctx := context.Background()
	var reads int
	var fail error
	held := map[string]OpenUsage{"mallory": {Sessions: 2, StagedBytes: 900}}
	b := &bounds{maxOpen: 3, maxStaged: 1000, period: time.Hour,
		usages: func(_ context.Context, minSessions, minStaged int64) (map[string]OpenUsage, error) {
			reads++
			if minSessions != 1 || minStaged != 500 {
				t.Errorf("read for principals past %d sessions or %d bytes; want half the bounds", minSessions, minStaged)
			}
			return held, fail
		}}
	tooMany := func(err error) bool { return blobplane.ErrorCode(err) == blobplane.CodeTooManyRequests }
	if err := b.admitSession(ctx, "mallory"); err != nil {
		t.Fatalf("third session: %v", err)
	}
	if err := b.admitSession(ctx, "mallory"); !tooMany(err) {
		t.Fatalf("fourth session: %v; want too_many_requests", err)
	}
	if err := b.admitSession(ctx, "alice"); err != nil {
		t.Fatalf("another principal: %v", err)
	}
	b.release("mallory") // the third was a single-request upload that ended
	if err := b.admitSession(ctx, "mallory"); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if n, err := b.stagingAllowance(ctx, "mallory"); err != nil || n != 100 {
		t.Fatalf("allowance: %d, %v; want 100", n, err)
	}
	b.staged("mallory", 100)
	if n, _ := b.stagingAllowance(ctx, "mallory"); n != 0 {
		t.Fatalf("allowance after staging it: %d", n)
	}
	if reads != 1 {
		t.Fatalf("%d reads within one period; want 1", reads)
	}
	// A new read: what it returns, nothing admitted before it began.
	b.period = 0
	held, fail = map[string]OpenUsage{}, nil
	if n, _ := b.stagingAllowance(ctx, "mallory"); n != 1000 {
		t.Fatalf("allowance after a read of nothing: %d", n)
	}
	// A failed read keeps the last snapshot and what was admitted since.
	b.staged("mallory", 700)
	fail = errors.New("database down")
	if n, err := b.stagingAllowance(ctx, "mallory"); err != nil || n != 300 {
		t.Fatalf("allowance after a failed read: %d, %v; want 300", n, err)
	}
	// No snapshot at all: the error.
	fresh := &bounds{maxOpen: 3, maxStaged: 1000, period: time.Hour, usages: b.usages}
	if err := fresh.admitSession(ctx, "alice"); err == nil {
		t.Fatal("admitted without ever reading what principals hold")
	}
	// No bound: nothing read.
	free := &bounds{maxOpen: -1, maxStaged: -1, usages: b.usages}
	r := reads
	if err := free.admitSession(ctx, "x"); err != nil || reads != r {
		t.Fatalf("unbounded: %v, %d reads", err, reads-r)
	}
}
