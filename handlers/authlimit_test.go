package handlers

import (
	"fmt"
	"testing"
	"time"
)

// Issue 26 point 6: the limiter's memory is bounded whatever the number of
// addresses or token ids that fail: a key is forgotten once its bucket is
// full again, and past the cap the least recently failed goes first.
func TestAttackFailureLimiterMemory(t *testing.T) {
	t.Parallel()
	limit := FailureLimit{Burst: 2, Per: time.Minute}
	f := newFailureLog(limit, 100)
	now := time.Now()
	for i := range 1000 {
		f.fail(fmt.Sprintf("10.0.%d.%d", i/256, i%256), now)
	}
	if f.len() != 100 {
		t.Fatalf("%d keys held after 1000 distinct failures, cap 100", f.len())
	}
	// The most recent keys are the ones kept.
	if !f.recent("10.0.3.231", now) || f.recent("10.0.0.0", now) {
		t.Fatal("the cap forgot the wrong keys")
	}
	// Once a minute passed, every bucket is full again: the next failure
	// forgets them all.
	f.fail("10.9.9.9", now.Add(time.Minute))
	if f.len() != 1 {
		t.Fatalf("%d keys held a minute later, want 1", f.len())
	}

	// Two failures drain a key; it waits Per/Burst for the next.
	f.fail("k", now)
	f.fail("k", now)
	if w := f.wait("k", now); w != 30*time.Second {
		t.Fatalf("wait after the burst: %s, want 30s", w)
	}
	if w := f.wait("k", now.Add(30*time.Second)); w != 0 {
		t.Fatalf("wait after refill: %s", w)
	}
}

func TestClientKey(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"192.0.2.7:4242":                 "192.0.2.7",
		"[::ffff:192.0.2.7]:1":           "192.0.2.7",
		"[2001:db8:1:2:3:4:5:6]:443":     "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1%eth0]:80": "2001:db8:1:2::/64",
		"@":                              "unknown",
	} {
		if got := clientKey(in); got != want {
			t.Errorf("clientKey(%q) = %q, want %q", in, got, want)
		}
	}
}
