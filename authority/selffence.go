package authority

import (
	"fmt"
	"sync"
	"time"

	"github.com/blobplane/blobplane"
)

// Mono is a reading of a monotonic clock: a duration since an arbitrary
// origin fixed for the life of the process. It is meaningful only compared
// with another reading of the same clock in the same process — never with
// a wall time, and never across processes (R17). A distinct type keeps a
// stored expires_at from being compared to it by accident.
type Mono time.Duration

// Add returns m + d.
func (m Mono) Add(d time.Duration) Mono { return m + Mono(d) }

// Sub returns m − o.
func (m Mono) Sub(o Mono) time.Duration { return time.Duration(m - o) }

// MonoClock reads a monotonic clock. Inject it: the system clock in
// production, a ManualClock in tests (a paused process is a clock that
// jumps).
type MonoClock interface {
	Now() Mono
}

type systemClock struct{ origin time.Time }

// Now reads Go's monotonic clock (time.Since uses the monotonic reading).
func (c systemClock) Now() Mono { return Mono(time.Since(c.origin)) }

// SystemClock returns the process's monotonic clock.
func SystemClock() MonoClock { return systemClock{origin: time.Now()} }

// ManualClock is a MonoClock that moves only when told: for tests of the
// lease keeper and of pauses. Safe for concurrent use.
type ManualClock struct {
	mu  sync.Mutex
	now Mono
}

// Now returns the current reading.
func (c *ManualClock) Now() Mono {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (d < 0 is ignored: monotonic).
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > 0 {
		c.now += Mono(d)
	}
}

// LeaseTiming is a class's lease configuration with the bounds the
// self-fence margin is derived from (R14, R18).
type LeaseTiming struct {
	TTL           time.Duration // lease_ttl_ms
	RenewInterval time.Duration // renew_interval_ms
	MaxRenewRTT   time.Duration // the worst renewal round-trip tolerated
	MaxClockError time.Duration // the worst clock-rate error tolerated over a TTL
}

// Margin is how long before the store's expiry a node stops admitting work:
// the maximum renewal round-trip plus the maximum tolerated clock error
// (R18).
func (t LeaseTiming) Margin() time.Duration { return t.MaxRenewRTT + t.MaxClockError }

// Validate checks the timing can work: positive values, a margin shorter
// than the TTL, and room for a renewal to be sent and acknowledged before
// the self-fence deadline (else a healthy node flaps).
func (t LeaseTiming) Validate() error {
	const op = "authority.LeaseTiming"
	switch {
	case t.TTL <= 0 || t.RenewInterval <= 0 || t.MaxRenewRTT <= 0 || t.MaxClockError < 0:
		return invalidf(op, ErrLeaseTiming, "all durations must be positive: %+v", t)
	case t.RenewInterval+t.MaxRenewRTT >= t.TTL-t.Margin():
		return invalidf(op, ErrLeaseTiming, "renew interval %v + rtt %v must be below ttl %v − margin %v", t.RenewInterval, t.MaxRenewRTT, t.TTL, t.Margin())
	}
	return nil
}

// FenceDeadline is the instant a node stops admitting work for a lease
// whose renewal was acknowledged at ackAt: ackAt + ttl − margin (R17, R18,
// A.7 step 1).
func FenceDeadline(ackAt Mono, ttl, margin time.Duration) Mono {
	return ackAt.Add(ttl - margin)
}

// SelfFence tracks one lease's local deadline on the monotonic clock. It
// needs no network and no wall clock, which is why it still decides
// correctly after a long pause (R17, R18, A.7). The lease keeper owns one
// per held partition and publishes its verdict as a LeaseState; it is not
// safe for concurrent use.
type SelfFence struct {
	timing   LeaseTiming
	held     bool
	epoch    uint64
	deadline Mono
}

// NewSelfFence returns a fence for a lease with timing t; it holds nothing
// until the first acknowledged ACQUIRE or RENEW.
func NewSelfFence(t LeaseTiming) (*SelfFence, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &SelfFence{timing: t}, nil
}

// Acknowledged records an ACQUIRE or RENEW at epoch that was sent at sentAt
// and acknowledged by the store at ackAt (both monotonic readings): the new
// deadline is ackAt + ttl − margin (R17). A round-trip longer than
// MaxRenewRTT breaks the margin's assumption, so it extends nothing and
// returns ErrLeaseTiming; the old deadline stands and the keeper retries.
func (f *SelfFence) Acknowledged(epoch uint64, sentAt, ackAt Mono) error {
	if rtt := ackAt.Sub(sentAt); rtt < 0 || rtt > f.timing.MaxRenewRTT {
		return coded(blobplane.CodeUnavailable, "authority.SelfFence", fmt.Errorf("renewal round-trip %v exceeds %v: %w", rtt, f.timing.MaxRenewRTT, ErrLeaseTiming))
	}
	if f.held && epoch != f.epoch {
		f.deadline = 0 // a different epoch is a different lease: start over
	}
	f.held, f.epoch = true, epoch
	f.deadline = max(f.deadline, FenceDeadline(ackAt, f.timing.TTL, f.timing.Margin()))
	return nil
}

// Lost records that a RENEW or FENCE was rejected (A.7 LEASE_LOST): the
// node stops admitting at once and discards state without flushing (R24).
func (f *SelfFence) Lost() { f.held, f.deadline = false, 0 }

// Check reports whether work may be admitted at now (A.7 step 3): nil while
// held and now < deadline; otherwise a retryable CodeUnavailable error
// chaining to ErrLeaseExpired (LEASE_EXPIRED).
func (f *SelfFence) Check(now Mono) error {
	if f.held && now < f.deadline {
		return nil
	}
	return coded(blobplane.CodeUnavailable, "authority.SelfFence", fmt.Errorf("epoch %d deadline %v passed at %v: %w", f.epoch, time.Duration(f.deadline), time.Duration(now), ErrLeaseExpired))
}

// Deadline returns the current self-fence deadline and epoch, and whether a
// lease is held at all.
func (f *SelfFence) Deadline() (deadline Mono, epoch uint64, held bool) {
	return f.deadline, f.epoch, f.held
}

// State is the LeaseState the routing decision reads (A.2 step 2): held
// only while Check passes at now; serving as the lease record says (R23).
func (f *SelfFence) State(now Mono, serving bool) LeaseState {
	if f.Check(now) != nil {
		return LeaseState{Epoch: f.epoch}
	}
	return LeaseState{Held: true, Epoch: f.epoch, Serving: serving}
}
