package notifycache

import (
	"testing"
	"time"
)

// The delay doubles from minBackoff up to maxBackoff, and is jittered
// within its upper half.
func TestBackoff(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		failures int
		max      time.Duration
	}{{1, minBackoff}, {2, 2 * minBackoff}, {3, 4 * minBackoff}, {8, maxBackoff}, {19, maxBackoff}, {1000, maxBackoff}} {
		for range 100 {
			if d := backoff(c.failures); d < c.max/2 || d > c.max {
				t.Fatalf("backoff(%d) = %v, want within [%v, %v]", c.failures, d, c.max/2, c.max)
			}
		}
	}
}

// countingTarget counts invalidations.
type countingTarget struct{ n int }

func (c *countingTarget) Invalidate()       { c.n++ }
func (c *countingTarget) SetListening(bool) {}

// A notification on a channel nobody registered empties every target: a
// spurious clear is cheap, a missed one is not.
func TestDispatchUnknownChannel(t *testing.T) {
	t.Parallel()
	l := NewListener(Config{})
	var a, b countingTarget
	l.Register("chan_a", "a", &a)
	l.Register("chan_b", "b", &b)
	l.dispatch("chan_a")
	if a.n != 1 || b.n != 0 {
		t.Fatalf("chan_a: a %d, b %d; want 1, 0", a.n, b.n)
	}
	l.dispatch("chan_other")
	if a.n != 2 || b.n != 1 {
		t.Fatalf("an unknown channel: a %d, b %d; want 2, 1", a.n, b.n)
	}
}
